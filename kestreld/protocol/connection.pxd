# Cython declarations for connection.py (compiled when a compiler is present; see kestreld/compiled.py).
# Connection is a cdef class: its state is C fields and the framing calls it through a C
# vtable; MemcacheConnection (plain Python, in the same file) mixes in asyncio.Protocol.

cimport cython

from kestreld.protocol.framing cimport Command, Framing, Sink


cdef class Connection(Sink):
    cdef public object server
    cdef public object stats
    cdef public object transport
    cdef public object peer
    cdef public Framing framing
    cdef public list out
    cdef public Py_ssize_t out_size
    cdef public Py_ssize_t pending_batches
    cdef public list unacked
    cdef public bint held
    cdef public object waiting
    cdef public bint closing
    cdef public bint eof
    cdef public bint stopping
    cdef public bint write_paused
    cdef public bint read_paused
    cdef public double last_active
    cdef public dict open_reads
    cdef public object put_target
    cdef public object waiting_reply
    cdef public object confirm_ticket
    cdef public object trace

    cpdef int request(self, Command command, list args, bint quiet) except? -1
    cpdef int block_header(self, Command command, list args, Py_ssize_t size, bint quiet) except? -1
    cpdef int block(self, Command command, list args, bytes data, bint quiet) except? -1
    cpdef bad_block(self, bint quiet)
    cpdef fatal(self, bytes reply)

    @cython.locals(framing=Framing, ready=bytes)
    cpdef data_received(self, bytes data)
    cpdef bint blocked(self)
    cpdef process(self, bytes data)
    cpdef resume(self)

    @cython.locals(out=list, ready=list, i=Py_ssize_t, data=bytes)
    cpdef flush_out(self)
    cpdef watch_batch(self, object batch)
    cpdef close_after_reply(self)
