"""The writer journal: one queue's append-only chain of segments (libkestrel's ``Journal``).

Puts are encoded into an in-memory buffer and written in batches (group
commit): one ``write`` per event-loop tick covers every put of that tick,
whatever the number of connections, and the same tick appends each reader's
confirms to its progress file (:mod:`kestreld.journal.progress`).  When the
written batches are acknowledged is :mod:`kestreld.journal.periodic_sync`'s
business (``sync_journal``).

Each put returns the :class:`Batch` it joined; callers wait on it to learn
whether the write (and fsync) succeeded.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from concurrent.futures import Executor

import structlog

from kestreld.journal import codec, large_write, scan
from kestreld.journal.batch import Batch
from kestreld.journal.clock import monotonic
from kestreld.journal.codec import MAGIC_SIZE
from kestreld.journal.fileio import write_chunks
from kestreld.journal.files import segment_name, unlink_quietly
from kestreld.journal.handles import HandleCache
from kestreld.journal.large_write import LargeWrites
from kestreld.journal.periodic_sync import PeriodicSync
from kestreld.journal.progress import ProgressLog
from kestreld.journal.segment import Segment, SegmentReader
from kestreld.journal.spare import SpareSegments, create_segment
from kestreld.journal.tick import Flushing, Tick

log = structlog.get_logger("kestreld.journal")


#: A segment rotates past max_journal_size; a configured size above this (no file grows
#: to 4 EiB) is taken as this, so the compiled writer compares C integers.
ROTATE_CAP = 1 << 62

#: A tick's buffer of at least this many bytes is written by a worker thread (large_write.py).
LARGE_WRITE_BYTES = large_write.LARGE_WRITE_BYTES

#: A put of at least this size is handed to a worker thread as it is made (later puts then
#: overtake it): see large_write.py.
OVERTAKE_BYTES = large_write.OVERTAKE_BYTES


class JournalWriteError(Exception):
    """The journal could not take a write; the put was not acknowledged."""


class WriterJournal(Flushing):
    """The segments of one queue and the single writer appending to the newest."""

    __slots__ = (
        "folder",
        "queue",
        "max_journal_size",
        "archive_path",
        "executor",
        "segments",
        "next_id",
        "rotations",
        "closed",
        "_fd",
        "_buf",
        "_buf_size",
        "_batch",
        "_flush_scheduled",
        "_loop",
        "tick",
        "_call_soon",
        "_flush_bound",
        "reader",
        "_progress",
        "sync",
        "put_id",
        "put_segment",
        "put_offset",
        "_fresh_segment",
        "large",
        "_overtaking",
        "_early",
        "spare",
        "handles",
        "cached",
        "used",
        "logs",
        "changed",
    )

    def __init__(
        self,
        folder: str,
        queue: str,
        *,
        max_journal_size: int,
        sync_journal: int | None,
        archive_path: str | None = None,
        executor: Executor | None = None,
        tick: Tick | None = None,
        handles: HandleCache | None = None,
    ) -> None:
        self.folder = folder
        self.queue = queue
        self.max_journal_size = min(max_journal_size, ROTATE_CAP)
        self.archive_path = archive_path
        self.executor = executor
        self.segments: list[Segment] = []
        self.next_id = 1
        self.rotations = 0
        self.closed = False
        self._fd = -1
        #: This tick's records, not copied: each put's header and data (one writev).
        self._buf: list[bytes] = []
        self._buf_size = 0
        self._batch: Batch | None = None  # the batch the buffer belongs to
        self._flush_scheduled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        # loop.call_soon and self.flush, bound once (a flush is scheduled every busy tick).
        self._call_soon: Callable[..., object] | None = None
        self._flush_bound: Callable[[], None] | None = None
        #: The server's writers share one flush callback per tick (kestreld/journal/tick.py);
        #: without one (offline tools, a queue driven by hand) the writer schedules its own.
        self.tick = tick
        self.reader = SegmentReader()  # read-behind reads of every reader of the queue
        self._progress: list[ProgressLog] = []  # readers' progress logs with confirms this tick
        #: The last put's id, segment and record offset (see :meth:`put`).
        self.put_id = 0
        self.put_segment: Segment | None = None
        self.put_offset = 0
        #: An fsync failed: the next put starts a new segment (see :meth:`_sync_failed`).
        self._fresh_segment = False
        #: The large write in flight, the batches behind it, the front ends waiting for
        #: their turn (large_write.py).
        self.large = LargeWrites(self)
        #: The segment a worker thread is appending a large record to while later puts go
        #: to the next one (large_write.py sets it), else None: one comparison per put.
        self._overtaking: Segment | None = None
        #: Batches written ahead of a large put of their tick, acknowledged with the tick.
        self._early: list[Batch] = []
        #: The next segment, made ready by a worker thread while rotations are frequent.
        self.spare = SpareSegments(self)
        #: The server's descriptor budget (kestreld/journal/handles.py); None: no budget.
        self.handles = handles
        self.cached = False  # held by the budget: some descriptor may be open
        self.used = False  # written or read since the budget last passed it over
        #: The progress files of this queue's readers (closed with the segment when idle).
        self.logs: list[ProgressLog] = []
        #: On the tick's changed list: the next checkpoint round visits this queue.
        self.changed = False
        self.sync = PeriodicSync(
            queue,
            folder,
            sync_journal,
            executor,
            self._acknowledge,
            lambda: self._fd,
            self._sync_failed,
        )

    @property
    def sync_journal(self) -> int | None:
        return self.sync.sync_journal

    @sync_journal.setter
    def sync_journal(self, value: int | None) -> None:
        self.sync.sync_journal = value

    # --- start-up ---------------------------------------------------------------------

    def open(self, segment_paths: list[tuple[int, str]], min_next_id: int = 1) -> list[str]:
        """Adopt existing segments (oldest first); returns warnings about what was cut.

        Reads the first record of every segment (for its first id) and scans
        the newest whole, cutting a torn or corrupt tail at the last complete
        record.  The backlog itself is not read.
        """
        warnings: list[str] = []
        for stamp, path in segment_paths:
            seg = Segment(stamp, path)
            try:
                size = os.path.getsize(path)
            except OSError as e:
                warnings.append(f"{path}: cannot read ({e.strerror}); skipped")
                continue
            seg.opened(size)
            if size < codec.MAGIC_SIZE:
                warnings.append(f"{path}: {size}-byte segment without a complete header; removed")
                unlink_quietly(path)
                continue
            with open(path, "rb") as f:
                magic = f.read(codec.MAGIC_SIZE)
            if magic != codec.WRITER_MAGIC:
                # The header is fsynced with the segment's first batch: a header that never
                # reached the disk (a power loss left zeros) means nothing in it was acknowledged.
                warnings.append(f"{path}: segment header never reached the disk; removed")
                unlink_quietly(path)
                continue
            self.segments.append(seg)
        # The newest is scanned whole (its first id is needed for the ranges below), and so
        # is the one before: a large record may have been written to it by a worker thread
        # while later puts went to the newest (a crash then leaves it torn).  Segments
        # holding only their header after those (a spare made ready for the next rotation,
        # spare.py, or a rotation just before a crash) do not count: they are empty.
        holding = [i for i, seg in enumerate(self.segments) if seg.size > codec.MAGIC_SIZE]
        first = holding[-2] if len(holding) >= 2 else 0
        for seg in self.segments[first:]:
            warnings += scan.recover_tail(seg)
        scan.learn_ranges(self.segments[:first], self.segments)
        last = max((s.last_id for s in self.segments), default=0)
        self.next_id = max(last + 1, min_next_id, 1)
        return warnings

    # --- writing ----------------------------------------------------------------------

    @property
    def current(self) -> Segment | None:
        return self.segments[-1] if self.segments else None

    @property
    def last_id(self) -> int:
        return self.next_id - 1

    @property
    def total_size(self) -> int:
        return sum(s.size for s in self.segments)

    def available(self) -> bool:
        """False while puts are refused after a failed write (retried every second)."""
        failed_until = self.sync.failed_until
        # No clock read per put unless a write ever failed.
        return not failed_until or monotonic() >= failed_until

    def put(self, add_time: int, data: bytes, expire_time: int = 0, error_count: int = 0) -> Batch:
        """Append a PUT; returns the batch to wait on.  Its id, segment and the record's
        offset are ``put_id``, ``put_segment`` and ``put_offset`` until the next put (C
        fields when compiled: no tuple and no int objects per put).

        Raises JournalWriteError when the journal is refusing writes.
        """
        if self.closed:
            raise JournalWriteError("journal closed")
        if not self.available():
            raise JournalWriteError("journal write failed recently; retrying shortly")
        id_ = self.next_id
        size = len(data)
        header = codec.put_header(id_, add_time, size, expire_time, error_count)
        length = len(header) + size
        segments = self.segments
        seg = segments[-1] if segments else None
        if (
            seg is None
            or (seg.size + length > self.max_journal_size and seg.size > MAGIC_SIZE)
            or self._fresh_segment
        ):
            large = self.large.write
            if large is not None and large.segment is not seg:
                # At most the newest two segments may have a write in flight (recovery scans
                # both): this one fills up while the large write goes on (rare).
                self.large.wait()
            self._rotate()
            seg = self.segments[-1]
        elif self._overtaking is seg:
            # A worker thread is appending a large record to this segment: the puts that come
            # meanwhile start the next one, written (and acknowledged) without waiting for it.
            self._rotate()
            seg = self.segments[-1]
        overtaken = size >= OVERTAKE_BYTES and self.large.may_overtake()
        if overtaken and self._batch is not None:
            # This tick's earlier puts are written now, a batch of their own (acknowledged
            # with the tick): they do not wait for the large record's write.
            self.write_buffer()
            self._early.append(self._batch)
            self._batch = None
        offset = seg.size
        self.next_id = id_ + 1
        buf = self._buf
        buf.append(header)
        buf.append(data)
        self._buf_size += length
        seg.appended(id_, length, size)
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
            batch.behind = self.large.ahead
        batch.end_segment = seg
        batch.end_offset = offset + length
        if not self._flush_scheduled:
            self._schedule_flush()
        self.put_id = id_
        self.put_segment = seg
        self.put_offset = offset
        if overtaken:
            # To the worker thread now: the puts that follow, in this tick too, start the
            # next segment and do not wait for it.
            self._batch = None
            error = self.large.start(batch)
            if error is not None:
                raise JournalWriteError(error)
        return batch

    def join(self, progress: ProgressLog) -> None:
        """A reader's confirms go out with this tick's write (and share its fsync)."""
        if progress not in self._progress:
            self._progress.append(progress)
        self._schedule_flush()

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            tick = self.tick
            if tick is not None:
                self._flush_scheduled = True
                if not tick.add(self):
                    self.flush()  # no event loop runs: write now
                return
            if self._call_soon is None:
                loop = self._loop
                if loop is None:
                    try:
                        loop = self._loop = asyncio.get_running_loop()
                    except RuntimeError:
                        # Driven outside an event loop (offline tools, tests): write now.
                        self.flush()
                        return
                self._call_soon = loop.call_soon
                self._flush_bound = self.flush
            self._flush_scheduled = True
            self._call_soon(self._flush_bound)

    def retire(self, fd: int) -> None:
        """A progress file descriptor no longer written: closed once no fsync can use it."""
        if fd < 0:
            return
        if self.closed:
            _close(fd)
        else:
            self.sync.retire(fd)

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _rotate(self) -> None:
        """Start a new segment; the old one is written out, then synced and closed."""
        abandoned = self._fresh_segment
        self._fresh_segment = False
        seg = self.current
        if abandoned and seg is not None and seg.visible <= MAGIC_SIZE:
            self._restart(seg)
            return
        self.write_buffer()
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            if not self.large.retire(fd):  # else retired once the large write is done
                self.sync.retire(fd)
            self.rotations += 1
        self._admit()
        spare = self.spare.take()
        if spare is not None:
            # Created and its header written by a worker thread (spare.py): no file system
            # call here, where creating a file can take milliseconds under write-back.
            stamp, path, fd = spare.stamp, spare.path, spare.future.result()
        else:
            stamp = self.spare.stamp_after(self.segments[-1].stamp if self.segments else 0)
            path = os.path.join(self.folder, segment_name(self.queue, stamp))
            fd = create_segment(path)
        self._fd = fd
        self.sync.new_file()  # its name is fsynced with its first batch, spare or not
        self.segments.append(Segment(stamp, path))
        if not abandoned:  # a failing disk is no reason to make files ahead
            self.spare.rotated()

    def _restart(self, seg: Segment) -> None:
        """Start the abandoned segment ``seg`` again, empty: it holds no acknowledged put.

        An outage of failing fsyncs abandons a segment every time puts are tried again
        (once a second while a client keeps sending): without this, each would leave a
        file holding only its header.  Truncating drops every page of the file, those
        whose writeback failed included, so nothing written from here on can sit behind
        a hole; the file (the same inode: a read-behind's descriptor stays good) gets its
        header again, and the refused puts' ids stay spent, as in a new segment.
        """
        self._admit()
        fd = os.open(seg.path, os.O_WRONLY | os.O_TRUNC | os.O_APPEND)
        try:
            os.write(fd, codec.WRITER_MAGIC)
        except OSError:
            os.close(fd)
            raise
        self._fd = fd
        self.sync.new_file()  # its name may not be on disk: the fsync of the folder failed too
        seg.restarted()
        log.info("journal_segment_restarted", queue=self.queue, path=seg.path)

    def _open_current(self) -> None:
        seg = self.current
        if seg is None:
            self._rotate()
            return
        self._admit()
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)

    def write_buffer(self) -> None:
        """Hand the buffered puts to the OS (one write); does not resolve batches."""
        if not self._buf:
            return
        large = self.large.write
        if large is not None and large.segment is self.segments[-1]:
            self.large.wait()  # the file is appended to in order: the large write first
        if self._fd < 0:
            self._open_current()
        seg = self.segments[-1]
        try:
            write_chunks(self._fd, self._buf, self._buf_size)
        except OSError as e:
            self._write_failed(seg, e)
            raise JournalWriteError(f"journal write failed: {e.strerror}") from e
        seg.wrote()
        # Written synchronously: a new list for the next tick's puts (compiled, del [:] makes
        # a slice object, and clear() is a method call; nothing else holds this list).
        self._buf = []
        self._buf_size = 0

    def _write_failed(self, seg: Segment, e: OSError) -> None:
        """Cut the file back to its last whole record and refuse puts for a while."""
        log.error("journal_write_failed", queue=self.queue, path=seg.path, error=e.strerror)
        try:
            os.ftruncate(self._fd, seg.written)
        except OSError:
            pass
        lost = self._buf_size
        self._buf = []
        self._buf_size = 0
        seg.unbuffered()
        # Those puts' batch fails now: when the write came from a rotation or a
        # read-behind, flush() would later find an empty buffer and acknowledge it.
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.resolve(f"journal write failed: {e.strerror}")
        # The ids of the failed batch are gone from disk; the segment keeps its range.
        self.sync.refuse_writes()
        log.warning("journal_batch_dropped", queue=self.queue, bytes=lost)

    def _sync_failed(self, error: str) -> None:
        """An fsync failed: give up the segment's unacknowledged tail and the segment.

        What was written since the last good fsync may never reach the disk (the
        kernel marks those pages clean and may drop them), so a put appended after
        it would sit behind a hole: cut with it when the segment is recovered, or
        skipped with it by a reader.  Every batch not yet acknowledged has failed
        (the sync resolved those it held; the tick's buffer fails here), the file
        is cut back to its acknowledged end, and the next put starts a new segment.
        """
        self.large.abandon(error)
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.resolve(error)
        early, self._early = self._early, []
        for batch in early:  # written ahead of a large put, after the failed fsync's start
            batch.resolve(error)
        lost = self._buf_size
        self._buf = []
        self._buf_size = 0
        seg = self.current
        if seg is not None:
            seg.unbuffered()  # the buffered puts were never written
        fd, self._fd = self._fd, -1
        if fd >= 0 and seg is not None:
            end = max(seg.visible, MAGIC_SIZE)
            if seg.written > end:
                try:
                    os.ftruncate(fd, end)
                    lost += seg.written - end
                    seg.cut_to(end)
                except OSError:
                    pass  # readers stop at ``visible``; recovery cuts what is left
            _close(fd)
        if seg is not None:
            self._fresh_segment = True
        log.warning("journal_segment_abandoned", queue=self.queue, bytes=lost, error=error)
        # The batches stored behind a large one are safe (STORED was sent): they resolve.
        self.large.ahead_resolved()

    def flush(self) -> None:
        """Write this tick's puts and confirms; acknowledge them now, or after one fsync."""
        self._flush_scheduled = False
        written = self._write_tick()
        if written and self.sync.written(written):
            for batch in written:
                self._acknowledge(batch)

    def _write_tick(self) -> list[Batch]:
        """One write for the puts, one append per reader with confirms; the batches written."""
        if self._batch is None and not self._progress and not self._early:
            return []  # nothing this tick (a shutdown's sync of an idle queue)
        if not self.cached:
            self._admit()  # its descriptors may open now
        self.used = True
        if not self.changed:
            self.mark_changed()
        written, self._early = self._early, []  # _early: written in put(), see there
        batch = self._batch
        large_buffer = self._buf_size >= LARGE_WRITE_BYTES and self.executor is not None
        # While a large write is in flight, puts go to the next segment and are written now;
        # another large buffer waits until the first large batch resolved (ahead_resolved):
        # at most one at a time, in the newest two segments (what recovery scans).
        large = self.large.write
        if (
            batch is not None
            and (large is None or large.segment is not self.segments[-1])
            and (not large_buffer or self.large.idle())
        ):
            self._batch = None
            if large_buffer:
                try:
                    self.large.start(batch)  # a failure fails the batch
                except JournalWriteError as e:  # written here: no event loop runs
                    batch.resolve(str(e))
            else:
                try:
                    self.write_buffer()
                    written.append(batch)
                except JournalWriteError as e:
                    batch.resolve(str(e))
        if not self._progress:
            return written  # no confirms this tick
        progress, self._progress = self._progress, []
        for log_ in progress:
            done = log_.write()
            if done is not None:
                written.append(done)
                self.sync.wrote_to(log_.fd)
                if log_.take_created():  # found by test_power_loss.py: the name must be fsynced too
                    self.sync.new_file()
        return written

    def take_buffer(self) -> tuple[int, Segment, list[bytes], int]:
        """The buffered puts, handed over to be written elsewhere (a worker thread): the
        current segment's descriptor, the segment, the chunks and their size."""
        if self._fd < 0:
            self._open_current()
        chunks, size = self._buf, self._buf_size
        self._buf = []
        self._buf_size = 0
        return self._fd, self.segments[-1], chunks, size

    @property
    def buffered(self) -> int:
        """Bytes of puts buffered this tick, not written yet."""
        return self._buf_size

    def flush_pending(self) -> bool:
        """Puts of this tick wait (behind a large write): their flush is scheduled; True."""
        if self._batch is None:
            return False
        self._schedule_flush()
        return True

    def _acknowledge(self, batch: Batch) -> None:
        """The batch is safe: readers may now read it, then its waiters learn so.

        A batch made behind an unresolved large batch (``behind``) is stored: its bytes
        become readable and its puts' replies may go, but it resolves (its items reach
        the readers) only after that batch, so that items keep journal order.
        """
        if batch.done:
            return
        ahead = batch.behind
        if ahead is not None and ahead.done:
            ahead = None
        end = batch.end_segment
        if end is not None:
            # Behind the large batch, segments up to its own are not this batch's to open.
            skip = ahead.end_segment if ahead is not None else None
            for seg in self.segments:
                if seg is end:
                    seg.acknowledged(batch.end_offset)
                    break
                if skip is not None:
                    if seg is skip:
                        skip = None
                    continue
                seg.acknowledged(seg.size)  # a batch spanning a rotation
        if ahead is not None:
            self.large.defer(batch)
            return
        batch.resolve()
        if batch is self.large.ahead:
            self.large.ahead_resolved()

    def sync_now(self) -> None:
        """Write and fsync everything on the calling thread, then acknowledge it (shutdown)."""
        self._flush_scheduled = False
        self.large.wait()
        self.sync.sync_now(self._write_tick())

    def write_now(self) -> list[Batch]:
        """Write everything buffered without an fsync; the batches written (shutdown: one
        sync of the file system then covers every queue, see :meth:`synced`)."""
        self._flush_scheduled = False
        return self._write_tick()

    def synced(self, written: list[Batch], error: str | None) -> None:
        """The file system holding the journal was synced (``error``: it failed) after
        ``written`` (from :meth:`write_now`): acknowledge them and every batch waiting."""
        self.sync.synced(written, error)

    @property
    def syncing(self) -> bool:
        """An fsync is running in the background."""
        return self.sync.syncing

    def close(self) -> None:
        """Flush, fsync and close every file.  Safe to call twice."""
        if self.closed:
            return
        self.sync_now()
        self.closed = True
        self.spare.close()  # never taken: deleted (after a crash it would be an empty segment)
        self.large.free()  # a held large put learns its queue is gone
        self.sync.close()
        if self._fd >= 0:
            _close(self._fd)
            self._fd = -1
        self.reader.close()
        if self.handles is not None:
            self.handles.release(self)

    def mark_changed(self) -> None:
        """The next checkpoint round visits this queue (its readers' state may have moved)."""
        if self.changed:
            return
        self.changed = True
        tick = self.tick
        if tick is not None:
            tick.changed.append(self)

    # --- descriptors (the server's budget) --------------------------------------------

    def _admit(self) -> None:
        """A descriptor opens: the budget holds this journal (and may close idle ones)."""
        if self.handles is not None and not self.closed:
            self.handles.admit(self)
        else:
            self.cached = True

    def idle(self) -> bool:
        """Nothing in flight: no buffered put or confirm, no flush due, no fsync pending."""
        if (
            self._buf
            or self._batch is not None
            or self._flush_scheduled
            or self._progress
            or self._early
        ):
            return False
        if not self.large.idle():
            return False  # a worker thread is writing to the segment's descriptor
        if not self.sync.idle():
            return False
        return all(log_.idle() for log_ in self.logs)

    def close_handles(self) -> bool:
        """Close every descriptor when idle (the budget's eviction); False when busy.

        The next write reopens the segment in append mode (its size is known, nothing is
        lost) and the progress files likewise; read-behind reopens what it reads.
        """
        if self.closed or not self.idle():
            return False
        fd, self._fd = self._fd, -1
        if fd >= 0:
            _close(fd)
        self.spare.drop()  # an idle journal keeps no spare (deleted off the loop)
        for log_ in self.logs:
            log_.close_handle()
        self.sync.close_retired()
        self.reader.close()
        self.cached = False
        return True

    def open_handles(self) -> int:
        """Descriptors this journal holds now (its segment, progress files, read-behind)."""
        count = self.reader.open_count() + sum(1 for log_ in self.logs if log_.fd >= 0)
        return count + (1 if self._fd >= 0 else 0) + self.spare.open_count()

    # --- reading back (read-behind) ---------------------------------------------------

    def following(self, seg: Segment) -> Segment | None:
        """The segment after ``seg``; None only when ``seg`` is the newest.

        Works for a segment already retired from the list, so a reader that
        finished a dead segment moves on instead of believing it caught up.
        """
        for s in self.segments:
            if s.stamp > seg.stamp:
                return s
        return None

    def segment_for(self, id_: int) -> Segment | None:
        """The oldest segment that may hold ``id_`` or a later id."""
        chosen = None
        for s in self.segments:
            if s.first_id and s.first_id <= id_:
                chosen = s
            elif chosen is None:
                chosen = s
        return chosen

    def read(
        self, seg: Segment, offset: int, max_bytes: int
    ) -> tuple[list[codec.Put], int, str | None]:
        """Acknowledged PUTs of ``seg`` from ``offset`` (see :meth:`SegmentReader.read`)."""
        if not self.cached:
            self._admit()
        self.used = True
        if not self.changed:
            self.mark_changed()  # read-behind moved: segments behind it may be retired
        return self.reader.read(seg, offset, max_bytes)

    def unread(self, head: int, done: set[int], held: set[int]) -> tuple[int, int, list[codec.Put]]:
        """What a reader restored at ``head`` has left: (items, data bytes, held puts);
        see :func:`kestreld.journal.scan.unread`."""
        return scan.unread(self.segments, head, done, held)

    def reconfigure(
        self, max_journal_size: int, sync_journal: int | None, archive_path: str | None
    ) -> None:
        """A reloaded config: the next rotation and fsync follow it."""
        self.max_journal_size = min(max_journal_size, ROTATE_CAP)
        self.sync.sync_journal = sync_journal
        self.archive_path = archive_path

    # --- dead segments ----------------------------------------------------------------

    def remove_dead(self, min_head: int, keep_from: int | None = None) -> list[str]:
        """Drop every segment but the newest whose ids are all <= min_head; returns their paths.

        Segments with a stamp >= ``keep_from`` (where a reader is still
        reading) are kept whatever the heads say.  The files themselves are
        deleted or archived by ``retire.retire_segments``, off the event loop.
        """
        removed = []
        while len(self.segments) > 1:
            seg = self.segments[0]
            if seg.last_id > min_head or (keep_from is not None and seg.stamp >= keep_from):
                break
            self.segments.pop(0)
            self.reader.release(seg)
            removed.append(seg.path)
        return removed

    def erase(self) -> None:
        """Close and delete every segment (the queue was deleted)."""
        self._buf = []
        self._buf_size = 0
        if self._batch is not None:
            self._batch.resolve("queue deleted")
            self._batch = None
        self.close()
        for seg in self.segments:
            unlink_quietly(seg.path)
        self.segments = []


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
