"""A reader's progress file: its checkpoint plus the confirms appended since.

``<queue>.read.<reader>`` starts as a libkestrel checkpoint (magic, READ_HEAD,
READ_DONE).  Every confirm (and every discard, drop and expiry) is then
appended to it as one more READ_DONE record, and every flush as a READ_HEAD
jump, written in the same event-loop tick as the writer journal's batch and
synced by the same group fsync, so a confirm is acknowledged at the same
durability as a put.  libkestrel readers read a checkpoint's records in order
(the done-set is the union of the READ_DONE ids above the last READ_HEAD), so
the file stays readable by every decoder of the format.

Every ``checkpoint_interval`` the file is compacted: the reader's state is
rewritten whole into ``<file>~~<ms>``, fsynced and renamed over the file (the
atomic rewrite).  While that runs, appends wait (their confirms are
acknowledged right after), so nothing appended can be lost to the rename.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import structlog

from kestreld.journal import codec
from kestreld.journal.batch import Batch
from kestreld.journal.fileio import write_all
from kestreld.journal.files import unlink_quietly

log = structlog.get_logger("kestreld.journal")

#: (head, done ids) of the reader's in-memory state, for a new file's first records.
StateSource = Callable[[], tuple[int, list[int]]]
#: Called once per written batch with its ids, after the batch resolved.
AckedCallback = Callable[[list[int], Batch], None]


class ProgressLog:
    """The append side of one reader's progress file (one writer: the event loop)."""

    __slots__ = (
        "path",
        "fd",
        "size",
        "acked_size",
        "_state",
        "_on_acked",
        "_pending",
        "_batch",
        "_inflight",
        "_resolved_bound",
        "_jump",
        "compacting",
        "created",
    )

    def __init__(self, path: str, state: StateSource, on_acked: AckedCallback) -> None:
        self.path = path
        self.fd = -1
        self.size = 0  # bytes of whole records in the file, where a failed append is cut back to
        self.acked_size = 0  # bytes up to the last acknowledged append, where a failed fsync cuts
        self._state = state
        self._on_acked = on_acked
        self._pending: list[int] = []  # confirmed ids not yet written
        self._batch: Batch | None = None  # the ticket of the pending ids
        self._inflight: dict[Batch, list[int]] = {}  # written, not yet acknowledged
        self._resolved_bound = self._resolved  # what every batch calls back: one bound method
        # A READ_HEAD jump not yet written: the new head and the ids below it still owed.
        self._jump: tuple[int, list[int]] | None = None
        self.compacting = False  # a rewrite runs: appends wait for it
        # The file was just created: its name is durable only once the folder is fsynced.
        self.created = False

    # --- recording ----------------------------------------------------------------------

    def record(self, id_: int) -> Batch:
        """Queue one confirmed id; the batch resolves once it is durable (or failed)."""
        self._pending.append(id_)
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
        return batch

    def jump(self, head: int, held: list[int]) -> Batch:
        """Queue a READ_HEAD jump to ``head`` (a flush, a reader starting at the tail).

        ``held``: ids at or below ``head`` that are still owed (open reads); they
        are written as negative ids after the jump.  The batch resolves once the
        jump is durable, with the confirms of the same tick.
        """
        self._jump = (head, sorted(held))
        batch = self._batch
        if batch is None:
            batch = self._batch = Batch()
        return batch

    @property
    def has_pending(self) -> bool:
        return bool(self._pending) or self._jump is not None

    def begin_rewrite(self) -> None:
        """A rewrite of the file starts: appends wait until :meth:`swap` or :meth:`rewrite_failed`."""
        self.compacting = True

    def rewrite_failed(self) -> None:
        """The rewrite did not replace the file: appends go on to the old one."""
        self.compacting = False

    def take_created(self) -> bool:
        """True once after the file was created (its name needs the folder fsynced)."""
        created, self.created = self.created, False
        return created

    def inflight_ids(self) -> list[int]:
        """Ids written to the file whose batch is not resolved yet (a rewrite keeps them)."""
        return [i for ids in self._inflight.values() for i in ids]

    # --- writing (called by the writer journal's flush) -----------------------------------

    def write(self) -> Batch | None:
        """Append the pending ids as one READ_DONE; the batch to acknowledge, or None.

        None when there is nothing to write or a rewrite is running (the ids
        wait for it).  A failed write cuts the file back to its last whole
        record and resolves the batch with the error: those confirms are not
        acknowledged and their reads stay open.
        """
        jump = self._jump
        if (not self._pending and jump is None) or self.compacting:
            return None
        ids, self._pending = self._pending, []
        batch, self._batch = self._batch, None
        assert batch is not None
        record = b""
        if jump is not None:
            self._jump = None
            record = codec.encode_read_head(jump[0])
            if jump[1]:
                record += codec.encode_read_done([-i for i in jump[1]])
        if ids:
            record += codec.encode_read_done(ids)
        try:
            if self.fd < 0:
                self._open()
            if not self.size:  # a new file (or one cut back to nothing) starts whole
                head, done = self._state()
                record = codec.encode_checkpoint(head, done) + record
            write_all(self.fd, record)
        except OSError as e:
            log.error("progress_write_failed", path=self.path, error=e.strerror)
            self._cut_back()
            batch.resolve(f"progress write failed: {e.strerror}")
            self._on_acked(ids, batch)
            return None
        self.size += len(record)
        batch.end_offset = self.size
        self._inflight[batch] = ids
        batch.add_done_callback(self._resolved_bound)
        return batch

    def _resolved(self, batch: Batch) -> None:
        end = batch.end_offset  # -1: appended to a file a rewrite has replaced since
        if end >= 0:
            if batch.error is None:
                if end > self.acked_size:
                    self.acked_size = end
            elif self.size > self.acked_size:
                # A failed fsync: those confirms may reach the disk or not, and must not
                # (the reads stay open, and are delivered again after a restart).
                self.size = self.acked_size
                self._cut_back()
        ids = self._inflight.pop(batch, None)
        if ids is not None:
            self._on_acked(ids, batch)

    def _open(self) -> None:
        self.created = not os.path.exists(self.path)
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = self.acked_size = os.fstat(self.fd).st_size

    def idle(self) -> bool:
        """No append in flight (written, its fsync or acknowledgement to come): the
        descriptor may be closed.  Pending ids and a rewrite need none: the next append
        opens the file (the new one after a rewrite)."""
        return not self._inflight

    def close_handle(self) -> None:
        """Close the descriptor (idle; the next append reopens the file at its end)."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            try:
                os.close(fd)
            except OSError:
                pass

    def _cut_back(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, self.size)
        except OSError:
            pass

    # --- compaction -----------------------------------------------------------------------

    def swap(self) -> int:
        """The rewrite was renamed over the file: append to the new one from now on.

        Returns the old descriptor (or -1): the caller closes it once no fsync
        can still be running on it.
        """
        old, self.fd = self.fd, -1
        self.compacting = False
        for batch in self._inflight:
            batch.end_offset = -1  # offsets in the old file: nothing to cut in the new one
        return old

    def close(self) -> int:
        """Stop appending (the reader is gone); returns the descriptor to close (or -1)."""
        old, self.fd = self.fd, -1
        batch, self._batch = self._batch, None
        ids, self._pending = self._pending, []
        self._jump = None
        if batch is not None:
            # The reader (its queue) was deleted: nothing is left to deliver again,
            # so its last confirms stand (no SERVER_ERROR for a close racing a delete).
            batch.resolve()
            self._on_acked(ids, batch)
        return old


class FolderNotSynced(OSError):
    """The rewrite was renamed over the file, but the folder's fsync failed.

    The new file is the one under the name from now on (appends must go to
    it); only a power loss could still bring the old one back, until a later
    fsync of the folder succeeds.
    """


def rewrite(
    path: str, head: int, done: list[int], sync_folder: bool, held: list[int] | None = None
) -> None:
    """Atomically replace the progress file by one READ_HEAD and one READ_DONE.

    ``held``: ids at or below the head still owed (written as negative ids).
    Blocking: runs off the event loop.  ``<file>~~<ms>`` is written, fsynced
    and renamed over the file (then the folder is fsynced, so the rename
    itself survives a power loss), so a crash leaves the old or the new file,
    never a torn one.  Raises :class:`FolderNotSynced` when only that last
    fsync failed, any other ``OSError`` when the file was not replaced.
    """
    tmp = f"{path}~~{int(time.time() * 1000)}"
    ids = sorted(done)
    if held:
        ids = [-i for i in sorted(held)] + ids  # owed below the head (see codec.decode_progress)
    data = codec.encode_checkpoint(head, ids)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError:
        # A full disk fails every interval: leave no temporary behind each time.
        unlink_quietly(tmp)
        raise
    if sync_folder:
        try:
            dfd = os.open(os.path.dirname(path) or ".", os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as e:
            raise FolderNotSynced(e.errno, e.strerror) from e
