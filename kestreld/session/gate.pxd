# Cython declarations for gate.py (compiled when a compiler is present; see kestreld/compiled.py).
# Every set and get reads these: C fields.

cdef class Gate:
    cdef public object writes_refused
    cdef public object reads_refused
    cdef public object latency_observer

    cpdef refuse(self, object writes, object reads)
    cpdef observe(self, object observer)
