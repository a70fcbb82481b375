# Cython declarations for blocking.py (compiled when a compiler is present; see kestreld/compiled.py).

cdef class BlockingQueue:
    cdef public object items
    cdef object _push
    cdef object _pop
    cdef public object waiters
    cdef public long long dead
    cdef public object deadlines
    cdef public object timer
    cdef public double timer_at
    cdef public object loop

    cpdef bint hand_off(self, object item) except -1
    cpdef put(self, object item)
    cpdef put_first(self, object item)
    cpdef poll(self)
    cpdef peek(self)
    cpdef _arm(self, double deadline)
    cpdef _note_dead(self)
