# Cython declarations for framing.py (compiled when a compiler is present; see kestreld/compiled.py).
# The framing state is C fields; the parse loop's positions are C integers.  Bounds and
# wraparound checks stay on: every index here comes from the wire.

cimport cython

cdef bint COMPILED
# Shapes and verdicts (imported from codes.py) and the module's limits: C globals, compared
# with C ints on every request.  Other modules import the codes from codes.py.
cdef int GO, KEEP, LATER, LINE, SKIP, STORAGE
cdef Py_ssize_t LENGTH_LIMIT, ACCUMULATE_THRESHOLD

@cython.locals(start=cython.p_char, found=cython.p_char)
cdef inline Py_ssize_t _find_newline(bytes data, Py_ssize_t pos, Py_ssize_t end)

@cython.locals(words=list, chars=cython.p_uchar, i=Py_ssize_t, j=Py_ssize_t, count=Py_ssize_t,
               n=Py_ssize_t, word=bytes)
cpdef list _split_words(bytes data, Py_ssize_t pos, Py_ssize_t stop)

cdef inline bint _is_space(unsigned char c) noexcept

cdef object _new_block(Py_ssize_t size)

@cython.locals(target=bytes)
cdef void _fill(object block, Py_ssize_t at, bytes data, Py_ssize_t n)

cdef class Command:
    cdef public bytes word
    cdef public int shape
    cdef public Py_ssize_t length_at
    cdef public Py_ssize_t noreply_after
    cdef public object run
    cdef public object accept
    cdef public bint waits_for_sets

    cpdef run_line(self, object conn, list args)
    cpdef bint accept_block(self, object conn, list args, Py_ssize_t size) except -1
    cpdef run_block(self, object conn, list args, bytes data)


cdef class Sink:
    cpdef int request(self, Command command, list args, bint quiet) except? -1
    cpdef int block_header(self, Command command, list args, Py_ssize_t size, bint quiet) except? -1
    cpdef int block(self, Command command, list args, bytes data, bint quiet) except? -1
    cpdef bad_block(self, bint quiet)
    cpdef fatal(self, bytes reply)


cdef class Framing:
    cdef public dict table
    cdef public Command unknown
    cdef public Py_ssize_t max_line
    cdef public bytes buf
    cdef public object block_data
    cdef public Py_ssize_t filled
    cdef public Py_ssize_t skip
    cdef public Command block_command
    cdef public list block_args
    cdef public Py_ssize_t block_size
    cdef public bint block_quiet
    cdef public bint expect_end
    cdef public bint drop_line
    cdef public bytes last_length
    cdef public Py_ssize_t last_size
    cdef public bytes last_word
    cdef public Command last_command

    cpdef bint holds_input(self) except -1
    cpdef bint mid_request(self) except -1
    cpdef keep(self, bytes data)
    cpdef drop_input(self)
    cpdef bytes take_input(self)

    @cython.locals(n=Py_ssize_t)
    cpdef object receive(self, bytes data)
    cpdef _block_whole(self)

    @cython.locals(
        pos=Py_ssize_t, end=Py_ssize_t, stop=Py_ssize_t, after=Py_ssize_t, nl=Py_ssize_t,
        start=Py_ssize_t, size=Py_ssize_t, n=Py_ssize_t, need=Py_ssize_t, max_line=Py_ssize_t,
        verdict=int, quiet=bint, byte=int, command=Command, table=dict, args=list, rest=bytes,
        raw=bytes, word=bytes, whole=object, block=object,
    )
    cpdef parse(self, Sink sink, bytes data)
