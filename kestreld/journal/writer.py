"""The writer journal: one queue's append-only chain of segments (libkestrel's ``Journal``).

Puts are encoded into an in-memory buffer and written in batches: one
``write`` per event-loop tick covers every put of that tick, whatever the
number of connections.  Durability follows ``sync_journal``:

- ``None``: never fsync explicitly; a put is acknowledged once written.
- ``N`` ms: fsync at most every N ms (Kestrel's PeriodicSyncFile); a put is
  acknowledged once written.
- ``0``: a put is acknowledged only after an fsync covers it.  Fsyncs run off
  the event loop and are shared (group commit): one fsync covers every batch
  written before it started.

Each put returns the :class:`Batch` it joined; callers wait on it to learn
whether the write (and fsync) succeeded.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass

import structlog

from kestreld.journal import codec
from kestreld.journal.files import segment_name

log = structlog.get_logger("kestreld.journal")

#: After a failed write, puts are refused for this long before the next attempt.
WRITE_RETRY_MS = 1000

#: Called with the seconds each fsync took (set by the metrics endpoint).
fsync_observer: Callable[[float], None] | None = None


class JournalWriteError(Exception):
    """The journal could not take a write; the put was not acknowledged."""


class Batch:
    """Puts written together; resolved once written (and fsynced when required)."""

    __slots__ = ("done", "error", "callbacks", "started", "end_segment", "end_offset")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.end_segment: Segment | None = None  # where its last put ends
        self.end_offset = 0
        self.done = False
        self.error: str | None = None
        self.callbacks: list[Callable[[Batch], None]] = []

    def add_done_callback(self, fn: Callable[[Batch], None]) -> None:
        if self.done:
            fn(self)
        else:
            self.callbacks.append(fn)

    def resolve(self, error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        callbacks, self.callbacks = self.callbacks, []
        for fn in callbacks:
            fn(self)


@dataclass(slots=True, eq=False)
class Segment:
    """One writer file.  ``first_id`` is 0 while the segment holds no put."""

    stamp: int
    path: str
    first_id: int = 0
    last_id: int = 0
    size: int = codec.MAGIC_SIZE  # logical size, including bytes still in the buffer
    written: int = codec.MAGIC_SIZE  # bytes handed to the OS
    visible: int = (
        codec.MAGIC_SIZE
    )  # bytes of successfully acknowledged batches: what readers may read
    items: int = 0
    data_bytes: int = 0


class WriterJournal:
    """The segments of one queue and the single writer appending to the newest."""

    def __init__(
        self,
        folder: str,
        queue: str,
        *,
        max_journal_size: int,
        sync_journal: int | None,
        archive_path: str | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.folder = folder
        self.queue = queue
        self.max_journal_size = max_journal_size
        self.sync_journal = sync_journal
        self.archive_path = archive_path
        self.executor = executor
        self.segments: list[Segment] = []
        self.next_id = 1
        self.rotations = 0
        self.closed = False
        self._fd = -1
        self._buf = bytearray()
        self._batch: Batch | None = None  # the batch the buffer belongs to
        self._flush_scheduled = False
        self._unsynced: list[Batch] = []  # written, waiting for an fsync (sync_journal = 0)
        self._retired_fds: list[int] = []  # rotated-out files to fsync then close
        self._dir_dirty = False
        self._syncing = False
        self._sync_timer: asyncio.TimerHandle | None = None
        self._failed_until = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._read_fds: dict[str, int] = {}

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
            seg.size = seg.written = seg.visible = size
            if size < codec.MAGIC_SIZE:
                warnings.append(f"{path}: {size}-byte segment without a complete header; removed")
                _unlink(path)
                continue
            self.segments.append(seg)
        # The newest is scanned whole (its first id is needed for the ranges below).
        if self.segments:
            warnings += self._recover_tail(self.segments[-1])
        # Every segment but the newest: the first record gives the id range.
        for seg in self.segments[:-1]:
            with open(seg.path, "rb") as f:
                head = f.read(codec.MAGIC_SIZE + codec.PUT_EXPIRY_HEADER_SIZE)
            first = codec.first_put_id(head)
            # Something other than a PUT first (unknown records): scan for it.
            seg.first_id = first if first is not None else self._first_id_slow(seg.path)
        for i, seg in enumerate(self.segments[:-1]):
            nxt = next((s.first_id for s in self.segments[i + 1 :] if s.first_id), 0)
            if seg.first_id and nxt > seg.first_id:
                seg.last_id = nxt - 1
                seg.items = nxt - seg.first_id
                seg.data_bytes = max(
                    0, seg.size - codec.MAGIC_SIZE - codec.PUT_HEADER_SIZE * seg.items
                )
            elif seg.first_id:
                # No later segment holds a put (a crash right after a rotation
                # leaves an empty newest one): only the segment itself knows.
                self._scan_range(seg)
        last = max((s.last_id for s in self.segments), default=0)
        self.next_id = max(last + 1, min_next_id, 1)
        return warnings

    def _scan_range(self, seg: Segment) -> None:
        """Learn a segment's id range by reading it whole (data skipped)."""
        with open(seg.path, "rb") as f:
            data = f.read()
        res = codec.scan(data, codec.MAGIC_SIZE, include_data=False)
        puts = [r for r in res.records if isinstance(r, codec.Put)]
        if puts:
            seg.first_id, seg.last_id = puts[0].id, max(p.id for p in puts)
            seg.items = len(puts)
            seg.data_bytes = sum(p.size for p in puts)

    def _first_id_slow(self, path: str) -> int:
        with open(path, "rb") as f:
            data = f.read(codec.MAGIC_SIZE + codec.PUT_EXPIRY_HEADER_SIZE + codec.MAX_DATA_SIZE)
        for rec in codec.scan(data, codec.MAGIC_SIZE, include_data=False, limit=1).records:
            if isinstance(rec, codec.Put):
                return rec.id
        return 0

    def _recover_tail(self, seg: Segment) -> list[str]:
        """Scan the newest segment; cut it at the last complete record."""
        with open(seg.path, "rb") as f:
            data = f.read()
        pos = codec.MAGIC_SIZE
        first = last = items = nbytes = 0
        problem = None
        while True:
            res = codec.scan(data, pos, include_data=False)
            for rec in res.records:
                if isinstance(rec, codec.Put):
                    if last and rec.id <= last:
                        problem = f"id {rec.id} after {last} at offset {rec.offset}"
                        res.pos = rec.offset
                        break
                    first = first or rec.id
                    last = rec.id
                    items += 1
                    nbytes += rec.size
            pos = res.pos
            if problem:
                break
            if res.status == codec.Status.CORRUPT:
                problem = f"corrupt record at offset {pos}: {res.problem}"
            elif res.status == codec.Status.MORE and pos < len(data):
                problem = f"torn record at offset {pos}"
            elif res.status == codec.Status.END and any(data[pos:]):
                problem = f"data after the end marker at offset {pos}"
            break
        warnings = []
        if pos < len(data):
            if problem:
                warnings.append(f"{seg.path}: {problem}; cut {len(data) - pos} bytes")
            with open(seg.path, "r+b") as f:
                f.truncate(pos)
        seg.first_id, seg.last_id, seg.items, seg.data_bytes = first, last, items, nbytes
        seg.size = seg.written = seg.visible = pos
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
        return time.monotonic() >= self._failed_until

    def put(
        self, add_time: int, data: bytes, expire_time: int = 0, error_count: int = 0
    ) -> tuple[int, Segment, int, Batch]:
        """Append a PUT; returns (id, segment, offset of the record, batch to wait on).

        Raises JournalWriteError when the journal is refusing writes.
        """
        if self.closed:
            raise JournalWriteError("journal closed")
        if not self.available():
            raise JournalWriteError("journal write failed recently; retrying shortly")
        header = codec.put_header(self.next_id, add_time, len(data), expire_time, error_count)
        length = len(header) + len(data)
        seg = self.current
        if seg is None or (
            seg.size + length > self.max_journal_size and seg.size > codec.MAGIC_SIZE
        ):
            self._rotate()
            seg = self.current
            assert seg is not None
        offset = seg.size
        id_ = self.next_id
        self.next_id += 1
        self._buf += header
        self._buf += data
        seg.size += length
        seg.items += 1
        seg.data_bytes += len(data)
        seg.first_id = seg.first_id or id_
        seg.last_id = id_
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
        batch.end_segment = seg
        batch.end_offset = seg.size
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._get_loop().call_soon(self.flush)
        return id_, seg, offset, batch

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _rotate(self) -> None:
        """Start a new segment; the old one is written out, then synced and closed."""
        self.write_buffer()
        if self._fd >= 0:
            self._retired_fds.append(self._fd)
            self._fd = -1
            self.rotations += 1
            if self.sync_journal is None:
                self._close_retired()
        stamp = int(time.time() * 1000)
        if self.segments and stamp <= self.segments[-1].stamp:
            stamp = self.segments[-1].stamp + 1
        path = os.path.join(self.folder, segment_name(self.queue, stamp))
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o644)
        try:
            os.write(fd, codec.WRITER_MAGIC)
        except OSError:
            os.close(fd)
            _unlink(path)
            raise
        self._fd = fd
        self._dir_dirty = True
        self.segments.append(Segment(stamp, path))

    def _open_current(self) -> None:
        seg = self.current
        if seg is None:
            self._rotate()
            return
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)

    def write_buffer(self) -> None:
        """Hand the buffered puts to the OS (one write); does not resolve batches."""
        if not self._buf:
            return
        if self._fd < 0:
            self._open_current()
        seg = self.current
        assert seg is not None
        buf = self._buf
        try:
            n = os.write(self._fd, buf)
            while n < len(buf):
                n += os.write(self._fd, memoryview(buf)[n:])
        except OSError as e:
            self._write_failed(seg, e)
            raise JournalWriteError(f"journal write failed: {e.strerror}") from e
        seg.written = seg.size
        self._buf = bytearray()

    def _write_failed(self, seg: Segment, e: OSError) -> None:
        """Cut the file back to its last whole record and refuse puts for a while."""
        log.error("journal_write_failed", queue=self.queue, path=seg.path, error=e.strerror)
        try:
            os.ftruncate(self._fd, seg.written)
        except OSError:
            pass
        lost = len(self._buf)
        self._buf = bytearray()
        seg.size = seg.written
        # Those puts' batch fails now: when the write came from a rotation or a
        # read-behind, flush() would later find an empty buffer and acknowledge it.
        batch, self._batch = self._batch, None
        if batch is not None:
            batch.resolve(f"journal write failed: {e.strerror}")
        # The ids of the failed batch are gone from disk; the segment keeps its range.
        self._failed_until = time.monotonic() + WRITE_RETRY_MS / 1000
        log.warning("journal_batch_dropped", queue=self.queue, bytes=lost)

    def flush(self) -> None:
        """Write this tick's batch and acknowledge it (now, or after its fsync)."""
        self._flush_scheduled = False
        batch, self._batch = self._batch, None
        if batch is None:
            return
        try:
            self.write_buffer()
        except JournalWriteError as e:
            batch.resolve(str(e))
            return
        if self.sync_journal == 0:
            self._unsynced.append(batch)
            self._start_sync()
            return
        self._acknowledge(batch)
        if self.sync_journal is not None and self._sync_timer is None and not self._syncing:
            self._sync_timer = self._get_loop().call_later(
                self.sync_journal / 1000, self._periodic_sync
            )

    def _acknowledge(self, batch: Batch) -> None:
        """The batch is safe: readers may now read it, then its waiters learn so."""
        end = batch.end_segment
        if end is not None and not batch.done:
            for seg in self.segments:
                if seg is end:
                    seg.visible = max(seg.visible, batch.end_offset)
                    break
                seg.visible = seg.size  # a batch spanning a rotation
        batch.resolve()

    def _periodic_sync(self) -> None:
        self._sync_timer = None
        self._start_sync()

    def _start_sync(self) -> None:
        """Group commit: one fsync (off the loop) covers every batch written so far."""
        if self._syncing:
            return
        waiting, self._unsynced = self._unsynced, []
        fds = self._retired_fds + ([self._fd] if self._fd >= 0 else [])
        retired, self._retired_fds = self._retired_fds, []
        dir_dirty, self._dir_dirty = self._dir_dirty, False
        if not fds and not waiting:
            return
        self._syncing = True
        loop = self._get_loop()
        started = time.perf_counter()
        fut = loop.run_in_executor(
            self.executor, _sync_files, fds, retired, self.folder if dir_dirty else None
        )
        fut.add_done_callback(lambda f: self._sync_done(f, waiting, started))

    def _sync_done(self, fut: asyncio.Future, waiting: list[Batch], started: float) -> None:
        self._syncing = False
        if fsync_observer is not None:
            fsync_observer(time.perf_counter() - started)
        error = None
        exc = fut.exception()
        if exc is not None:
            error = f"journal fsync failed: {getattr(exc, 'strerror', None) or exc}"
            log.error("journal_fsync_failed", queue=self.queue, error=str(exc))
            self._failed_until = time.monotonic() + WRITE_RETRY_MS / 1000
        for batch in waiting:
            if error is None:
                self._acknowledge(batch)
            else:
                batch.resolve(error)
        if self._unsynced or (self.sync_journal == 0 and self._retired_fds):
            self._start_sync()

    def _close_retired(self) -> None:
        for fd in self._retired_fds:
            _close(fd)
        self._retired_fds = []

    def sync_now(self) -> None:
        """Write and fsync everything on the calling thread, then acknowledge it (shutdown)."""
        batch, self._batch = self._batch, None
        error = None
        try:
            self.write_buffer()
        except JournalWriteError as e:
            error = str(e)
        fds = self._retired_fds + ([self._fd] if self._fd >= 0 else [])
        try:
            _sync_files(fds, self._retired_fds, self.folder if self._dir_dirty else None)
        except OSError as e:
            log.error("journal_fsync_failed", queue=self.queue, error=str(e))
        self._retired_fds = []
        self._dir_dirty = False
        pending, self._unsynced = self._unsynced, []
        if batch is not None:
            pending.append(batch)
        for b in pending:
            if error is None:
                self._acknowledge(b)
            else:
                b.resolve(error)

    @property
    def syncing(self) -> bool:
        """An fsync is running in the background."""
        return self._syncing

    def close(self) -> None:
        """Flush, fsync and close every file.  Safe to call twice."""
        if self.closed:
            return
        self.sync_now()
        self.closed = True
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        if self._fd >= 0:
            _close(self._fd)
            self._fd = -1
        for fd in self._read_fds.values():
            _close(fd)
        self._read_fds.clear()

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
        """Complete PUTs from ``seg`` at ``offset``, about ``max_bytes`` worth.

        Returns (puts with file offsets, next offset, problem).  Only acknowledged
        puts are read (``seg.visible``): a put whose batch is pending or failed is
        not, so readers never see an item its producer was not told is stored.
        """
        end = seg.visible
        if offset >= end:
            return [], offset, None
        fd = self._read_fds.get(seg.path)
        if fd is None:
            fd = os.open(seg.path, os.O_RDONLY)
            self._read_fds[seg.path] = fd
        want = max(64 * 1024, max_bytes)
        while True:
            n = min(want, end - offset)
            data = os.pread(fd, n, offset)
            res = codec.scan(data, 0)
            puts = [r for r in res.records if isinstance(r, codec.Put)]
            for p in puts:
                p.offset += offset  # file offsets
            if res.status == codec.Status.CORRUPT:
                return (
                    puts,
                    offset + res.pos,
                    f"corrupt record at offset {offset + res.pos}: {res.problem}",
                )
            if res.status == codec.Status.END:
                return puts, end, None
            if res.records or len(data) < n:
                if not res.records and len(data) < n:
                    return [], offset, f"short read at offset {offset}"
                return puts, offset + res.pos, None
            if n >= end - offset:
                # Not even one whole record up to the written end.
                return [], offset, f"torn record at offset {offset}"
            want *= 4

    def release_reader_fd(self, seg: Segment) -> None:
        fd = self._read_fds.pop(seg.path, None)
        if fd is not None:
            _close(fd)

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
            self.release_reader_fd(seg)
            removed.append(seg.path)
        return removed

    def erase(self) -> None:
        """Close and delete every segment (the queue was deleted)."""
        self._buf = bytearray()
        if self._batch is not None:
            self._batch.resolve("queue deleted")
            self._batch = None
        self.close()
        for seg in self.segments:
            _unlink(seg.path)
        self.segments = []


def _sync_files(fds: list[int], close_after: list[int], folder: str | None) -> None:
    """fsync files (and a folder after a new file appeared in it); then close retired ones."""
    try:
        for fd in fds:
            os.fsync(fd)
        if folder is not None:
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
    finally:
        for fd in close_after:
            _close(fd)


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
