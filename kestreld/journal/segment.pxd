# Cython declarations for segment.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every put updates its segment and every read-behind refill reads one: C fields.
# Paths and stamps stay objects (see writer.pxd).  items and data_bytes count the records
# of one file (or the ids between two 64-bit first ids): C fields, like the offsets.

cdef class Segment:
    cdef public object stamp
    cdef public object path
    cdef public long long first_id
    cdef public long long last_id
    cdef public long long size
    cdef public long long written
    cdef public long long visible
    cdef public long long items
    cdef public long long data_bytes

    cpdef appended(self, long long id_, long long length, long long size)
    cpdef wrote(self)
    cpdef unbuffered(self)
    cpdef cut_to(self, long long end)
    cpdef acknowledged(self, long long end)
    cpdef opened(self, long long size)
    cpdef starts_at(self, long long first_id)
    cpdef holds(self, long long first_id, long long last_id, long long items, long long data_bytes)
    cpdef restarted(self)
