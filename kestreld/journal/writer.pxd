# Cython declarations for writer.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every put appends to the writer: its counters and the segment's are C fields.
# Paths and folders stay objects (a config may give a pathlib.Path), and so does every number
# that a damaged file or a config can push past 64 bits (ids, stamps, counts): Python ints,
# as in the pure-Python build, never an OverflowError at start-up.

cimport cython

from kestreld.journal.clock cimport monotonic
from kestreld.journal cimport codec
from kestreld.journal.batch cimport Batch
from kestreld.journal.fileio cimport write_chunks
from kestreld.journal.periodic_sync cimport PeriodicSync
from kestreld.journal.progress cimport ProgressLog
from kestreld.journal.segment cimport Segment
from kestreld.journal.tick cimport Flushing, Tick

cdef Py_ssize_t LARGE_WRITE_BYTES
cdef Py_ssize_t OVERTAKE_BYTES


cdef class WriterJournal(Flushing):
    cdef public object folder
    cdef public object queue
    cdef public long long max_journal_size
    cdef public object archive_path
    cdef public object executor
    cdef public list segments
    cdef public object next_id
    cdef public long long rotations
    cdef public bint closed
    cdef public int _fd
    cdef public list _buf
    cdef public Py_ssize_t _buf_size
    cdef public Batch _batch
    cdef public bint _flush_scheduled
    cdef public object _loop
    cdef public object _call_soon
    cdef public object _flush_bound
    cdef public object reader
    cdef public list _progress
    cdef public PeriodicSync sync
    cdef public Tick tick
    cdef public object put_id
    cdef public Segment put_segment
    cdef public long long put_offset
    cdef public bint _fresh_segment
    cdef public object large
    cdef public Segment _overtaking
    cdef public list _early
    cdef public object spare
    cdef public object handles
    cdef public bint cached
    cdef public bint used
    cdef public list logs
    cdef public bint changed

    cpdef bint available(self) except -1

    @cython.locals(size=Py_ssize_t, length=Py_ssize_t, offset=cython.longlong,
                   header=bytes, segments=list, seg=Segment, batch=Batch, buf=list)
    cpdef Batch put(self, object add_time, object data, object expire_time=*, object error_count=*)

    cpdef join(self, ProgressLog progress)
    @cython.locals(tick=Tick)
    cpdef _schedule_flush(self)
    @cython.locals(written=list, batch=Batch)
    cpdef flush(self)
    @cython.locals(written=list, batch=Batch, progress=list, log_=ProgressLog, done=Batch)
    cpdef list _write_tick(self)
    @cython.locals(seg=Segment)
    cpdef write_buffer(self)

    @cython.locals(end=object, seg=Segment, ahead=Batch, skip=object)
    cpdef _acknowledge(self, Batch batch)
