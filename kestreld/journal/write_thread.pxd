# Cython declarations for write_thread.py (compiled when a compiler is present; see kestreld/compiled.py).
# The write threads run the nogil functions below only: C records and C calls, no object.

cimport cython
from cpython.pythread cimport PyThread_type_lock
from posix.uio cimport iovec

cdef int IOV_MAX_CHUNKS  # COMPILED stays a Python name: large_write.py reads it

# What a write thread reads: filled by the loop, alive (in a WriteJob) until reported.
cdef struct Job:
    int fd
    iovec *iov
    int count
    int error
    PyThread_type_lock done

cdef class WriteJob:
    cdef Job job
    cdef object chunks
    cdef object on_done
    cdef bint finished
    cdef readonly Py_ssize_t address

cdef void _serve_jobs(int jobs, int done) noexcept nogil
cdef int _write_iov(int fd, iovec *iov, int count) noexcept nogil
cdef bint _read_word(int fd, Py_ssize_t *word) noexcept nogil
cdef void _write_word(int fd, Py_ssize_t word) noexcept nogil
