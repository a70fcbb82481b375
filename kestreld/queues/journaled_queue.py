"""A queue: one writer journal shared by its readers (libkestrel's ``JournaledQueue``).

Every put is journaled once and offered to every reader: the default reader
``q`` (absent when the queue is ``fanout_only``) and fanout readers ``q+r``.
A ``journal = false`` queue keeps no files and lives in memory only.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import Executor

import structlog

from kestreld.config import QueueConfig, ServerConfig
from kestreld.journal.batch import Batch
from kestreld.journal.checkpoint import read_checkpoint
from kestreld.journal.files import QueueFiles
from kestreld.journal.writer import JournalWriteError, Segment, WriterJournal
from kestreld.queues.item import QueueItem
from kestreld.queues.reader import Compaction, Reader

log = structlog.get_logger("kestreld.queues")


#: A put waiting for its batch: the item, where it is, and the fanout readers
#: that were full when it was put (they drop it), or None.
_Put = tuple[QueueItem, Segment, int, "frozenset[Reader] | None"]


#: Called with (queue name, seconds since its write batch began, puts, their bytes) when
#: puts are acknowledged: the admin port's per-queue set latency and put counts.  None
#: when nobody watches.
stored_observer: Callable[[str, float, int, int], None] | None = None


class QueueFull(Exception):
    """The queue is full and does not discard old items (its fanout readers never refuse)."""


class JournaledQueue:
    __slots__ = (
        "name",
        "server_config",
        "config",
        "folder",
        "executor",
        "journal",
        "readers",
        "created_at",
        "_next_id",
        "_pending_batch",
        "_pending",
        "pending_items",
        "pending_bytes",
        "deleted",
    )

    def __init__(
        self,
        name: str,
        server_config: ServerConfig,
        *,
        executor: Executor | None = None,
    ) -> None:
        self.name = name
        self.server_config = server_config
        self.config: QueueConfig = server_config.queue(name)
        self.folder = server_config.queue_path
        self.executor = executor
        self.journal: WriterJournal | None = None
        if self.config.journal:
            self.journal = WriterJournal(
                self.folder,
                name,
                max_journal_size=self.config.max_journal_size,
                sync_journal=self.config.sync_journal,
                archive_path=server_config.archive_path,
                executor=executor,
            )
        self.readers: dict[str, Reader] = {}
        self.created_at = time.monotonic()
        self._next_id = 1  # ids of journal-less queues
        # Puts of the batch not yet acknowledged (see put()).
        self._pending_batch: Batch | None = None
        self._pending: list[_Put] = []
        self.pending_items = 0
        self.pending_bytes = 0
        self.deleted = False

    # --- start-up ---------------------------------------------------------------------

    def open(self, files: QueueFiles | None, reader_names: list[str]) -> list[str]:
        """Adopt existing files and restore readers; returns warnings about damage."""
        warnings: list[str] = []
        checkpoints = dict(files.checkpoints) if files else {}
        names = set(reader_names) | set(checkpoints)
        if not self.config.fanout_only:
            names.add("")
        restored = {}
        for rname in names:
            path = checkpoints.get(rname)
            cp = read_checkpoint(path) if path else None
            if cp is not None and cp.problem:
                warnings.append(f"{path}: {cp.problem}; re-delivering from head {cp.head}")
            restored[rname] = cp
        if self.journal is not None:
            min_next = 1 + max(
                [cp.head for cp in restored.values() if cp]
                + [max(cp.done, default=0) for cp in restored.values() if cp]
                + [0]
            )
            warnings += self.journal.open(files.segments if files else [], min_next)
            oldest = self.journal.segments[0].first_id if self.journal.segments else 0
        for rname in sorted(names):
            reader = self._new_reader(rname)
            cp = restored[rname]
            if self.journal is None:
                continue
            if cp is None:
                head, done = 0, set()
            else:
                head, done = cp.head, cp.done
                if cp.problem and cp.head == 0 and oldest:
                    head = oldest - 1
            reader.restore(head, done, rewrite=cp is None or cp.problem is not None)
            if cp is not None and cp.problem:
                reader.compact_now()  # cut the damaged tail before anything is appended
        return warnings

    def _new_reader(self, rname: str) -> Reader:
        cfg = self.server_config.queue(self.name if not rname else f"{self.name}+{rname}")
        reader = Reader(self, rname, cfg)
        self.readers[rname] = reader
        return reader

    # --- readers ------------------------------------------------------------------------

    def reader(self, rname: str, create: bool) -> Reader | None:
        reader = self.readers.get(rname)
        if reader is None and create and (rname or not self.config.fanout_only):
            reader = self._new_reader(rname)
            reader.start_at_tail()
            self.compact_soon(reader)  # its file must exist before a crash can forget it
            log.info("reader_created", queue=self.name, reader=rname)
        return reader

    def remove_reader(self, rname: str) -> bool:
        reader = self.readers.pop(rname, None)
        if reader is None:
            return False
        reader.erase()
        return True

    @property
    def last_id(self) -> int:
        return self.journal.last_id if self.journal is not None else self._next_id - 1

    def children(self) -> list[Reader]:
        return [r for n, r in self.readers.items() if n]

    # --- puts ---------------------------------------------------------------------------

    def put(self, data: bytes, expire_time: int, now: int) -> Batch | None:
        """Add an item for every reader; the batch (if any) says when it is durable.

        Raises QueueFull (NOT_STORED) or JournalWriteError (SERVER_ERROR).
        """
        max_age = self.config.max_age
        if max_age:
            limit = now + max_age
            if not expire_time or expire_time > limit:
                expire_time = limit
        readers = self.readers
        p_items = self.pending_items
        p_bytes = self.pending_bytes
        # Kestrel 2.x: a fanout reader is its own queue.  The queue itself (the
        # default reader) refuses a put when full; a full fanout reader never
        # blocks the queue and its other readers: it discards its oldest item
        # (discard_old_when_full) or drops the new one for itself.
        default = readers.get("")
        if (
            default is not None
            and not default.cfg_discard_old
            and default.is_full(p_items, p_bytes)
        ):
            raise QueueFull(default.full_name)
        skipping: frozenset[Reader] | None = None
        for reader in readers.values():
            if reader.cfg_discard_old:
                reader.make_room(now, p_items, p_bytes)
            elif reader.name and reader.is_full(p_items, p_bytes):
                skipping = (skipping or frozenset()) | {reader}
        journal = self.journal
        if journal is None:
            item = QueueItem(self._next_id, now, expire_time, 0, data)
            self._next_id += 1
            for reader in readers.values():
                if skipping is not None and reader in skipping:
                    reader.drop(item.id)
                else:
                    reader.offer(item, None, 0, now)
            if stored_observer is not None:
                stored_observer(self.name, 0.0, 1, len(data))
            return None
        id_, seg, offset, batch = journal.put(now, data, expire_time)
        # Readers get the item once its batch is acknowledged (written, or fsynced
        # with sync_journal = 0): no consumer ever sees an item that was refused.
        pending = self._pending
        if batch is not self._pending_batch:
            self._pending_batch = batch
            self._pending = pending = []
            batch.add_done_callback(functools.partial(self._acknowledged, pending))
        pending.append((QueueItem(id_, now, expire_time, 0, data), seg, offset, skipping))
        # Not p_items + 1: a failed write inside journal.put() may have resolved a batch.
        self.pending_items += 1
        self.pending_bytes += len(data)
        return batch

    def _acknowledged(self, puts: list[_Put], batch: Batch) -> None:
        """A batch resolved: offer its items to the readers, or drop them if it failed."""
        if self._pending is puts:
            self._pending_batch = None
            self._pending = []
        nbytes = 0
        for put in puts:
            item = put[0]
            nbytes += len(item.data)
        self.pending_items -= len(puts)
        self.pending_bytes -= nbytes
        if self.deleted:
            return
        readers = list(self.readers.values())
        if batch.error is not None:
            # Refused with SERVER_ERROR: never delivered; the ids are spent.
            for reader in readers:
                for put in puts:
                    item = put[0]
                    reader.commit(item.id)
            return
        if stored_observer is not None:
            stored_observer(self.name, time.perf_counter() - batch.started, len(puts), nbytes)
        now = int(time.time() * 1000)
        for put in puts:
            item = put[0]
            seg = put[1]
            offset = put[2]
            skipping = put[3]
            for reader in readers:
                if skipping is not None and reader in skipping:
                    reader.drop(item.id)  # this fanout reader was full
                else:
                    reader.offer(item, seg, offset, now)

    # --- durability -----------------------------------------------------------------------

    def compact_soon(self, reader: Reader) -> None:
        """Rewrite one reader's progress file now, off the loop."""
        job = reader.start_compaction()
        if job is None:
            return
        if self.executor is None:
            job.run()
            reader.finish_compaction(job)
            return
        fut = asyncio.get_running_loop().run_in_executor(self.executor, job.run)
        fut.add_done_callback(lambda _: reader.finish_compaction(job))

    def compactions(self) -> list[Compaction]:
        """Rewrites for the readers whose state changed since their last one."""
        jobs = []
        for reader in self.readers.values():
            job = reader.start_compaction()
            if job is not None:
                jobs.append(job)
        return jobs

    def remove_dead_segments(self) -> list[str]:
        """Delete (or archive) segments every reader has durably consumed."""
        if self.journal is None:
            return []
        heads = [r.saved_head for r in self.readers.values()]
        min_head = min(heads) if heads else self.journal.last_id
        reading = [r.rb.segment.stamp for r in self.readers.values() if r.rb is not None]
        return self.journal.remove_dead(min_head, min(reading) if reading else None)

    def close(self) -> None:
        """Write everything out: journal synced, every checkpoint written (blocking)."""
        if self.journal is None:
            return
        self.journal.close()
        for reader in self.readers.values():
            reader.compact_now()

    def erase(self) -> None:
        """Delete the queue's files (``delete q``)."""
        self.deleted = True
        for reader in self.readers.values():
            reader.erase()
        if self.journal is not None:
            self.journal.erase()

    def reconfigure(self, server_config: ServerConfig) -> None:
        """Apply a reloaded config live."""
        self.server_config = server_config
        self.config = server_config.queue(self.name)
        if self.journal is not None:
            self.journal.max_journal_size = self.config.max_journal_size
            self.journal.sync_journal = self.config.sync_journal
            self.journal.archive_path = server_config.archive_path
        for rname, reader in self.readers.items():
            reader.config = server_config.queue(self.name if not rname else f"{self.name}+{rname}")


__all__ = ["JournaledQueue", "QueueFull", "JournalWriteError"]
