# Cython declarations for traffic.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every request adds to these: C fields.

cdef class Traffic:
    cdef public long long cmd_get
    cdef public long long cmd_set
    cdef public long long cmd_peek
    cdef public long long get_hits
    cdef public long long get_misses
    cdef public long long bytes_read
    cdef public long long bytes_written
