"""A writer journal's next segment, made ready off the event loop (a spare).

Creating a file changes its folder: while 8 MiB items were in writeback, ext4 made the
rotation's ``open(O_CREAT | O_EXCL)`` take up to 4 ms on the loop and the header's
``write`` after it up to 5.5 ms (strace of the loop thread in the fairness flood, where
every large put is overtaken into a new segment: large_write.py).  A queue that rotates
often therefore keeps its next segment ready: created, header written, by the io
executor, so that a rotation on the loop only swaps descriptors.

- When: a rotation within :data:`KEEP_SECONDS` of the previous one prepares the spare for
  the next.  It is dropped (closed and deleted, off the loop) once :data:`KEEP_SECONDS`
  pass without a rotation, when the descriptor budget closes the journal's descriptors
  (handles.py), and when the journal is closed or erased.  A queue's first segment and
  queues that rotate rarely get none, and none is made while the budget is full: 10,000
  idle queues hold no spare.
- Names: a spare's stamp is chosen when it is prepared, greater than every stamp handed
  out before (:meth:`SpareSegments.stamp_after`), so segments stay in order; it is earlier
  than its first put.  Nothing reads a stamp as a time: start-up, read-behind, retirement,
  the pipeline and the tools only order segments by it.  A rotation that finds the spare
  not ready (the executor busy) creates its segment on the loop as before, with a stamp
  after the spare's, and the spare is deleted once created.
- Crashes: a spare holds only its header.  After a kill -9 or a power loss it is an empty
  newest segment (or a file without a complete header, removed) and start-up recovers the
  segments before it as if it were not there (``WriterJournal.open``); a graceful stop
  deletes it.  Durability is unchanged: the folder is fsynced with the first batch synced
  in the spare (``sync.new_file()`` when it is taken), as for a segment created on the loop.

Pure Python: its verbs run once per rotation, never per put.
"""

from __future__ import annotations

import asyncio
import os
import time
from concurrent.futures import CancelledError, Future
from typing import Any

import structlog

from kestreld.journal import codec
from kestreld.journal.clock import now_ms
from kestreld.journal.files import segment_name

log = structlog.get_logger("kestreld.journal")

#: A rotation this soon after the previous one prepares a spare; a spare not taken for this
#: long is dropped.
KEEP_SECONDS = 5.0


class SpareSegment:
    """One segment file being created (or created) by a worker thread."""

    __slots__ = ("stamp", "path", "future")

    def __init__(self, stamp: int, path: str, future: Future) -> None:
        self.stamp = stamp
        self.path = path
        self.future = future  # the descriptor, header written; or the error

    def ready(self) -> bool:
        """Created, its header written: the rotation may take it."""
        future = self.future
        return future.done() and not future.cancelled() and future.exception() is None


class SpareSegments:
    """One writer journal's spare: when to prepare it, taking it, dropping it."""

    __slots__ = ("writer", "spare", "reserved", "rotated_at", "timer", "taken", "missed")

    def __init__(self, writer: Any) -> None:
        self.writer = writer  # the WriterJournal owning this (compiled or not: Any)
        self.spare: SpareSegment | None = None
        #: The greatest stamp handed out, to a spare or a segment: the next is greater.
        self.reserved = 0
        self.rotated_at = -KEEP_SECONDS  # monotonic time of the last rotation
        self.timer: asyncio.TimerHandle | None = None  # drops an unused spare
        self.taken = 0  # rotations that took the spare
        self.missed = 0  # rotations that found it not ready

    def stamp_after(self, stamp: int) -> int:
        """A new segment's stamp: now, unless that is not after ``stamp`` (the newest
        segment's) and every stamp handed out before."""
        new = max(now_ms(), stamp + 1, self.reserved + 1)
        self.reserved = new
        return new

    def take(self) -> SpareSegment | None:
        """The spare for the rotation under way, if it is ready: its descriptor is
        ``spare.future.result()``.  One not ready is dropped (deleted once created)."""
        spare, self.spare = self.spare, None
        if spare is None:
            return None
        if spare.ready():
            self.taken += 1
            return spare
        self.missed += 1
        _drop(spare, self.writer.executor)
        return None

    def rotated(self) -> None:
        """A rotation happened: if the previous one was recent, prepare the next segment."""
        now = time.monotonic()
        recent = now - self.rotated_at < KEEP_SECONDS
        self.rotated_at = now
        if recent and self.spare is None:
            self.prepare()

    def prepare(self) -> None:
        """Have a worker thread create the next segment (no event loop, no executor, a
        closed journal or a full descriptor budget: none)."""
        writer = self.writer
        executor = writer.executor
        if executor is None or writer.closed or not writer.segments:
            return
        handles = writer.handles
        if handles is not None and handles.max_journals is not None:
            if len(handles) >= handles.max_journals:
                return  # a spare's descriptor would close another queue's
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # offline tools: no loop to keep free
        stamp = self.stamp_after(writer.segments[-1].stamp)
        path = os.path.join(writer.folder, segment_name(writer.queue, stamp))
        try:
            future = executor.submit(create_segment, path)
        except RuntimeError:
            return  # the executor is shut down: the server is stopping
        self.spare = SpareSegment(stamp, path, future)
        if self.timer is None:
            self.timer = loop.call_later(KEEP_SECONDS, self._expire)

    def _expire(self) -> None:
        """The keep time is up: drop the spare unless a rotation came meanwhile."""
        self.timer = None
        if self.spare is None:
            return
        left = self.rotated_at + KEEP_SECONDS - time.monotonic()
        if left > 0:
            self.timer = asyncio.get_running_loop().call_later(left, self._expire)
            return
        self.drop()

    def drop(self) -> None:
        """Delete the spare (off the loop when a worker thread is there to do it)."""
        spare, self.spare = self.spare, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if spare is not None:
            _drop(spare, self.writer.executor)

    def close(self) -> None:
        """The journal closes (a stop, a delete): the spare is deleted before this returns
        (one being created is waited for, as a delete's other files are unlinked here)."""
        spare, self.spare = self.spare, None
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if spare is not None:
            try:
                spare.future.exception()  # waits until it is made (or failed)
            except CancelledError:
                return  # never made: the executor was shut down first
            _remove_created(spare.future, spare.path)

    def open_count(self) -> int:
        """Descriptors the spare holds (or is about to)."""
        return 1 if self.spare is not None else 0


def create_segment(path: str) -> int:
    """Create the segment at ``path`` with its header; its descriptor (a worker thread's
    spare, or the writer's own rotation when no spare is ready)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
    try:
        os.write(fd, codec.WRITER_MAGIC)
    except BaseException:
        os.close(fd)
        _unlink(path)
        raise
    return fd


def _drop(spare: SpareSegment, executor: Any) -> None:
    """Close and delete ``spare``: at once if it is created and no executor is given, on
    a worker thread otherwise (one still creating it deletes it when done)."""
    future = spare.future
    if not future.done():
        # Runs on the worker thread once the file is made (here if it was just made).
        future.add_done_callback(lambda f: _remove_created(f, spare.path))
        return
    if executor is not None:
        try:
            executor.submit(_remove_created, future, spare.path)
            return
        except RuntimeError:
            pass  # shut down: here
    _remove_created(future, spare.path)


def _remove_created(future: Future, path: str) -> None:
    if future.cancelled() or future.exception() is not None:
        return  # never created (its creator cleaned up)
    try:
        os.close(future.result())
    except OSError:
        pass
    _unlink(path)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError as e:
        if not isinstance(e, FileNotFoundError):
            log.warning("journal_spare_removal_failed", path=path, error=e.strerror)
