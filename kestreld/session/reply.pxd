# Cython declarations for reply.py (compiled when a compiler is present; see kestreld/compiled.py).
# The ticket is typed as the journal's Batch (its done/error are C fields); front ends
# still only call the verbs.

cimport cython

from kestreld.journal.batch cimport Batch


cdef class PendingReply:
    cdef public Batch ticket
    cdef public int kind
    cdef public list parts
    cdef public object reader
    cdef public list reopen
    cdef public object give_back
    cdef public object taken
    cdef public bint rendered
    cdef public bint failed

    cpdef undo_reopens(self, object read)
    cpdef undo_gives_back(self, object read)
    cpdef undo_returns(self, object item)
    @cython.locals(ticket=Batch)
    cpdef bint done(self) except -1
    cpdef object settle(self)
    cpdef double started(self) except? -1
    @cython.locals(parts=list)
    cpdef Py_ssize_t size(self) except -1


@cython.locals(reply=PendingReply)
cpdef PendingReply pending_put(Batch ticket)
@cython.locals(reply=PendingReply)
cpdef PendingReply pending_confirm(Batch ticket, object reader)
