# Cython declarations for busy_poll.py (compiled when a compiler is present; see kestreld/compiled.py).
# The connection calls arrived and served through the C vtable: a request pays two C calls.

cimport cython

from kestreld.journal.clock cimport monotonic, thread_cpu

# MAX_BACK_OFF and the period's constants stay Python names (the tests read them); the
# request path reads them as module globals only in a measuring window.


cdef class BusyPoll:
    cdef public double limit
    cdef public double done
    cdef public bint polled
    cdef public bint polling
    cdef public int back_off
    cdef public int skip
    cdef public long long caught
    cdef public long long ran_out
    cdef public long long period
    cdef public long long explore
    cdef public long long left
    cdef public long long step
    cdef public bint prefer
    cdef public double edge
    cdef public long long windows
    cdef public long long rest
    cdef public double cpu_at
    cdef public list tried
    cdef public list kept
    cdef public object cpu_clock
    cdef public object _call_soon
    cdef public object _poll_bound

    cpdef arrived(self, double now)
    @cython.locals(left=cython.longlong, step=cython.longlong, poll=cython.bint)
    cpdef served(self, bint lone)
    @cython.locals(now=cython.double, at=cython.double, last=cython.longlong, explore=cython.longlong)
    cpdef _measure(self, long long step)
    @cython.locals(other=cython.double, same=cython.double, edge=cython.double, sleeping=cython.double, rest=cython.longlong)
    cpdef _decide(self)
    cpdef _poll(self)
    cpdef list stats(self)
