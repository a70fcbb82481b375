# Cython declarations for blocking.py (compiled when a compiler is present; see kestreld/compiled.py).

cdef class BlockingQueue:
    cdef public object items
    cdef public object waiters
    cdef public long long dead

    cpdef bint hand_off(self, object item) except -1
    cpdef put(self, object item)
    cpdef put_first(self, object item)
    cpdef poll(self)
    cpdef peek(self)
