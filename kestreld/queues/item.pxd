# Cython declarations for item.py (compiled when a compiler is present; see kestreld/compiled.py).
# C-typed fields: reading an item's id or times costs no Python attribute lookup.
# data is bytes (never a buffer that could hold a reference back): an item is not tracked by
# the cycle collector, so a queue of a million items in memory costs a collection nothing.

cimport cython


cdef class QueueItem:
    cdef public long long id
    cdef public long long add_time
    cdef public long long expire_time
    cdef public long long error_count
    cdef public bytes data

    cpdef bint expired(self, long long now, object max_age) except -1
    cpdef QueueItem aborted(self)


@cython.locals(item=QueueItem)
cpdef QueueItem new_item(long long id_, long long add_time, long long expire_time,
                         long long error_count, bytes data)
