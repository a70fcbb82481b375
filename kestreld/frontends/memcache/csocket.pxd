# send(2), sendmsg(2) and their flags, for the compiled connection's direct reply writes
# (direct_send.py).  Declarations only: Cython's posix includes have no socket.pxd.

from posix.uio cimport iovec

cdef extern from "<sys/socket.h>" nogil:
    struct msghdr:
        iovec *msg_iov
        size_t msg_iovlen
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    ssize_t sendmsg(int fd, const msghdr *msg, int flags)
    enum:
        MSG_DONTWAIT
        MSG_NOSIGNAL
