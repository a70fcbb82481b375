# Cython declarations for codec.py (compiled when a compiler is present; see kestreld/compiled.py).
# The encoders get C entry points for the compiled writer; scan() and the decoders are
# compiled as they are (their indexes come from files: bounds checks stay on).

cimport cython

cdef bint COMPILED

cpdef bytes encode_put(object id, object add_time, object data, object expire_time=*, object error_count=*)
cpdef bytes put_header(object id, object add_time, Py_ssize_t size, object expire_time=*, object error_count=*)
cpdef bytes encode_read_head(object id)
cpdef bytes encode_read_done(object ids)

@cython.locals(out=bytes, p=cython.p_uchar)
cdef bytes _put6_c(long long id, long long add_time, Py_ssize_t size, int error_count)
@cython.locals(out=bytes, p=cython.p_uchar)
cdef bytes _done1_c(long long id)
@cython.locals(bits=cython.ulonglong, i=int)
cdef inline void _store_le(unsigned char *p, long long value, int width)
