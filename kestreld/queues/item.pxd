# Cython declarations for item.py (compiled when a compiler is present; see kestreld/compiled.py).
# C-typed fields: reading an item's id or times costs no Python attribute lookup.

cdef class QueueItem:
    cdef public long long id
    cdef public long long add_time
    cdef public long long expire_time
    cdef public long long error_count
    cdef public object data

    cpdef bint expired(self, long long now, object max_age) except -1
    cpdef QueueItem aborted(self)
