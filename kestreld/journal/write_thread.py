"""Threads that write large buffers to the journal without ever taking the interpreter lock.

A large put's buffer (large_write.py) is written off the event loop.  Handed to a
``ThreadPoolExecutor``, each 8 MiB write costs the worker thread five to eight takes of
the GIL (the pool's queue, the future, the done callback, ``call_soon_threadsafe``, and
the retake after ``os.writev``), and at every one the loop may be left waiting for a
thread that has no CPU: the loop's longest holds during a flood of large items (4 to
15 ms) were that.  The compiled build gives the write to :class:`WriteThreads` instead:

- a job is a C record (:class:`WriteJob`: descriptor, ``iovec`` list, a lock) that the
  loop fills and keeps alive, with the item's bytes, until the thread reports it done;
- the loop writes the job's address into a pipe (the jobs' ring, in the kernel); a write
  thread reads it, ``writev``\\ s until every byte is written, releases the job's lock and
  writes the address back into a second pipe, which the loop reads (``add_reader``);
- the threads run C only, in one ``nogil`` block from start to close: they read no
  Python object and never take the GIL, so the loop never waits for them.

A blocking wait for one job (a rotation, a shutdown) takes its lock with the GIL released.
The plain Python build keeps the executor (``COMPILED`` is False and the server starts
no write threads).
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable

try:
    import cython
    from cython.cimports.cpython.mem import PyMem_Free, PyMem_Malloc
    from cython.cimports.cpython.pythread import (
        WAIT_LOCK,
        PyThread_acquire_lock,
        PyThread_allocate_lock,
        PyThread_free_lock,
        PyThread_release_lock,
        PyThread_type_lock,
    )
    from cython.cimports.libc.errno import EINTR, EIO, errno
    from cython.cimports.posix.uio import iovec
    from cython.cimports.posix.uio import writev as c_writev
    from cython.cimports.posix.unistd import read as c_read
    from cython.cimports.posix.unistd import write as c_write

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

#: Write threads per server: large puts of two queues are written side by side (a write
#: throttled behind dirty pages does not hold up another queue's); more buys nothing on
#: the disk.
THREADS = 2

#: At most this many chunks per writev (IOV_MAX on Linux): more take more calls.
IOV_MAX_CHUNKS = 1024

# A job's address goes through the pipes as one machine word, written whole (a pipe write
# of up to PIPE_BUF bytes is never split), so a read of one word is one job.


class WriteJob:
    """One buffer handed to a write thread.  The chunks stay referenced here until the
    write is done; the thread reads only the C record (``job``) and the bytes' memory."""

    def __init__(self, fd: int, chunks: list[bytes], on_done: Callable[[], None]) -> None:
        count = cython.declare(cython.Py_ssize_t, len(chunks))
        i = cython.declare(cython.Py_ssize_t)
        chunk = cython.declare(bytes)
        self.chunks = chunks
        self.on_done = on_done
        self.finished = False
        self.job.fd = fd
        self.job.count = count
        self.job.error = 0
        self.job.iov = cython.cast(
            cython.pointer(iovec), PyMem_Malloc(max(count, 1) * cython.sizeof(iovec))
        )
        if not self.job.iov:
            raise MemoryError()
        for i in range(count):
            chunk = chunks[i]
            self.job.iov[i].iov_base = cython.cast(cython.p_char, chunk)
            self.job.iov[i].iov_len = len(chunk)
        self.job.done = PyThread_allocate_lock()
        if not self.job.done:
            raise MemoryError()
        # Held from now on: the thread releases it once the write is done (see result()).
        PyThread_acquire_lock(self.job.done, WAIT_LOCK)
        self.address = cython.cast(cython.Py_ssize_t, cython.address(self.job))

    def __dealloc__(self) -> None:
        # Only once the thread reported the job (WriteThreads keeps it until then): the
        # thread's release of the lock has returned, nothing of it is in use.
        if self.job.iov:
            PyMem_Free(self.job.iov)
        if self.job.done:
            PyThread_free_lock(self.job.done)

    def result(self) -> None:
        """Block until the buffer is written (the GIL released meanwhile); its OSError if the
        write failed.  Like ``Future.result()``, which large_write.py calls on the executor's."""
        lock = cython.declare(PyThread_type_lock, self.job.done)
        if not self.finished:
            with cython.nogil:
                PyThread_acquire_lock(lock, WAIT_LOCK)
            self._finish()
        if self.job.error:
            raise OSError(self.job.error, os.strerror(self.job.error))

    def _finish(self) -> None:
        """The thread is done with the bytes: they go now (8 MiB), not with the report."""
        self.finished = True
        self.chunks = None

    def reported(self) -> None:
        """The thread reported the job (on the loop): ``on_done()``, once."""
        if not self.finished:
            PyThread_acquire_lock(self.job.done, WAIT_LOCK)  # released already: at once
            self._finish()
        on_done, self.on_done = self.on_done, None
        if on_done is not None:
            on_done()


class WriteThreads:
    """The server's write threads (compiled build), reporting to one event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, count: int = THREADS) -> None:
        self.loop = loop
        self._jobs_out, self._jobs_in = os.pipe2(os.O_CLOEXEC)
        self._done_out, self._done_in = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(self._done_out, False)
        #: Jobs handed over and not reported yet, by address (they stay alive until then).
        self.pending: dict[int, WriteJob] = {}
        loop.add_reader(self._done_out, self._reported)
        self.threads = [
            threading.Thread(
                target=_serve,
                args=(self._jobs_out, self._done_in),
                name=f"kestreld-write-{n}",
                daemon=True,
            )
            for n in range(count)
        ]
        for thread in self.threads:
            thread.start()

    def submit(self, fd: int, chunks: list[bytes], on_done: Callable[[], None]) -> WriteJob:
        """Write ``chunks`` to ``fd`` whole on a write thread; ``on_done()`` on the loop once
        written (or failed: the job's ``result()`` says)."""
        job = WriteJob(fd, chunks, on_done)
        self.pending[job.address] = job
        # write(2) itself, the GIL kept (os.write would let it go and take it back: a hand-off
        # to any thread that wants it).  A pipe of 64 KiB (8,192 jobs): never full.
        _write_word(self._jobs_in, job.address)
        return job

    def _reported(self) -> None:
        address = cython.declare(cython.Py_ssize_t, 0)
        # Every report read is taken off ``pending`` first: one failing callback must not
        # leave the others, already out of the pipe, unreported.
        jobs = []
        while _read_word(self._done_out, cython.address(address)):  # non-blocking
            jobs.append(self.pending.pop(address))
        for job in jobs:
            try:
                job.reported()
            except Exception as e:  # noqa: BLE001 - as the loop reports a failed callback
                self.loop.call_exception_handler(
                    {"message": "large write report failed", "exception": e}
                )

    def close(self) -> None:
        """Stop the threads once the jobs handed over are written (a job of 0 each)."""
        for _ in self.threads:
            _write_word(self._jobs_in, 0)
        for thread in self.threads:
            thread.join()
        if not self.loop.is_closed():
            self.loop.remove_reader(self._done_out)
        self._reported_left()
        for fd in (self._jobs_out, self._jobs_in, self._done_out, self._done_in):
            os.close(fd)

    def _reported_left(self) -> None:
        """After the threads ended: every job's report is in the pipe."""
        while self.pending:
            left = len(self.pending)
            self._reported()
            if len(self.pending) == left:
                return  # a thread ended early (its pipe failed): nothing more will come


def _serve(jobs: int, done: int) -> None:
    """A write thread: C from here to the job of 0 (``close``), never holding the GIL."""
    jobs_fd = cython.declare(cython.int, jobs)
    done_fd = cython.declare(cython.int, done)
    with cython.nogil:
        _serve_jobs(jobs_fd, done_fd)


def _serve_jobs(jobs: int, done: int) -> None:
    # Job: the C record declared in write_thread.pxd (compiled build only).
    address = cython.declare(cython.Py_ssize_t, 0)
    job = cython.declare(cython.pointer(Job))  # noqa: F821
    while _read_word(jobs, cython.address(address)) and address != 0:
        job = cython.cast(cython.pointer(Job), address)  # noqa: F821
        job.error = _write_iov(job.fd, job.iov, job.count)
        # The last touch of the job: a waiter may go on (and drop the bytes) from here.
        PyThread_release_lock(job.done)
        _write_word(done, address)


def _write_iov(fd: int, iov: object, count: int) -> int:
    """``writev`` until every chunk is written; 0, or the errno of the failure."""
    n = cython.declare(cython.Py_ssize_t)
    progress = cython.declare(cython.bint)
    while count > 0:
        n = c_writev(fd, iov, count if count < IOV_MAX_CHUNKS else IOV_MAX_CHUNKS)
        if n < 0:
            if errno == EINTR:
                continue
            return errno
        progress = n > 0
        # Drop what was written, go on from where it stopped (a short write).
        while count > 0 and n >= cython.cast(cython.Py_ssize_t, iov[0].iov_len):
            n -= iov[0].iov_len
            iov += 1
            count -= 1
        if count > 0:
            if not progress:
                return EIO  # nothing written and no error: never loop on it
            iov[0].iov_base = cython.cast(cython.p_char, iov[0].iov_base) + n
            iov[0].iov_len -= n
    return 0


def _read_word(fd: int, word: object) -> bool:
    """Read one word from a pipe; False when it is empty (non-blocking), closed or failed."""
    n = cython.declare(cython.Py_ssize_t)
    while True:
        n = c_read(fd, word, cython.sizeof(cython.Py_ssize_t))
        if n == cython.sizeof(cython.Py_ssize_t):
            return True
        if n < 0 and errno == EINTR:
            continue
        return False


def _write_word(fd: int, word: int) -> None:
    """Write one word (a job's address) to a pipe."""
    n = cython.declare(cython.Py_ssize_t)
    while True:
        n = c_write(fd, cython.address(word), cython.sizeof(cython.Py_ssize_t))
        if n < 0 and errno == EINTR:
            continue
        return
