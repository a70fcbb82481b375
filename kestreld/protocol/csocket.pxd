# send(2) and its flags, for the compiled connection's direct reply writes (connection.py,
# Connection.send).  Declarations only: Cython's own posix includes have no socket.pxd.

cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL
