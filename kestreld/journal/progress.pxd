# Cython declarations for progress.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every confirm (a /close, a plain get) is recorded here: the pending ids and the ticket
# are C fields.

cimport cython

from kestreld.journal cimport codec
from kestreld.journal.batch cimport Batch
from kestreld.journal.fileio cimport write_all


cdef class ProgressLog:
    cdef public object path
    cdef public int fd
    cdef public long long size
    cdef public long long acked_size
    cdef public object _state
    cdef public object _on_acked
    cdef public list _pending
    cdef public Batch _batch
    cdef public dict _inflight
    cdef object _resolved_bound
    cdef public object _jump
    cdef public bint compacting
    cdef public bint created

    @cython.locals(batch=Batch)
    cpdef Batch record(self, long long id_)

    @cython.locals(ids=list, batch=Batch)
    cpdef Batch write(self)
    @cython.locals(end=cython.longlong)
    cpdef _resolved(self, Batch batch)
    cpdef bint take_created(self)

