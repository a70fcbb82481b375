# Cython declarations for tick.py (compiled when a compiler is present; see kestreld/compiled.py).

cimport cython


cdef class Flushing:
    cpdef flush(self)


cdef class Tick:
    cdef public list writers
    cdef public list _spare
    cdef public list after
    cdef public bint scheduled
    cdef public int held
    cdef public Py_ssize_t waiting
    cdef public object _call_soon
    cdef public object _turn_bound
    cdef public list changed

    cpdef bint add(self, Flushing writer) except -1
    cpdef soon(self, object fn)
    cpdef wait_began(self)
    cpdef wait_ended(self)
    cpdef hold(self)
    @cython.locals(writers=list, writer=Flushing, done=Py_ssize_t)
    cpdef release(self, bint now)
    @cython.locals(after=list, done=Py_ssize_t)
    cpdef _run_after(self)
    cpdef bint _schedule(self) except -1
    cpdef _turn(self)
