# Cython declarations for blocking.py (compiled when a compiler is present; see kestreld/compiled.py).

cimport cython


cdef class BlockingQueue:
    cdef public object items
    cdef object _push
    cdef object _pop
    cdef public object waiters
    cdef object _wait_push
    cdef object _wait_pop
    cdef public long long dead
    cdef public object deadlines
    cdef object _deadline_push
    cdef object _deadline_pop
    cdef public object timer
    cdef public double timer_at
    cdef public object loop
    cdef object _create_future
    cdef object _time

    cpdef bint hand_off(self, object item) except -1
    cpdef put(self, object item)
    cpdef put_first(self, object item)
    cpdef poll(self)
    cpdef peek(self)
    @cython.locals(deadline=double)
    cpdef wait(self, object loop, object timeout)
    cpdef _arm(self, double deadline)
    cpdef _note_dead(self)
