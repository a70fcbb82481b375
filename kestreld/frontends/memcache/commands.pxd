# Cython declarations for commands.py (compiled when a compiler is present; see kestreld/compiled.py).
# The hot handlers take the connection as its cdef class: its fields are C struct reads,
# and the session's verbs are C calls.  Numbers from the wire (flags, exptime, /t=) stay
# Python ints: no overflow is possible.

cimport cython

from kestreld.journal.clock cimport now_ms
from kestreld.frontends.memcache.connection cimport Connection
from kestreld.frontends.memcache.framing cimport Command
from kestreld.session.fetch cimport Fetch

# parse_get's last key and entry: C globals (no dict store per get).
cdef bytes _LAST_GET_KEY
cdef object _LAST_GET


cpdef object queue_name(bytes raw)

@cython.locals(template=Fetch, cache=dict)
cpdef object parse_get(bytes key)

@cython.locals(opts=Fetch, parts=list, opt=bytes, name=str)
cdef object _parse_get(bytes key)

@cython.locals(out=list, name=str, raw=bytes)
cpdef bint accept_set(Connection conn, list args, Py_ssize_t size) except -1

@cython.locals(noreply=bint, name=str)
cpdef cmd_set(Connection conn, list args, bytes data)

@cython.locals(with_cas=bint, f=Fetch)
cpdef cmd_get(Connection conn, list args)


# get and set: their handlers called by the command's own cpdef methods (a C call per request).
cdef class GetCommand(Command):
    cpdef run_line(self, object conn, list args)


cdef class SetCommand(Command):
    cpdef bint accept_block(self, object conn, list args, Py_ssize_t size) except -1
    cpdef run_block(self, object conn, list args, bytes data)
