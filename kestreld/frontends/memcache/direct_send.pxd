# Cython declarations for direct_send.py (compiled when a compiler is present; see kestreld/compiled.py).
# The compiled connection cimports send_now: a reply goes to its socket with no Python call.
# A result of -1 may be -EPERM: `except? -1` then checks for an exception (a MemoryError).

cimport cython

@cython.locals(n=Py_ssize_t)
cdef Py_ssize_t send_bytes(int fd, bytes data) except? -1

@cython.locals(count=Py_ssize_t, size=Py_ssize_t, n=Py_ssize_t, i=Py_ssize_t, part=bytes,
               data=bytes, failed=int)
cdef Py_ssize_t send_now(int fd, list parts, Py_ssize_t *total) except? -1
