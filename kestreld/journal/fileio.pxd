# Cython declarations for fileio.py (compiled when a compiler is present; see kestreld/compiled.py).
# The compiled build writes with write(2) and writev(2) directly, keeping the GIL.

cimport cython

cdef bint COMPILED

cpdef write_all(int fd, bytes data)
@cython.locals(n=Py_ssize_t)
cpdef write_chunks(int fd, list chunks, Py_ssize_t size)

@cython.locals(size=Py_ssize_t, done=Py_ssize_t, n=Py_ssize_t)
cdef _write_all_c(int fd, bytes data)

@cython.locals(count=Py_ssize_t, i=Py_ssize_t, n=Py_ssize_t, chunk=bytes)
cdef Py_ssize_t _writev_c(int fd, list chunks) except -1
