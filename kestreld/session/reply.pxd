# Cython declarations for reply.py (compiled when a compiler is present; see kestreld/compiled.py).

cdef class PendingReply:
    cdef public object ticket
    cdef public int kind
    cdef public list parts
    cdef public object reader
    cdef public list reopen
    cdef public object give_back
    cdef public object taken
    cdef public bint rendered
    cdef public bint failed

    cpdef bint done(self) except -1
    cpdef object settle(self)
    cpdef double started(self) except? -1
    cpdef Py_ssize_t size(self) except -1
