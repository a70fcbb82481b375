# Cython declarations for queue_lines.py (compiled when a compiler is present; see
# kestreld/compiled.py).  A stats of 10,000 queues visits every reader: the readers, queues
# and lines are typed, so a reader's figures and counts are C calls and C field reads, and
# a reader's sixteen figures are formatted from C integers.

cimport cython

from kestreld.queues.collection cimport QueueCollection
from kestreld.queues.journaled_queue cimport JournaledQueue
from kestreld.queues.reader cimport Reader


cdef Py_ssize_t MEM_ITEMS

@cython.locals(items=cython.longlong, nbytes=cython.longlong, total_items=cython.longlong,
               logsize=cython.longlong, expired_items=cython.longlong,
               mem_items=cython.longlong, mem_bytes=cython.longlong, age=cython.longlong,
               discarded=cython.longlong, waiters=cython.longlong,
               open_transactions=cython.longlong, transactions=cython.longlong,
               canceled=cython.longlong, flushes=cython.longlong, rotations=cython.longlong,
               punted=cython.longlong, p=str)
cpdef bytes reader_text(str prefix, tuple figures)


cdef class ReaderLines:
    cdef public Reader reader
    cdef public str prefix
    cdef public tuple figures
    cdef public object added
    cdef public bytes text

    @cython.locals(reader=Reader, figures=tuple, added=object)
    cpdef render(self, list out, long long now_ms)


cdef class QueueLines:
    cdef public str name
    cdef public JournaledQueue queue
    cdef public tuple reader_list
    cdef public bint masked
    cdef public ReaderLines default
    cdef public list children
    cdef public bytes line

    cpdef follow_readers(self)
    @cython.locals(default=ReaderLines, child=ReaderLines, queue=JournaledQueue)
    cpdef render(self, list out, long long now_ms)


cdef class StatLinesCache:
    cdef public list entries
    cdef public tuple aliases

    @cython.locals(entry=QueueLines, queue=JournaledQueue, reader=Reader, journaled=bint,
                   items=object, total_items=object, nbytes=object, reserved=object,
                   now_ms=cython.longlong)
    cpdef tuple _render(self, QueueCollection queues, list out)
    @cython.locals(entry=QueueLines, by_name=dict)
    cpdef bint _current(self, QueueCollection queues) except -1
    cpdef _follow(self, QueueCollection queues)
