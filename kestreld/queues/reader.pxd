# Cython declarations for reader.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every put is offered to the readers and every get takes from one: counters are C fields,
# the memory queue, the journal and the items are typed, the hot methods are cpdef.
# A reader knows its queue's name, folder and journal, not the queue.  items and bytes are
# C fields too (what damaged files claim is capped at COUNT_CAP); age stays a Python int.
# Its journal side (head, done set, read-behind, progress file) is a typed JournalReader.

cimport cython

from kestreld.journal.clock cimport monotonic, now_ms
from kestreld.journal.batch cimport Batch
from kestreld.journal.journal_reader cimport JournalReader
from kestreld.journal.segment cimport Segment
from kestreld.journal.writer cimport WriterJournal
from kestreld.queues.blocking cimport BlockingQueue, Waiter
from kestreld.queues.item cimport QueueItem


cdef long long RELEASE_AFTER
cdef long long ITEM_OVERHEAD


cdef class OpenRead:
    cdef public QueueItem item
    cdef public object reader
    cdef public double opened_at
    cdef public bint finished
    cdef public object owner


cdef class Reader:
    cdef public object queue_name
    cdef public object name
    cdef public object full_name
    cdef public object _config
    cdef public object cfg_max_age
    cdef public long long cfg_max_memory
    cdef public object cfg_max_items
    cdef public object cfg_max_size
    cdef public bint cfg_discard_old
    cdef public BlockingQueue memory
    cdef public long long mem_bytes
    cdef public long long mem_peak
    cdef public long long items
    cdef public long long bytes
    cdef public dict open_reads
    cdef public long long skipped_items
    cdef public long long skipped_bytes
    cdef public bint deleted
    cdef public JournalReader journal_reader
    cdef public object on_expired
    cdef public object on_aborted
    cdef public long long total_items
    cdef public long long expired_items
    cdef public long long discarded
    cdef public long long transactions
    cdef public long long canceled_transactions
    cdef public long long total_flushes
    cdef public object age
    cdef public long long punted_items

    cpdef _configure(self, object config)

    @cython.locals(size=Py_ssize_t, memory=BlockingQueue, id_=cython.longlong, jr=JournalReader,
                   mem_bytes=cython.longlong)
    cpdef offer(self, QueueItem item, Segment seg, long long offset, object now)
    cpdef skip(self, long long size)
    cpdef journal_drop(self, long long id_)
    @cython.locals(jr=JournalReader, ours=bint)
    cpdef drop(self, long long id_, long long size=*)
    cpdef unskip(self, long long size)
    cpdef commit(self, long long id_)
    @cython.locals(max_items=object, max_size=object)
    cpdef bint is_full(self, long long pending_items=*, long long pending_bytes=*) except -1
    @cython.locals(item=QueueItem)
    cpdef make_room(self, object now, long long pending_items=*, long long pending_bytes=*)

    @cython.locals(memory=BlockingQueue, item=QueueItem, size=Py_ssize_t)
    cpdef _pop(self, long long now)
    @cython.locals(item=QueueItem)
    cpdef take(self, long long now)
    @cython.locals(item=QueueItem)
    cpdef peek(self, long long now)
    cpdef wait(self, object loop, object timeout)
    cpdef enter(self, Waiter waiter, object timeout)
    cpdef _removed(self, QueueItem item, object now)
    @cython.locals(age=cython.longlong)
    cpdef _delivered(self, QueueItem item, long long now)
    @cython.locals(size=Py_ssize_t)
    cpdef _put_back(self, QueueItem item)

    @cython.locals(read=OpenRead)
    cpdef OpenRead open(self, QueueItem item, object owner=*)
    cpdef confirm(self, OpenRead read)
    cpdef consume(self, QueueItem item)

    cpdef _drained(self)
    cpdef _expired(self, QueueItem item)
    cpdef _forward_expired(self, QueueItem item)
    @cython.locals(memory=BlockingQueue, journal=WriterJournal, segment=Segment,
                   logsize=cython.longlong, rotations=cython.longlong)
    cpdef tuple stat_figures(self)
