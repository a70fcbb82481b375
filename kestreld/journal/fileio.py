"""How the journal hands bytes to its files: whole appends, and a tick's records in one writev.

Every put and every confirm ends here.  The compiled build (``fileio.pxd``) calls
``write(2)`` and ``writev(2)`` itself and keeps the GIL: an append to the page cache
takes microseconds, and ``os.write`` releasing and retaking the GIL around it cost
as much as the rest of a put's journal work (callgrind: about 1,400 instructions
per call, on an otherwise idle lock).  The plain Python build uses ``os.write``
and ``os.writev``; both raise ``OSError`` the same way.
"""

from __future__ import annotations

import os

try:
    import cython
    from cython.cimports.cpython.mem import PyMem_Free, PyMem_Malloc
    from cython.cimports.libc.errno import EINTR, errno
    from cython.cimports.posix.uio import iovec
    from cython.cimports.posix.uio import writev as c_writev
    from cython.cimports.posix.unistd import write as c_write

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

#: At most this many chunks per writev (IOV_MAX on Linux); more are joined and written.
WRITEV_CHUNKS = 1024


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` (a short write goes on from where it stopped)."""
    if COMPILED:
        _write_all_c(fd, data)
        return
    n = os.write(fd, data)
    if n == len(data):
        return  # the usual case: no view, no loop
    view = memoryview(data)[n:]
    while view:
        view = view[os.write(fd, view) :]


def write_chunks(fd: int, chunks: list[bytes], size: int) -> None:
    """Write ``chunks`` (``size`` bytes in all) whole: one ``writev`` in the usual case, no copy."""
    if len(chunks) > WRITEV_CHUNKS:
        write_all(fd, b"".join(chunks))
        return
    if COMPILED:
        n = _writev_c(fd, chunks)
    else:
        n = os.writev(fd, chunks)
    if n < size:  # a short write (a full disk is an OSError): the rest, from where it stopped
        write_all(fd, b"".join(chunks)[n:])


def _write_all_c(fd: int, data: bytes) -> None:
    """``write(2)`` until all of ``data`` is written (compiled build only)."""
    size = len(data)
    done = 0
    while done < size:
        n = c_write(fd, cython.cast(cython.p_char, data) + done, size - done)
        if n < 0:
            if errno == EINTR:
                continue
            raise OSError(errno, os.strerror(errno))
        done += n


def _writev_c(fd: int, chunks: list[bytes]) -> int:
    """One ``writev(2)`` of ``chunks``; the bytes written (compiled build only)."""
    count = len(chunks)
    iov = cython.cast(cython.pointer(iovec), PyMem_Malloc(count * cython.sizeof(iovec)))
    if not iov:
        raise MemoryError()
    try:
        for i in range(count):
            chunk = chunks[i]
            iov[i].iov_base = cython.cast(cython.p_char, chunk)
            iov[i].iov_len = len(chunk)
        while True:
            n = c_writev(fd, iov, count)
            if n >= 0:
                return n
            if errno != EINTR:
                raise OSError(errno, os.strerror(errno))
    finally:
        PyMem_Free(iov)
