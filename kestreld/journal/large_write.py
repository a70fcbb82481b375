"""A tick's records too large to write on the event loop: written by a worker thread.

Appending a few KiB to the page cache takes microseconds, so the writer journal writes a
tick's records itself.  An 8 MiB item is another matter: copying it into the page cache
takes milliseconds, and far longer when the kernel throttles a writer behind dirty pages
(tens of ms were seen here); on the loop, every connection of every queue would wait for
it.  A buffer of at least :data:`LARGE_WRITE_BYTES` is therefore handed to the executor
(``os.writev`` releases the GIL), and the loop goes on reading and answering.

The journal stays single-writer per file and in id order: while a large write is in flight
the queue's later puts start the next segment, written on the loop and acknowledged at once
(their batch is *stored*: replies may go), but their batch resolves - its items reach the
readers - only after the large one, so items keep journal order, and a read-behind waits at
the segment being written (``LargeWrites.holding``).  At most one large batch is unresolved
at a time, so a write can be in flight only in the newest two segments; start-up scans both
and cuts a torn last record (a crash in the middle of the large write).  A rotation of the
next segment, a shutdown or a failed fsync waits for the write first.  Behind a write of
less than :data:`OVERTAKE_BYTES` later puts wait in the buffer instead.

Who writes: the write threads of the server's queues (:func:`start_write_threads`, compiled
build: write_thread.py, threads that never take the GIL, so the loop never waits for one),
else the executor (the plain build, offline tools, a writer driven by hand).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

import structlog

from kestreld.journal import write_thread
from kestreld.journal.batch import Batch
from kestreld.journal.segment import Segment
from kestreld.journal.write_thread import WriteJob, WriteThreads

log = structlog.get_logger("kestreld.journal")

#: A tick's buffered records of at least this size are written off the event loop.
LARGE_WRITE_BYTES = 512 * 1024

#: Batches stored behind a large one that resolve per turn of the loop once it has: thousands
#: may have waited behind an 8 MiB write, each offering its items to the readers (resolved
#: in one callback they held the loop for tens of ms).
RESOLVE_SLICE = 128

#: While a write of at least this size is in flight, later puts start the next segment; behind
#: a smaller one (a burst of small puts adding up, written in well under a millisecond) they
#: wait, so that busy ticks do not each leave a segment of their own.
OVERTAKE_BYTES = 2 * 1024 * 1024

#: The write threads of the server's queues (compiled build), from their load to their
#: close; None: the executor.
_write_threads: WriteThreads | None = None


def start_write_threads() -> None:
    """Large writes made on the running loop go to write threads from now on (compiled
    build; the plain one, or no running loop: the executor still)."""
    global _write_threads
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    if write_thread.COMPILED and (_write_threads is None or _write_threads.loop is not loop):
        stop_write_threads()
        _write_threads = WriteThreads(loop)


def stop_write_threads() -> None:
    """Back to the executor; the threads stop once the writes handed to them are done."""
    global _write_threads
    threads, _write_threads = _write_threads, None
    if threads is not None:
        threads.close()


class LargeWrite:
    """One buffer of records being written by a worker thread to one segment."""

    __slots__ = ("future", "segment", "end", "batch", "fd", "started", "retire", "overtaken")

    def __init__(self, segment: Segment, end: int, batch: Batch, fd: int, size: int) -> None:
        self.started = time.monotonic()
        #: The write on its thread (a Future, or a WriteJob: both have ``result()``).
        self.future: Future | WriteJob | None = None
        self.segment = segment
        self.end = end  # the segment's size once this write is done
        self.batch = batch  # its puts: acknowledged once written (and synced)
        self.fd = fd
        #: The writer moved on to a new segment meanwhile: ``fd`` is retired once written.
        self.retire = False
        #: Puts that come meanwhile go to the next segment (see OVERTAKE_BYTES).
        self.overtaken = size >= OVERTAKE_BYTES

    def handed_over(self, future: Future | WriteJob) -> None:
        """The write runs on its thread as ``future``."""
        self.future = future

    def wait(self) -> BaseException | None:
        """Block until the write is done; its error, if it failed."""
        try:
            self.future.result()
        except BaseException as e:  # noqa: BLE001 - handed to the writer, which fails the batch
            return e
        return None

    def let_go(self) -> None:
        """The write is over: drop the future, whose done callback refers back to this
        write.  Freed by their counts then, its batch and its item's data (8 MiB) go at
        once, not in a cycle collection that frees them all together on the event loop
        (collections of 10 ms were seen with several large items in them)."""
        self.future = None

    def retire_when_done(self) -> None:
        """The writer moved on to a new segment: ``fd`` is retired once written."""
        self.retire = True


class LargeWrites:
    """One writer journal's large writes: the one in flight, its batch until it resolves
    (``ahead``), the batches stored behind it, and the front ends waiting for their turn.

    Pure Python: its verbs run once per large put (an 8 MiB item), not once per put; the
    writer's per-put path only reads :attr:`write` and :attr:`ahead`.  It changes the
    writer only through the writer's verbs (``take_buffer``, ``_acknowledge``, ...).
    """

    __slots__ = ("writer", "write", "ahead", "deferred", "waiters", "draining")

    def __init__(self, writer: Any) -> None:
        self.writer = writer  # the WriterJournal owning this (compiled or not: Any)
        #: A buffer being written by a worker thread to its segment; later puts go to a new
        #: segment, written on the loop meanwhile.
        self.write: LargeWrite | None = None
        #: The large write's batch until it resolves (written, and synced as asked): batches
        #: made meanwhile (``behind``) are stored when safe and resolve after it, in order.
        self.ahead: Batch | None = None
        self.deferred: list[Batch] = []  # stored behind ``ahead``, oldest first
        #: Called once no large write is in flight or buffered (see :meth:`busy`).
        self.waiters: list[Callable[[], None]] = []
        #: The large batch resolved and ``deferred`` resolves a slice per turn: ``ahead`` is
        #: the newest deferred batch, so that batches made meanwhile queue behind them.
        self.draining = False

    def may_overtake(self) -> bool:
        """A put may go to a worker thread as it is made (later puts then overtake it): no
        large write is under way, and an event loop runs to hear back from the thread."""
        if not self.idle() or self.writer.executor is None:
            return False
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return False
        return True

    def start(self, batch: Batch) -> str | None:
        """Hand the writer's buffer to a worker thread; ``batch`` is acknowledged once it is
        written.  None, or why it could not start (``batch`` failed with it)."""
        writer = self.writer
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop (offline tools): written here
            writer.write_buffer()
            if writer.sync.written([batch]):
                writer._acknowledge(batch)
            return None
        try:
            fd, seg, chunks, size = writer.take_buffer()
        except OSError as e:  # the segment could not be opened
            writer._write_failed(writer.segments[-1], e)
            batch.resolve(f"journal write failed: {e.strerror}")
            return f"journal write failed: {e.strerror}"
        large = self.write = LargeWrite(seg, seg.size, batch, fd, size)
        large.handed_over(
            submit(writer.executor, loop, fd, chunks, size, lambda: self.written(large))
        )
        writer._overtaking = seg if large.overtaken else None
        self.ahead = batch
        return None

    def written(self, large: LargeWrite) -> None:
        """The worker thread is done (on the loop); nothing to do if a wait took it already."""
        if self.write is large:
            self.finish(large.wait())

    def wait(self) -> None:
        """Block until the large write in flight is done and every batch behind it resolved
        (a rotation, a shutdown)."""
        large = self.write
        if large is not None:
            self.finish(large.wait())
        while self.draining:
            self.resolve_slice()

    def retire(self, fd: int) -> bool:
        """The writer leaves ``fd``: True when the write in flight retires it once done."""
        large = self.write
        if large is None or large.fd != fd:
            return False
        large.retire_when_done()
        return True

    def finish(self, error: BaseException | None) -> None:
        """The large write ended: its puts are written (acknowledged as a tick's are), or
        failed, and with them every put buffered behind it in the same segment; the
        batches stored meanwhile in the next segment resolve after it."""
        large, self.write = self.write, None
        assert large is not None
        large.let_go()
        writer = self.writer
        writer._overtaking = None
        sync = writer.sync
        seg = large.segment
        if error is None:
            seg.wrote_to(large.end)
            if large.retire:
                sync.retire(large.fd)  # before the batch's fsync, which covers it
            if sync.written([large.batch]):
                writer._acknowledge(large.batch)
        else:
            if not isinstance(error, OSError):
                error = OSError(0, str(error))
            large.batch.resolve(f"journal write failed: {error.strerror}")
            if large.retire:
                # Later puts went to the next segment: only this one is cut back.
                log.error(
                    "journal_write_failed", queue=writer.queue, path=seg.path, error=error.strerror
                )
                try:
                    os.ftruncate(large.fd, seg.written)
                except OSError:
                    pass
                seg.unbuffered()
                sync.retire(large.fd)
                sync.refuse_writes()
            else:
                writer._write_failed(seg, error)
            self.ahead_resolved()
        if not writer.flush_pending() and self.ahead is None:
            self.free()

    def abandon(self, error: str) -> None:
        """An fsync failed: written or not, the large write lies behind what it could not
        write, and fails too (its segment, when not the current one, is cut back)."""
        large, self.write = self.write, None
        self.writer._overtaking = None
        if large is None:
            return
        seg = large.segment
        if large.wait() is None:
            seg.wrote_to(large.end)
        large.let_go()
        large.batch.resolve(error)
        if large.retire:  # a segment before the current one: cut back likewise
            try:
                os.ftruncate(large.fd, seg.visible)
                seg.cut_to(seg.visible)
            except OSError:
                pass
            self.writer.sync.retire(large.fd)

    def ahead_resolved(self) -> None:
        """The large batch resolved (or failed): the batches stored behind it resolve, in
        order, :data:`RESOLVE_SLICE` per turn of the loop; then a large put waiting for its
        turn may go."""
        if self.draining:
            return  # a failure while draining: the slices go on
        if self.deferred:
            self.draining = True
            self.ahead = self.deferred[-1]
            self.resolve_slice()
            return
        self.ahead = None
        self.writer.flush_pending()  # a large buffer may have waited
        self.free()

    def resolve_slice(self) -> None:
        """Resolve the oldest :data:`RESOLVE_SLICE` deferred batches; the rest on the loop's
        next turn (at once without a running loop)."""
        deferred = self.deferred
        batches = deferred[:RESOLVE_SLICE]
        del deferred[:RESOLVE_SLICE]
        for batch in batches:
            batch.resolve()
        if deferred:
            try:
                asyncio.get_running_loop().call_soon(self._next_slice)
            except RuntimeError:  # no event loop (offline tools): all now
                self.resolve_slice()
            return
        self.draining = False
        self.ahead = None
        self.writer.flush_pending()  # a large buffer may have waited
        self.free()

    def _next_slice(self) -> None:
        if self.draining:  # not finished meanwhile by a wait()
            self.resolve_slice()

    def defer(self, batch: Batch) -> None:
        """``batch`` is stored behind the unresolved large batch: it resolves after it (and
        while those behind it drain, later batches queue behind this one)."""
        self.deferred.append(batch)
        if self.draining:
            self.ahead = batch
        batch.store()

    def free(self) -> None:
        """Wake the front ends waiting to hand over a large put (see :meth:`busy`)."""
        waiters = self.waiters
        if waiters and not self.busy():
            self.waiters = []
            # On the loop's next turn, not inside the writer's own bookkeeping.
            call_soon = self.writer._get_loop().call_soon
            for fn in waiters:
                call_soon(fn)

    def busy(self) -> bool:
        """A large write is in flight or buffered: a large put handed over now would wait
        in the buffer, and small puts of its tick with it (a front end may hold it back
        and ask, with :meth:`call_when_free`, to be called once this is False)."""
        return self.ahead is not None or self.writer.buffered >= LARGE_WRITE_BYTES

    def call_when_free(self, fn: Callable[[], None]) -> None:
        """``fn()`` on the loop once :meth:`busy` is False (or the journal closed)."""
        self.waiters.append(fn)

    def holding(self, seg: Segment) -> bool:
        """``seg`` has puts not acknowledged yet while a large batch is unresolved: a
        read-behind that reached its acknowledged end waits here rather than moving on
        to a later segment (whose puts stored meanwhile are offered after it)."""
        return self.ahead is not None and seg.visible < seg.size

    def idle(self) -> bool:
        """No worker thread writes to a descriptor of the journal, no batch waits on one."""
        return self.write is None and self.ahead is None


def submit(
    executor: Executor,
    loop: asyncio.AbstractEventLoop,
    fd: int,
    chunks: list[bytes],
    size: int,
    done: Callable[[], None],
) -> Future | WriteJob:
    """Write ``chunks`` (``size`` bytes) to ``fd`` on a worker thread; ``done()`` on ``loop``
    once written (or failed: ``result()`` of what this returns says which)."""
    threads = _write_threads
    if threads is not None and threads.loop is loop:
        return threads.submit(fd, chunks, done)
    future = executor.submit(_write_all, fd, chunks, size)
    future.add_done_callback(lambda _: loop.call_soon_threadsafe(done))
    return future


def _write_all(fd: int, chunks: list[bytes], size: int) -> None:
    """``writev`` until every chunk is written (the GIL released meanwhile)."""
    done = 0
    while chunks:
        n = os.writev(fd, chunks[:_IOV_MAX])
        done += n
        if done >= size:
            return
        # A short write: drop what was written, go on from where it stopped.
        rest: list[bytes | memoryview] = []
        for chunk in chunks:
            if n >= len(chunk):
                n -= len(chunk)
                continue
            rest.append(memoryview(chunk)[n:] if n else chunk)
            n = 0
        chunks = rest  # type: ignore[assignment]


_IOV_MAX = 1024  # IOV_MAX on Linux: more chunks take more writev calls
