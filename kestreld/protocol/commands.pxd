# Cython declarations for commands.py (compiled when a compiler is present; see kestreld/compiled.py).
# The hot handlers take the connection as its cdef class: its fields are C struct reads.
# Numbers from the wire (flags, exptime, /t=) stay Python ints: no overflow is possible.

cimport cython

from kestreld.protocol.connection cimport Connection


cdef class GetOptions:
    cdef public str name
    cdef public object timeout
    cdef public bint open
    cdef public bint close
    cdef public bint abort
    cdef public bint peek


cpdef object queue_name(bytes raw)

@cython.locals(opts=GetOptions, parts=list, opt=bytes, name=str)
cpdef object parse_get(bytes key)

@cython.locals(out=list, name=str)
cpdef bint accept_set(Connection conn, list args, Py_ssize_t size) except -1

@cython.locals(out=list, noreply=bint)
cpdef cmd_set(Connection conn, list args, bytes data)

@cython.locals(key=bytes, with_cas=bint)
cpdef cmd_get(Connection conn, list args)

cpdef deliver(Connection conn, object reader, bytes key, object item, bint open_, bint peek, bytes tail, bint with_cas=*, object reply=*)
