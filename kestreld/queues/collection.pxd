# Cython declarations for collection.py (compiled when a compiler is present; see
# kestreld/compiled.py).  Every set and get finds its queue and reader here.

cimport cython

from kestreld.journal.clock cimport monotonic, now_ms
from kestreld.journal.tick cimport Tick
from kestreld.queues.journaled_queue cimport JournaledQueue
from kestreld.queues.reader cimport Reader


cdef class QueueCollection:
    cdef public object config
    cdef public object executor
    cdef public dict queues
    cdef public dict aliases
    cdef public long long queue_creates
    cdef public long long queue_deletes
    cdef public long long queue_expires
    cdef public bint _checkpointing
    cdef public object _compacting
    cdef public Tick tick
    cdef public object handles
    cdef public set _sweeping
    cdef public set _unsettled
    cdef public object owns
    cdef public object elsewhere
    cdef public object box_queues

    @cython.locals(queue=JournaledQueue)
    cpdef JournaledQueue queue(self, object name, bint create)

    @cython.locals(queue=JournaledQueue, reader=Reader)
    cpdef Reader reader(self, object full_name, bint create)

    @cython.locals(queue=JournaledQueue)
    cpdef put(self, object name, object data, object expire_time, object now,
              object error_count=*)
