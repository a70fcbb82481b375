# Cython declarations for session.py (compiled when a compiler is present; see kestreld/compiled.py).
# The front ends call the hot verbs (put, fetch, puts_pending, reply_failed) through a C vtable.

cimport cython

from kestreld.journal.clock cimport monotonic, now_ms
from kestreld.journal.batch cimport Batch
from kestreld.journal.tick cimport Tick
from kestreld.queues.blocking cimport Waiter
from kestreld.queues.collection cimport QueueCollection
from kestreld.queues.item cimport QueueItem
from kestreld.queues.journaled_queue cimport JournaledQueue
from kestreld.queues.reader cimport OpenRead, Reader
from kestreld.session.fetch cimport Fetch
from kestreld.session.gate cimport Gate
from kestreld.session.reply cimport PendingReply, pending_confirm, pending_put
from kestreld.session.traffic cimport Traffic

# The fetch outcomes it imports: C globals, set and compared as C ints on every fetch.
cdef int BUSY, GONE, ITEM, LIMITED, MISS, REFUSED, WAIT


cdef class Session:
    cdef public object server
    cdef public QueueCollection queues
    cdef public Tick tick
    cdef public Gate gate
    cdef public object stats
    cdef public Traffic traffic
    cdef public object listener
    cdef public object ready
    cdef public dict open_reads
    cdef public list spare_reads
    cdef object _wait_done_bound
    cdef public object waiting
    cdef public object wait_fetch
    cdef public list unacked
    cdef public object confirm_ticket
    cdef public bint no_wait
    cdef public bint closed
    cdef public object principal
    cdef public bint authenticating
    cdef public object trace

    @cython.locals(queue=JournaledQueue)
    cpdef admit_put(self, str name, Py_ssize_t size)
    @cython.locals(unacked=list, batch=Batch, oldest=Batch)
    cpdef object put(self, str name, bytes data, object expire, bint want_reply)
    @cython.locals(unacked=list)
    cpdef bint puts_pending(self) except -1

    @cython.locals(fetch=bint, refused=bint, reader=Reader, item=QueueItem, gate=Gate,
                   traffic=Traffic, waiter=Waiter, reads=list, read=OpenRead,
                   now=cython.longlong)
    cpdef int fetch(self, Fetch f, bint single) except -1
    cpdef _forget_empty(self, Reader reader, list reads)
    @cython.locals(ticket=Batch, reply=PendingReply, behind=PendingReply, reads=list)
    cpdef _hand_out(self, Reader reader, Fetch f, QueueItem item)
    @cython.locals(f=Fetch, behind=PendingReply)
    cpdef _wait_done(self, Waiter waiter)
    @cython.locals(ticket=Batch, reply=PendingReply)
    cpdef object _confirm_one(self, Reader reader, OpenRead read)
    @cython.locals(ticket=Batch, reply=PendingReply)
    cpdef object _confirm(self, Reader reader, list reads)
    @cython.locals(reply=PendingReply)
    cpdef PendingReply _hold(self, Batch ticket, object reader)
    cpdef reply_failed(self, PendingReply reply)
