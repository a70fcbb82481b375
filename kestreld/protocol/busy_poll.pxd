# Cython declarations for busy_poll.py (compiled when a compiler is present; see kestreld/compiled.py).
# The connection calls arrived and served through the C vtable: a request pays two C calls.

from kestreld.journal.clock cimport monotonic

# MAX_BACK_OFF stays a Python name (the tests read it; only a poll that ran out uses it).


cdef class BusyPoll:
    cdef public double limit
    cdef public double done
    cdef public bint polled
    cdef public bint polling
    cdef public int back_off
    cdef public int skip
    cdef public long long caught
    cdef public long long ran_out
    cdef public object _call_soon
    cdef public object _poll_bound

    cpdef arrived(self, double now)
    cpdef served(self, bint lone)
    cpdef _poll(self)
    cpdef list stats(self)
