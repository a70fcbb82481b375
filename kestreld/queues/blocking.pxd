# Cython declarations for blocking.py (compiled when a compiler is present; see kestreld/compiled.py).

cimport cython

from kestreld.journal.tick cimport Tick

cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void *op)


cdef int PENDING, SERVED, CANCELLED


cdef class Waiter:
    cdef public object callback
    cdef public object loop
    cdef public Tick tick
    cdef public int state
    cdef public object item

    cpdef bint done(self) except -1
    cpdef bint cancelled(self) except -1
    cpdef serve(self, object item)
    cpdef bint cancel(self) except -1


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
    cdef public list served

    @cython.locals(waiter=Waiter)
    cpdef bint hand_off(self, object item) except -1
    cpdef put(self, object item)
    cpdef put_first(self, object item)
    cpdef poll(self)
    cpdef peek(self)
    cpdef wait(self, object loop, object timeout)
    cpdef enter(self, Waiter waiter, object timeout)
    cpdef _bind(self, object loop)
    @cython.locals(served=list, tick=Tick)
    cpdef _end(self, Waiter waiter, object item)
    cpdef _resolve(self, object fut, object item)
    @cython.locals(served=list, waiter=Waiter)
    cpdef _run_served(self)
    @cython.locals(deadline=double)
    cpdef _line_up(self, object waiter, object timeout)
    cpdef _arm(self, double deadline)
    cpdef _note_dead(self)
