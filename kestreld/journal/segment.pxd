# Cython declarations for segment.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every put updates its segment and every read-behind refill reads one: C fields.
# Paths and counts a damaged file can push past 64 bits stay objects (see writer.pxd).

cdef class Segment:
    cdef public object stamp
    cdef public object path
    cdef public long long first_id
    cdef public long long last_id
    cdef public long long size
    cdef public long long written
    cdef public long long visible
    cdef public object items
    cdef public object data_bytes
