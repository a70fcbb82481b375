# Cython declarations for fetch.py (compiled when a compiler is present; see kestreld/compiled.py).

cimport cython


cdef class Fetch:
    cdef public str name
    cdef public object timeout
    cdef public bint open
    cdef public bint close
    cdef public bint abort
    cdef public bint peek
    cdef public bytes key
    cdef public bint with_id
    cdef public int outcome
    cdef public object item
    cdef public object reply
    cdef public object behind
    cdef public object reader
    cdef public double started

    cpdef bint fetches(self) except -1
    @cython.locals(f=Fetch)
    cpdef Fetch again(self)
