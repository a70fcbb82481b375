"""A queue: one writer journal shared by its readers (libkestrel's ``JournaledQueue``).

Every put is journaled once and offered to every reader: the default reader
``q`` (absent when the queue is ``fanout_only``) and fanout readers ``q+r``.
A ``journal = false`` queue keeps no files and lives in memory only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor

import structlog

from kestreld.config import QueueConfig, ServerConfig
from kestreld.journal.batch import Batch
from kestreld.journal.checkpoint import read_checkpoint
from kestreld.journal.clock import monotonic, now_ms
from kestreld.journal.files import QueueFiles, unlink_quietly
from kestreld.journal.handles import HandleCache
from kestreld.journal.journal_reader import Compaction
from kestreld.journal.tick import Tick
from kestreld.journal.writer import JournalWriteError, WriterJournal
from kestreld.queues.item import QueueItem, new_item
from kestreld.queues.reader import Reader

log = structlog.get_logger("kestreld.queues")


#: A put waiting for its batch: [item, segment, offset, readers that skip it or None].
#: The readers that skip it were full when it was put, or discarded it later to make
#: room (discard_old_when_full) while it was still on its way in; they drop it.
_Put = list


#: Called with (queue name, seconds since its write batch began, puts, their bytes) when
#: puts are acknowledged: the admin port's per-queue set latency and put counts.  None
#: when nobody watches (see :func:`observe_stores`).
stored_observer: Callable[[str, float, int, int], None] | None = None


def observe_stores(
    observer: Callable[[str, float, int, int], None] | None,
) -> Callable[[str, float, int, int], None] | None:
    """Report every acknowledged batch of puts to ``observer``; returns the previous one."""
    global stored_observer
    previous, stored_observer = stored_observer, observer
    return previous


#: The expiry sweep looks at most this many items of a reader's memory for an expiry.
SCAN_ITEMS = 1024


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
        "reader_list",
        "default_reader",
        "created_at",
        "_next_id",
        "_pending_batch",
        "_pending",
        "_unacked",
        "_acknowledged_bound",
        "pending_items",
        "pending_bytes",
        "deleted",
        "max_age",
        "max_item_size",
        "expiring",
        "sweeps",
    )

    def __init__(
        self,
        name: str,
        server_config: ServerConfig,
        *,
        executor: Executor | None = None,
        tick: Tick | None = None,
        handles: HandleCache | None = None,
    ) -> None:
        self.name = name
        self.server_config = server_config
        self.config: QueueConfig = server_config.queue(name)
        self.max_age = self.config.max_age or 0  # the config's, read by every put
        self.max_item_size = self.config.max_item_size
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
                tick=tick,
                handles=handles,
            )
        self.readers: dict[str, Reader] = {}
        #: The readers in the dict's order, and the queue's own (""), kept in step with
        #: ``readers`` by the two verbs that change it: every put walks them.
        self.reader_list: tuple[Reader, ...] = ()
        self.default_reader: Reader | None = None
        self.created_at = monotonic()
        self._next_id = 1  # ids of journal-less queues
        # Puts of the batch not yet acknowledged (see put()).
        self._pending_batch: Batch | None = None
        self._pending: list[_Put] | None = None  # the puts of _pending_batch
        # Every put not yet acknowledged, oldest first: the puts of each unacknowledged batch
        # (its ``payload``, one list per tick), so a put adds nothing to it but its tick's list.
        self._unacked: list[list[_Put]] = []
        # The callback of every batch, bound once (per batch otherwise).
        self._acknowledged_bound = self._acknowledged
        self.pending_items = 0
        self.pending_bytes = 0
        self.deleted = False
        #: In ``sweeps``, the queues the expiry sweep visits (see :meth:`has_deadlines`): a
        #: put of an item with an expiry adds the queue; the sweep drops it once none is left.
        self.expiring = False
        self.sweeps: set[JournaledQueue] | None = None

    # --- start-up ---------------------------------------------------------------------

    def open(self, files: QueueFiles | None, reader_names: list[str]) -> list[str]:
        """Adopt existing files and restore readers; returns warnings about damage."""
        warnings: list[str] = []
        checkpoints = dict(files.checkpoints) if files else {}
        if self.config.fanout_only and "" in checkpoints:
            # Switched to fanout_only: the default reader is gone, with its file (or it
            # would pin every segment for good).
            unlink_quietly(checkpoints.pop(""))
            log.info("reader_deleted", queue=self.name, reader="", reason="fanout_only")
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
            if cp is None and rname:
                # A fanout reader never seen before (first named in the config, or
                # deleted and named again): like `get q+r`, it starts at the tail.
                reader.restore(self.journal.last_id, set(), rewrite=True)
                reader.compact_now()  # on disk before any later put is acknowledged
                continue
            held: set[int] = set()
            if cp is None:
                head, done = 0, set()
            else:
                head, done, held = cp.head, cp.done, cp.held
                if cp.problem and cp.head == 0 and oldest:
                    head = oldest - 1
            # No file says what a new file would (head 0, nothing done): nothing to rewrite,
            # and the first append writes it whole.  Rewriting every new queue's file cost
            # two fsyncs a queue, seconds of a checkpoint round with thousands of queues.
            damaged = cp is not None and cp.problem is not None
            reader.restore(head, done, rewrite=damaged, held=held)
            if damaged:
                reader.compact_now()  # cut the damaged tail before anything is appended
        return warnings

    def _new_reader(self, rname: str) -> Reader:
        cfg = self.server_config.queue(self.name if not rname else f"{self.name}+{rname}")
        reader = Reader(self.name, rname, cfg, self.folder, self.journal)
        reader.ask_rewrites_from(self.compact_soon)
        self.readers[rname] = reader
        self._readers_changed()
        return reader

    def _readers_changed(self) -> None:
        self.reader_list = tuple(self.readers.values())
        self.default_reader = self.readers.get("")

    # --- readers ------------------------------------------------------------------------

    def reader(self, rname: str, create: bool) -> Reader | None:
        reader = self.readers.get(rname)
        if reader is None and create and (rname or not self.config.fanout_only):
            reader = self._new_reader(rname)
            # Its file is written with the next group commit, before any later put
            # of this queue is acknowledged (a crash cannot forget it meanwhile).
            reader.start_at_tail(self.last_id)
            log.info("reader_created", queue=self.name, reader=rname)
        return reader

    def remove_reader(self, rname: str) -> bool:
        reader = self.readers.pop(rname, None)
        if reader is None:
            return False
        self._readers_changed()
        reader.erase()
        return True

    @property
    def last_id(self) -> int:
        return self.journal.last_id if self.journal is not None else self._next_id - 1

    def children(self) -> list[Reader]:
        return [r for n, r in self.readers.items() if n]

    # --- puts ---------------------------------------------------------------------------

    def put(self, data: bytes, expire_time: int, now: int, error_count: int = 0) -> Batch | None:
        """Add an item for every reader; the batch (if any) says when it is durable.

        ``error_count``: the item's aborts so far (an item punted or expired here
        from another queue keeps its count).

        Raises QueueFull (NOT_STORED) or JournalWriteError (SERVER_ERROR).
        """
        max_age = self.max_age
        if max_age:
            limit = now + max_age
            if not expire_time or expire_time > limit:
                expire_time = limit
        if expire_time and not self.expiring:
            self.sweep_me()
        readers = self.reader_list
        p_items = self.pending_items
        p_bytes = self.pending_bytes
        # Kestrel 2.x: a fanout reader is its own queue.  The queue itself (the
        # default reader) refuses a put when full; a full fanout reader never
        # blocks the queue and its other readers: it discards its oldest item
        # (discard_old_when_full) or drops the new one for itself.
        default = self.default_reader
        if (
            default is not None
            and not default.cfg_discard_old
            and default.is_full(p_items, p_bytes)
        ):
            raise QueueFull(default.full_name)
        skipping: set[Reader] | None = None
        size = len(data)
        for reader in readers:
            if reader.cfg_discard_old:
                reader.make_room(now, p_items, p_bytes)
                if p_items and reader.is_full(p_items, p_bytes):
                    self._discard_unacked(reader, p_items, p_bytes)
            elif reader.name and reader.is_full(p_items, p_bytes):
                if skipping is None:
                    skipping = set()
                skipping.add(reader)
                reader.skip(size)
        journal = self.journal
        if journal is None:
            item = QueueItem(self._next_id, now, expire_time, error_count, data)
            self._next_id += 1
            for reader in readers:
                if skipping is not None and reader in skipping:
                    reader.drop(item.id, size)
                else:
                    reader.offer(item, None, 0, now)
            if stored_observer is not None:
                stored_observer(self.name, 0.0, 1, len(data))
            return None
        try:
            batch = journal.put(now, data, expire_time, error_count)
        except BaseException:
            if skipping is not None:
                for reader in skipping:
                    reader.unskip(size)
            raise
        # Readers get the item once its batch is acknowledged (written, or fsynced
        # with sync_journal = 0): no consumer ever sees an item that was refused.
        first = batch is not self._pending_batch
        if first:
            self._pending_batch = batch
            self._pending = pending = []
            batch.payload = pending  # this tick's puts, for _acknowledged
            self._unacked.append(pending)
        else:
            pending = self._pending
        id_ = journal.put_id
        put = [
            new_item(id_, now, expire_time, error_count, data),
            journal.put_segment,
            journal.put_offset,
            skipping,
        ]
        if expire_time and expire_time <= now:
            # Expired on arrival: every reader expires it once acknowledged, and that
            # is journaled now, with the put (a kill -9 after STORED must not revive it).
            for reader in readers:
                reader.journal_drop(id_)
        elif skipping is not None:
            for reader in skipping:
                reader.journal_drop(id_)  # written with the put, before it is acknowledged
        pending.append(put)
        # Not p_items + 1: a failed write inside journal.put() may have resolved a batch.
        self.pending_items += 1
        self.pending_bytes += size
        if first:
            # Once the put is counted and in its batch's list: with no event loop running
            # (offline tools, a queue driven by hand) the journal wrote the batch already,
            # and the callback acknowledges it at once.
            batch.add_done_callback(self._acknowledged_bound)
        return batch

    def _forget_unacked(self, puts: list[_Put]) -> None:
        """A batch resolved out of order (rare): take its puts out of the line."""
        self._unacked = [tick for tick in self._unacked if tick is not puts]

    def _discard_unacked(self, reader: Reader, p_items: int, p_bytes: int) -> None:
        """Still full after discarding what it holds: the reader discards the oldest puts
        on their way in (pipelined sets of one unwritten batch), as if already stored."""
        for tick in self._unacked:
            for put in tick:
                skipping = put[3]
                if skipping is not None and reader in skipping:
                    continue
                if skipping is None:
                    skipping = put[3] = set()
                skipping.add(reader)
                reader.skip(len(put[0].data))
                reader.journal_drop(put[0].id)
                if not reader.is_full(p_items, p_bytes):
                    return

    def _acknowledged(self, batch: Batch) -> None:
        """A batch resolved: offer its items (``batch.payload``, the puts of its tick) to the
        readers, or drop them if it failed."""
        puts = batch.payload
        if self._pending is puts:
            self._pending_batch = None
            self._pending = None  # the next put's batch brings a new list
        unacked = self._unacked
        if unacked and unacked[0] is puts:
            del unacked[0]  # the usual case: the oldest batch
        else:
            self._forget_unacked(puts)
        nbytes = 0
        for put in puts:
            item = put[0]
            nbytes += len(item.data)
        self.pending_items -= len(puts)
        self.pending_bytes -= nbytes
        if self.deleted:
            return
        if batch.error is not None:
            readers = self.reader_list
            # Refused with SERVER_ERROR: never delivered; the ids are spent.
            for put in puts:
                item = put[0]
                skipping = put[3]
                for reader in readers:
                    if skipping is not None and reader in skipping:
                        reader.unskip(len(item.data))
                    reader.commit(item.id)
            return
        if stored_observer is not None:
            stored_observer(self.name, monotonic() - batch.started, len(puts), nbytes)
        now = now_ms()
        readers = self.reader_list  # an offer never adds or removes a reader
        for put in puts:
            item = put[0]
            seg = put[1]
            offset = put[2]
            skipping = put[3]
            for reader in readers:
                if skipping is not None and reader in skipping:
                    reader.drop(item.id, len(item.data))  # full, or discarded on the way in
                else:
                    reader.offer(item, seg, offset, now)

    # --- deadlines -----------------------------------------------------------------------

    def sweep_me(self) -> None:
        """The expiry sweep visits this queue from now on (until it has no deadline)."""
        self.expiring = True
        if self.sweeps is not None:
            self.sweeps.add(self)

    def has_deadlines(self) -> bool:
        """Something here may expire or time out: configured ages and timeouts, open reads,
        items on disk (read-behind) or an item in memory with an expiry (the first
        :data:`SCAN_ITEMS` looked at; past them, assumed)."""
        if self.config.max_queue_age:
            return True
        for reader in self.reader_list:
            config = reader.config
            if config.max_age or config.open_transaction_timeout or reader.open_reads:
                return True
            if reader.journal_reader.read_behind is not None:
                return True
            for n, item in enumerate(reader.memory.items):
                if n >= SCAN_ITEMS or item.expire_time:
                    return True
        return bool(self.pending_items)  # puts on their way in: looked at once they are in

    def unsettled(self) -> bool:
        """A reader's progress file is behind its state (a rewrite failed or was running):
        the next checkpoint round visits the queue again."""
        if self.journal is None:
            return False
        return any(r.journal_reader.dirty for r in self.reader_list)

    # --- durability -----------------------------------------------------------------------

    def compact_soon(self, reader: Reader) -> None:
        """Rewrite one reader's progress file soon, off the loop (the reader asks).

        It starts on the loop's next turn, so that whoever held the reads of a failed
        confirm has taken them back (``Reader.reopen``) before the state is taken.
        """
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no event loop runs (an offline tool): rewrite now
            self._rewrite(reader, None)
            return
        loop.call_soon(self._rewrite, reader, loop)

    def _rewrite(self, reader: Reader, loop: asyncio.AbstractEventLoop | None) -> None:
        job = reader.start_compaction()
        if job is None:
            return  # a rewrite runs already (the reader stays dirty: the next one)
        if self.executor is None or loop is None:
            job.run()
            reader.finish_compaction(job)
            return
        fut = loop.run_in_executor(self.executor, job.run)
        fut.add_done_callback(lambda _: self._rewritten(reader, job))

    def _rewritten(self, reader: Reader, job: Compaction) -> None:
        reader.finish_compaction(job)
        if self.journal is not None:
            self.journal.mark_changed()  # the next round retires what the new head freed

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
        heads = [r.floor() for r in self.readers.values()]
        min_head = min(heads) if heads else self.journal.last_id
        reading = [s for s in (r.reading_from() for r in self.readers.values()) if s is not None]
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
        self.max_age = self.config.max_age or 0
        self.max_item_size = self.config.max_item_size
        if self.journal is not None:
            self.journal.reconfigure(
                self.config.max_journal_size, self.config.sync_journal, server_config.archive_path
            )
        if self.config.fanout_only and "" in self.readers:
            self.remove_reader("")  # switched to fanout_only: the default reader is gone
            log.info("reader_deleted", queue=self.name, reader="", reason="fanout_only")
        for rname, reader in self.readers.items():
            reader.config = server_config.queue(self.name if not rname else f"{self.name}+{rname}")


__all__ = ["JournaledQueue", "QueueFull", "JournalWriteError"]
