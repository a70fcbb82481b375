# Cython declarations for periodic_sync.py (compiled when a compiler is present; see
# kestreld/compiled.py).  Every tick's written batches pass through written().

cimport cython

from kestreld.journal.batch cimport Batch


cdef class PeriodicSync:
    cdef public object queue
    cdef public object folder
    cdef public object sync_journal
    cdef public object executor
    cdef public object _acknowledge
    cdef public object _current_fd
    cdef public double failed_until
    cdef public list _unsynced
    cdef public list _retired_fds
    cdef public set _fds
    cdef public bint _dir_dirty
    cdef public bint _syncing
    cdef public object _timer
    cdef public bint _sync_again
    cdef public object _loop
    cdef public object _failed
    cdef public bint _dirty

    @cython.locals(batch=Batch)
    cpdef bint written(self, list batches) except -1
    cpdef wrote_to(self, int fd)
