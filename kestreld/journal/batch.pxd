# Cython declarations for batch.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every put and confirm joins a Batch: its fields are C struct reads for the compiled writer,
# queue and readers.  end_segment stays an object (writer.pxd cimports this file).

cimport cython

from kestreld.journal.clock cimport monotonic


cdef class Batch:
    cdef public bint done
    cdef public object error
    cdef public object first
    cdef public object second
    cdef public list callbacks
    cdef public double started
    cdef public object end_segment
    cdef public long long end_offset
    cdef public object payload
    cdef public Batch behind
    cdef public bint stored
    cdef public list on_stored

    cpdef add_done_callback(self, object fn)
    cpdef add_stored_callback(self, object fn)
    @cython.locals(callbacks=list)
    cpdef store(self)

    @cython.locals(callbacks=list, first=object, second=object)
    cpdef resolve(self, object error=*)
