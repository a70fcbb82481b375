# Cython declarations for clock.py (compiled when a compiler is present; see kestreld/compiled.py).
# The hot modules cimport these: a reading is a C call and a C number, no Python call, no float.

cdef bint COMPILED

cpdef long long now_ms() noexcept
cpdef double monotonic() noexcept
cpdef double thread_cpu() noexcept
