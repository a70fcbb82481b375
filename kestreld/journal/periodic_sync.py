"""When written journal files reach the disk (libkestrel's ``PeriodicSyncFile``).

The writer journal hands each tick's written batches here; ``sync_journal``
decides when they are acknowledged:

- ``None``: at once; never fsync explicitly.
- ``N`` ms: at once; the files are fsynced at most every N ms.
- ``0``: only after an fsync covers them.  Fsyncs run off the event loop and
  are shared (group commit): one covers every batch - puts and confirms of
  every connection - written before it started.

The files synced are the current segment, segments retired by a rotation
(closed after their last fsync), the readers' progress files written since
the last fsync, and the folder after a new file appeared in it.

A failed fsync fails every batch written and not yet acknowledged (written
during it too: they lie behind what it could not write), and tells the
writer, which cuts its files back and starts a new segment.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections.abc import Callable
from concurrent.futures import Executor

import structlog

from kestreld.journal.batch import Batch

log = structlog.get_logger("kestreld.journal")

#: After a failed fsync, puts are refused for this long before the next attempt.
WRITE_RETRY_MS = 1000

#: Called with the seconds each fsync took (see :func:`observe_fsyncs`).
fsync_observer: Callable[[float], None] | None = None


def observe_fsyncs(observer: Callable[[float], None] | None) -> Callable[[float], None] | None:
    """Report every fsync's duration to ``observer`` (None: to nobody); returns the previous one."""
    global fsync_observer
    previous, fsync_observer = fsync_observer, observer
    return previous


class PeriodicSync:
    """The fsync policy of one queue's journal files."""

    __slots__ = (
        "queue",
        "folder",
        "sync_journal",
        "executor",
        "_acknowledge",
        "_current_fd",
        "failed_until",
        "_unsynced",
        "_retired_fds",
        "_fds",
        "_dir_dirty",
        "_syncing",
        "_timer",
        "_sync_again",
        "_loop",
        "_failed",
        "_dirty",
    )

    def __init__(
        self,
        queue: str,
        folder: str,
        sync_journal: int | None,
        executor: Executor | None,
        acknowledge: Callable[[Batch], None],
        current_fd: Callable[[], int],
        failed: Callable[[str], None],
    ) -> None:
        self.queue = queue
        self.folder = folder
        self.sync_journal = sync_journal
        self.executor = executor
        self._acknowledge = acknowledge  # the batch is safe: readers may see it, waiters learn
        self._current_fd = current_fd  # the segment being appended to (-1: none open)
        self._failed = failed  # an fsync failed: the writer gives up what it had not acknowledged
        self.failed_until = 0.0  # monotonic time until which writes are refused
        self._unsynced: list[Batch] = []  # written, waiting for an fsync (sync_journal = 0)
        self._retired_fds: list[int] = []  # files no longer written: fsync, then close
        self._fds: set[int] = set()  # progress files written since the last fsync
        self._dir_dirty = False
        self._syncing = False
        self._timer: asyncio.TimerHandle | None = None
        self._sync_again = False  # periodic: written during an fsync, which may not cover it
        self._loop: asyncio.AbstractEventLoop | None = None
        #: The current segment was written since its last fsync (a shutdown skips clean ones).
        self._dirty = False

    # --- what the journal reports -------------------------------------------------------

    def refuse_writes(self) -> None:
        """A write or fsync failed: refuse puts for a while before the next attempt."""
        self.failed_until = time.monotonic() + WRITE_RETRY_MS / 1000

    def written(self, batches: list[Batch]) -> bool:
        """Batches handed to the OS: True if they are safe now (the writer acknowledges
        them), False if they wait for the next fsync (acknowledged after it)."""
        if not batches:
            return False
        self._dirty = True
        if self.sync_journal == 0:
            self._unsynced += batches
            self._start()
            return False
        if self.sync_journal is not None:
            if self._syncing:
                self._sync_again = True  # the timer is armed when that fsync is done
            elif self._timer is None:
                self._arm_timer()
        return True

    def _arm_timer(self) -> None:
        assert self.sync_journal is not None
        self._timer = self._get_loop().call_later(self.sync_journal / 1000, self._periodic)

    def wrote_to(self, fd: int) -> None:
        """A progress file was appended to: the next fsync covers it."""
        if self.sync_journal is not None:
            self._fds.add(fd)

    def new_file(self) -> None:
        """A file appeared in the folder: the next fsync covers the folder too."""
        self._dir_dirty = True

    def retire(self, fd: int) -> None:
        """A file no longer written: closed once no fsync can still use it."""
        if fd < 0:
            return
        self._fds.discard(fd)
        if self.sync_journal is None and not self._syncing:
            _close(fd)
        else:
            self._retired_fds.append(fd)

    @property
    def syncing(self) -> bool:
        """An fsync is running in the background."""
        return self._syncing

    def idle(self) -> bool:
        """No fsync running, armed or owed: every written batch is acknowledged and synced
        as the policy demands (the files may be closed)."""
        return not (self._syncing or self._timer is not None or self._unsynced or self._fds)

    def close_retired(self) -> None:
        """Close the files no longer written (idle: no fsync owes them anything)."""
        for fd in self._retired_fds:
            _close(fd)
        self._retired_fds = []

    # --- syncing --------------------------------------------------------------------------

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def _periodic(self) -> None:
        self._timer = None
        self._start()

    def _take_fds(self) -> tuple[list[int], list[int], str | None]:
        current = self._current_fd() if self._dirty else -1
        self._dirty = False
        fds = self._retired_fds + ([current] if current >= 0 else []) + list(self._fds)
        retired, self._retired_fds = self._retired_fds, []
        self._fds = set()
        folder = self.folder if self._dir_dirty else None
        self._dir_dirty = False
        return fds, retired, folder

    def _start(self) -> None:
        """Group commit: one fsync (off the loop) covers every batch written so far."""
        if self._syncing:
            return
        waiting, self._unsynced = self._unsynced, []
        fds, retired, folder = self._take_fds()
        if not fds and not waiting:
            return
        self._syncing = True
        started = time.perf_counter()
        loop = self._get_loop()
        # The segment and the progress files are fsynced side by side (one thread
        # each): a file system commits concurrent fsyncs together, so a tick's
        # puts and confirms cost about one fsync's time, not one per file.
        first = loop.run_in_executor(self.executor, sync_files, fds[:1], [], folder)
        rest = [loop.run_in_executor(self.executor, sync_files, [fd], [], None) for fd in fds[1:]]
        fut = asyncio.gather(first, *rest, return_exceptions=True)
        fut.add_done_callback(lambda f: self._done(f, waiting, retired, started, folder))

    def _done(
        self,
        fut: asyncio.Future,
        waiting: list[Batch],
        retired: list[int],
        started: float,
        folder: str | None,
    ) -> None:
        self._syncing = False
        for fd in retired:
            _close(fd)
        if fsync_observer is not None:
            fsync_observer(time.perf_counter() - started)
        error = None
        exc = fut.exception() or next(
            (r for r in fut.result() if isinstance(r, BaseException)), None
        )
        if exc is not None:
            error = f"journal fsync failed: {getattr(exc, 'strerror', None) or exc}"
            log.error("journal_fsync_failed", queue=self.queue, error=str(exc))
            self.refuse_writes()
            if folder is not None:
                self._dir_dirty = True  # the folder's names are not known durable yet
            # Written during this fsync, behind what it failed to write: they fail too.
            waiting += self._unsynced
            self._unsynced = []
        for batch in waiting:
            if error is None:
                self._acknowledge(batch)
            else:
                batch.resolve(error)
        if error is not None:
            self._failed(error)
        if self._unsynced or (self.sync_journal == 0 and self._retired_fds):
            self._start()
        elif self._sync_again and self._timer is None and self.sync_journal:
            # Periodic: a write that came in during this fsync is synced a period later
            # (without this it waited for the next write, maybe forever).
            self._sync_again = False
            self._arm_timer()

    def sync_now(self, written: list[Batch]) -> None:
        """Fsync everything on the calling thread, then acknowledge it all (shutdown)."""
        fds, retired, folder = self._take_fds()
        error = None
        try:
            sync_files(fds, retired, folder)
        except OSError as e:
            error = f"journal fsync failed: {e.strerror}"
            log.error("journal_fsync_failed", queue=self.queue, error=str(e))
            if folder is not None:
                self._dir_dirty = True
        pending, self._unsynced = self._unsynced, []
        for batch in pending + written:
            if error is None:
                self._acknowledge(batch)
            else:
                batch.resolve(error)

    def synced(self, written: list[Batch], error: str | None) -> None:
        """The whole file system was synced after ``written`` (shutdown): every file of this
        journal is durable, or ``error`` says the sync failed."""
        _, retired, folder = self._take_fds()
        for fd in retired:
            _close(fd)
        if error is not None:
            log.error("journal_fsync_failed", queue=self.queue, error=error)
            if folder is not None:
                self._dir_dirty = True
        pending, self._unsynced = self._unsynced, []
        for batch in pending + written:
            if error is None:
                self._acknowledge(batch)
            else:
                batch.resolve(f"journal fsync failed: {error}")

    def close(self) -> None:
        self._sync_again = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for fd in self._retired_fds:
            _close(fd)
        self._retired_fds = []


def sync_files(fds: list[int], close_after: list[int], folder: str | None) -> None:
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


def sync_filesystem(folder: str) -> None:
    """Write out every file of the file system holding ``folder`` (Linux ``syncfs``: one
    call for thousands of queues' files instead of one fsync each; ``sync`` elsewhere).
    Raises OSError."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        syncfs = _syncfs()
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
    finally:
        os.close(fd)


def _syncfs():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syncfs
    except (OSError, AttributeError):
        return None


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
