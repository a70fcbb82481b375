# Cython declarations for journaled_queue.py (compiled when a compiler is present; see
# kestreld/compiled.py).  Every put goes through JournaledQueue.put: the journal, the batch
# and the readers are typed, so their hot methods are C calls.

cimport cython

from kestreld.journal.clock cimport monotonic, now_ms
from kestreld.journal.batch cimport Batch
from kestreld.journal.segment cimport Segment
from kestreld.journal.writer cimport WriterJournal
from kestreld.queues.item cimport QueueItem, new_item
from kestreld.queues.reader cimport Reader


cdef class JournaledQueue:
    cdef public object name
    cdef public object server_config
    cdef public object config
    cdef public object folder
    cdef public object executor
    cdef public WriterJournal journal
    cdef public dict readers
    cdef public tuple reader_list
    cdef public Reader default_reader
    cdef public double created_at
    cdef public long long _next_id
    cdef public Batch _pending_batch
    cdef public list _pending
    cdef public list _unacked
    cdef object _acknowledged_bound
    cdef public long long pending_items
    cdef public long long pending_bytes
    cdef public bint deleted
    cdef public long long max_age
    cdef public long long max_item_size
    cdef public bint expiring
    cdef public object sweeps

    @cython.locals(reader=Reader)
    cpdef Reader reader(self, str rname, bint create)

    @cython.locals(readers=tuple, default=Reader, reader=Reader, journal=WriterJournal,
                   batch=Batch, item=QueueItem, pending=list, p_items=cython.longlong,
                   p_bytes=cython.longlong, put=list, size=Py_ssize_t, first=bint)
    cpdef put(self, object data, object expire_time, object now, object error_count=*)

    @cython.locals(nbytes=Py_ssize_t, puts=list, put=list, item=QueueItem, reader=Reader,
                   seg=Segment, readers=tuple)
    cpdef _acknowledged(self, Batch batch)
