"""Reply bytes sent to a client's socket directly, by the compiled connection.

While its transport holds nothing, the compiled
:class:`~kestreld.frontends.memcache.connection.Connection` on a plain uvloop socket
sends a reply itself (:func:`send_now`): one ``send(2)``, or ``sendmsg(2)`` of an iovec
for several parts (an item's bytes are not joined into one more copy), as the
transport's own write would make first, without its buffer list and callbacks (about
900 instructions of a 20,000-instruction set).  What the socket does not take, the
connection hands to the transport, which buffers it, pauses the connection past its
high-water mark and reports an error through ``connection_lost``.

These are functions of a descriptor and bytes returning counts: whether to send
directly, and what follows a short send, are the connection's.  A TLS transport
(kestreld/security) never qualifies: its socket carries records, not replies.  The plain
build never sends directly: the connection cimports the C functions (direct_send.pxd).
"""

from __future__ import annotations

from typing import Any

try:
    import cython
    from cython.cimports.cpython.mem import PyMem_Free, PyMem_Malloc
    from cython.cimports.kestreld.frontends.memcache.csocket import (
        MSG_DONTWAIT,
        MSG_NOSIGNAL,
        msghdr,
    )
    from cython.cimports.kestreld.frontends.memcache.csocket import send as c_send
    from cython.cimports.kestreld.frontends.memcache.csocket import sendmsg as c_sendmsg
    from cython.cimports.libc.errno import EAGAIN, EINTR, errno
    from cython.cimports.libc.string import memset
    from cython.cimports.posix.uio import iovec
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    pass

try:  # the transports whose socket a reply may be sent to directly
    from uvloop.loop import TCPTransport as _UVTCP
    from uvloop.loop import UnixTransport as _UVUnix

    DIRECT_TRANSPORTS: tuple[type, ...] = (_UVTCP, _UVUnix)
except ImportError:  # pragma: no cover - uvloop is a dependency
    DIRECT_TRANSPORTS = ()


def descriptor(transport: Any) -> int:
    """The descriptor of ``transport``'s socket when replies may be sent to it directly (a
    plain uvloop TCP or Unix transport), else -1."""
    if type(transport) not in DIRECT_TRANSPORTS:
        return -1
    sock = transport.get_extra_info("socket")
    return -1 if sock is None else sock.fileno()


def send_bytes(fd: int, data: bytes) -> int:
    """Send what socket ``fd`` takes now of ``data`` (one ``send(2)``, not waiting): the
    bytes it took (0: its buffer is full), or ``-errno`` on an error."""
    while True:
        n = c_send(fd, cython.cast(cython.p_char, data), len(data), MSG_DONTWAIT | MSG_NOSIGNAL)
        if n >= 0:
            return n
        if errno != EINTR:
            break
    return 0 if errno == EAGAIN else -errno  # EWOULDBLOCK is EAGAIN on Linux


def send_now(fd: int, parts: list[bytes], total: cython.pointer(cython.Py_ssize_t)) -> int:
    """Send what socket ``fd`` takes now of ``parts``, in order, as they are (one
    ``send(2)``, or ``sendmsg(2)`` of an iovec, not waiting): the bytes it took (0: its
    buffer is full), or ``-errno`` on an error; ``total[0]`` is set to the parts' size."""
    count = len(parts)
    if count == 1:
        data = parts[0]
        total[0] = len(data)
        return send_bytes(fd, data)
    iov = cython.cast(cython.pointer(iovec), PyMem_Malloc(count * cython.sizeof(iovec)))
    if not iov:
        raise MemoryError()
    size = 0
    for i in range(count):
        part = parts[i]
        vec = iov + i
        vec.iov_base = cython.cast(cython.p_char, part)
        vec.iov_len = len(part)
        size += len(part)
    total[0] = size
    msg = cython.declare(msghdr)
    memset(cython.address(msg), 0, cython.sizeof(msghdr))
    msg.msg_iov = iov
    msg.msg_iovlen = count
    while True:
        n = c_sendmsg(fd, cython.address(msg), MSG_DONTWAIT | MSG_NOSIGNAL)
        if n >= 0 or errno != EINTR:
            break
    failed = errno  # read before the free, which may change it
    PyMem_Free(iov)
    if n >= 0:
        return n
    return 0 if failed == EAGAIN else -failed
