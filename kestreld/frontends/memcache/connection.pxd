# Cython declarations for connection.py (compiled when a compiler is present; see kestreld/compiled.py).
# Connection is a cdef class: its state is C fields and the framing calls it through a C
# vtable; MemcacheConnection (plain Python, in the same file) mixes in asyncio.Protocol.

cimport cython

from kestreld.journal.clock cimport monotonic
from kestreld.loop.busy_poll cimport BusyPoll
from kestreld.frontends.memcache.framing cimport Command, Framing, Sink
from kestreld.queues.item cimport QueueItem
from kestreld.session.fetch cimport Fetch
from kestreld.session.reply cimport PendingReply
from kestreld.journal.tick cimport Tick
from kestreld.session.session cimport Session
from kestreld.session.traffic cimport Traffic

# The output limits and the verdicts, outcomes and reply kind it imports are C globals,
# compared with C ints on every request (no Python module imports them from here;
# INPUT_PAUSE_LIMIT, checked only while blocked, stays a Python name for the tests).
cdef Py_ssize_t OUTPUT_FLUSH_SIZE
cdef Py_ssize_t OUTPUT_HOLD_LIMIT
cdef Py_ssize_t PACED_BLOCK_BYTES
cdef Py_ssize_t SLICE_BYTES
cdef int GO, KEEP, LATER, SKIP, STOP
cdef int BUSY, ITEM, LIMITED, MISS, REFUSED
cdef int PUT
cdef bint COMPILED


cdef class Connection(Sink):
    cdef public object server
    cdef public object stats
    cdef public Traffic traffic
    cdef public Session session
    cdef public object transport
    cdef public object peer
    cdef public Framing framing
    cdef public list out
    cdef public Py_ssize_t out_size
    cdef public Py_ssize_t pending
    cdef public bint held
    cdef public bint closing
    cdef public bint closed
    cdef public bint eof
    cdef public bint write_paused
    cdef public bint read_paused
    cdef public bint sliced
    cdef public Py_ssize_t unsliced
    cdef public double last_active
    cdef public str put_name
    cdef public object put_expire
    cdef public bint put_noreply
    cdef public bytes value_key
    cdef public Py_ssize_t value_size
    cdef public bytes value_header
    cdef public set peers
    cdef public object write_out
    cdef public int fd
    cdef public bint spilled
    cdef public object transport_closing
    cdef public BusyPoll poll
    cdef public object held_put

    cpdef int request(self, Command command, list args, bint quiet) except? -1
    cpdef int block_header(self, Command command, list args, Py_ssize_t size, bint quiet) except? -1
    cpdef int block(self, Command command, list args, bytes data, bint quiet) except? -1
    cpdef int _run_block(self, Command command, list args, bytes data, bint quiet) except? -1
    cpdef bad_block(self, bint quiet)
    cpdef fatal(self, bytes reply)

    @cython.locals(framing=Framing, ready=bytes, tick=Tick, poll=BusyPoll, now=double, lone=bint)
    cpdef data_received(self, bytes data)
    cpdef bint blocked(self) except -1
    cpdef process(self, bytes data)
    cpdef resume(self)
    cpdef _continue(self)

    cpdef expect_put(self, str name, object expire, bint noreply)
    cpdef str take_put(self)
    cpdef hold(self, PendingReply reply)
    @cython.locals(reply=PendingReply, behind=PendingReply, parts=list, outcome=int, data=bytes, size=Py_ssize_t, header=bytes, item=QueueItem)
    cpdef answer_fetch(self, Fetch f, bint single)
    cpdef replies_ready(self, object ticket=*)

    @cython.locals(out=list, ready=list, i=Py_ssize_t, data=bytes, part=object, first=object, reply=PendingReply)
    cpdef flush_out(self)
    @cython.locals(total=Py_ssize_t, n=Py_ssize_t, data=bytes)
    cpdef send_parts(self, list parts)
    cpdef bint sends_directly(self) except -1
    cdef Py_ssize_t _spill(self, Py_ssize_t sent) except -1
    cpdef close(self)
    cpdef _drain(self)
