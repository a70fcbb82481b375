"""One reader of a queue (libkestrel's ``JournaledQueue.Reader``): its items in memory, open
reads, waiters, expiry and counts.

A queue has one reader per consumer group: the default reader (``q``) and any
fanout readers (``q+r``).  Each reader holds at most ``max_memory_size``
bytes of items in memory, each item counted with what it costs beside its data
(:data:`ITEM_OVERHEAD`); past that it is in *read-behind*: new items stay in
the writer journal only and are streamed back in order as memory drains.

What the reader consumed (head, done set, the ids still owed), the read-behind
cursor and the progress file are its journal side, a
:class:`~kestreld.journal.journal_reader.JournalReader` (libkestrel's
``Journal.Reader``): this side tells it what happened through its verbs.

A reader knows its queue's name, folder and journal, not the queue itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Any

from kestreld.config import QueueConfig
from kestreld.journal.batch import Batch
from kestreld.journal.clock import monotonic, now_ms
from kestreld.journal.files import checkpoint_name
from kestreld.journal.journal_reader import Compaction, JournalReader
from kestreld.journal.segment import Segment
from kestreld.journal.writer import WriterJournal
from kestreld.queues import heap
from kestreld.queues.blocking import BlockingQueue, Waiter
from kestreld.queues.item import QueueItem, memory_overhead

#: Counts and sizes are C integers when compiled: a count read from damaged files, or a
#: configured max_memory_size, past this (4 Ei) is taken as this.
COUNT_CAP = 1 << 62

#: A reader whose memory held this many bytes of items since it was last empty gives the
#: freed heap back to the system when it empties (see Reader._drained); smaller bursts are
#: not worth a walk of the heap.
RELEASE_AFTER = 4 * 1024 * 1024

#: What max_memory_size charges each item in memory beside its data (the item record, the
#: value's header, the allocator's share, the queue's slot: about 110 bytes compiled): a
#: million small items must not hold several times the configured memory.
ITEM_OVERHEAD = memory_overhead()

#: Called with (reader's full name, ms the item waited) at every hand-off of an item to a
#: consumer (a get, or a waiter served by a put or a give-back); the admin port's delivery
#: latency histograms.  None when nobody watches (see :func:`observe_deliveries`).
delivery_observer: Callable[[str, int], None] | None = None


def observe_deliveries(
    observer: Callable[[str, int], None] | None,
) -> Callable[[str, int], None] | None:
    """Report every delivery to ``observer`` (None: to nobody); returns the previous one."""
    global delivery_observer
    previous, delivery_observer = delivery_observer, observer
    return previous


class OpenRead:
    """An item handed out tentatively; confirmed (close) or given back (abort)."""

    __slots__ = ("item", "reader", "opened_at", "finished", "owner")

    def __init__(
        self, item: QueueItem, reader: Reader, opened_at: float, owner: Any = None
    ) -> None:
        self.item = item
        self.reader = reader
        self.opened_at = opened_at  # monotonic seconds
        self.finished = False
        #: Who holds it (a session): told by ``open_read_timed_out(read)`` when
        #: ``open_transaction_timeout`` gives it back, so it leaves that holder.
        self.owner = owner


class Reader:
    __slots__ = (
        "queue_name",
        "name",
        "full_name",
        "_config",
        "cfg_max_age",
        "cfg_max_memory",
        "cfg_max_items",
        "cfg_max_size",
        "cfg_discard_old",
        "memory",
        "mem_bytes",
        "mem_peak",
        "items",
        "bytes",
        "open_reads",
        "skipped_items",
        "skipped_bytes",
        "deleted",
        "journal_reader",
        "on_expired",
        "on_aborted",
        "total_items",
        "expired_items",
        "discarded",
        "transactions",
        "canceled_transactions",
        "total_flushes",
        "age",
        "punted_items",
    )

    def __init__(
        self,
        queue_name: str,
        name: str,
        config: QueueConfig,
        folder: str,
        journal: WriterJournal | None,
    ) -> None:
        self.queue_name = queue_name
        self.name = name  # "" for the default reader
        self.full_name = queue_name if not name else f"{queue_name}+{name}"
        self._configure(config)
        self.memory: BlockingQueue[QueueItem] = BlockingQueue()
        self.mem_bytes = 0
        # The most mem_bytes held since memory was last empty: a burst drained gives the heap
        # back (see _drained).
        self.mem_peak = 0
        self.items = 0  # unconsumed items (memory + journal only), open reads excluded
        self.bytes = 0
        self.open_reads: dict[int, OpenRead] = {}
        # Puts not yet acknowledged that this reader will not get (dropped or discarded).
        self.skipped_items = 0
        self.skipped_bytes = 0
        self.deleted = False
        path = os.path.join(folder, checkpoint_name(queue_name, name)) if journal else None
        self.journal_reader = JournalReader(self.full_name, journal, path)
        self.on_expired: Callable[[Reader, QueueItem], None] | None = None
        # Given the aborted items (error counts raised), returns those that go back to
        # the head; the others are on their way to an error queue (see punted()).
        self.on_aborted: Callable[[Reader, list[QueueItem]], list[QueueItem]] | None = None
        # stats
        self.total_items = 0
        self.expired_items = 0
        self.discarded = 0
        self.transactions = 0
        self.canceled_transactions = 0
        self.total_flushes = 0
        self.age = 0
        self.punted_items = 0

    @property
    def config(self) -> QueueConfig:
        return self._config

    @config.setter
    def config(self, config: QueueConfig) -> None:
        self._configure(config)

    def _configure(self, config: QueueConfig) -> None:
        # The settings read on every put and get, kept beside the (frozen) config:
        # one attribute read each instead of two.
        self._config = config
        self.cfg_max_age = config.max_age
        self.cfg_max_memory = min(config.max_memory_size, COUNT_CAP)
        self.cfg_max_items = config.max_items
        self.cfg_max_size = config.max_size
        self.cfg_discard_old = config.discard_old_when_full

    @property
    def journal(self) -> WriterJournal | None:
        return self.journal_reader.journal

    # --- start-up ---------------------------------------------------------------------

    def restore(
        self, head: int, done: set[int], rewrite: bool = False, held: set[int] | None = None
    ) -> None:
        """Resume from a checkpoint: items after ``head`` and not in ``done`` are unread.

        ``held``: ids at or below ``head`` still owed (they come back first).
        ``rewrite``: the file is missing or was damaged; the next compaction
        replaces it with this state (the damaged tail is cut).
        """
        owed, items, nbytes = self.journal_reader.restore(head, done, rewrite, held or set())
        for p in owed:
            item = QueueItem(p.id, p.add_time, p.expire_time, p.error_count, p.data)  # type: ignore[arg-type]
            self.memory.put(item)
            self.mem_bytes += p.size
        self.mem_peak = self.mem_bytes
        self.items = min(items, COUNT_CAP)
        self.bytes = min(nbytes, COUNT_CAP)

    def start_at_tail(self, last_id: int) -> Batch | None:
        """A reader created at run time sees only items added after ``last_id``."""
        return self.journal_reader.start_at(last_id)

    # --- adding -------------------------------------------------------------------------

    def offer(self, item: QueueItem, seg: Segment | None, offset: int, now: int) -> None:
        """A new item for this reader (called once its put is acknowledged)."""
        id_ = item.id
        jr = self.journal_reader
        if not jr.seen(id_):
            return  # put before this reader existed
        self.total_items += 1
        size = len(item.data)
        if item.expired(now, self.cfg_max_age):
            self.expired_items += 1
            jr.record_removed(id_)
            self._forward_expired(item)
            return
        self.items += 1
        self.bytes += size
        if jr.read_behind is None:
            memory = self.memory
            if (
                seg is None
                or self.mem_bytes + size + (len(memory) + 1) * ITEM_OVERHEAD <= self.cfg_max_memory
                or not memory
            ):
                if memory.hand_off(item):
                    self._removed(item, now)
                else:
                    memory.put(item)
                    mem_bytes = self.mem_bytes = self.mem_bytes + size
                    if mem_bytes > self.mem_peak:
                        self.mem_peak = mem_bytes
                return
            jr.read_behind_from(seg, offset, id_)

    def skip(self, size: int) -> None:
        """A put on its way in (not yet acknowledged) will not be offered: see :meth:`drop`."""
        self.skipped_items += 1
        self.skipped_bytes += size

    def journal_drop(self, id_: int) -> None:
        """Journal now that this reader will drop ``id_`` (a put on its way in)."""
        self.journal_reader.journal_drop(id_)

    def drop(self, id_: int, size: int = -1) -> None:
        """A new item this reader does not take: it was full (Kestrel 2.x: its own queue was
        full), or it discarded the item before it was acknowledged (discard_old_when_full).

        ``size``: the item was skipped (:meth:`skip`) while its put was on its way in;
        its drop is journaled already (:meth:`journal_drop`).
        """
        jr = self.journal_reader
        ours = jr.seen(id_)
        if size >= 0:
            self.skipped_items -= 1
            self.skipped_bytes -= size
        elif not ours:
            return  # put before this reader existed
        self.total_items += 1
        self.discarded += 1
        jr.commit(id_)

    def unskip(self, size: int) -> None:
        """A skipped put failed: it was never stored."""
        self.skipped_items -= 1
        self.skipped_bytes -= size

    def commit(self, id_: int) -> None:
        """``id_`` is consumed (a put that failed: its id is spent)."""
        self.journal_reader.commit(id_)

    def is_full(self, pending_items: int = 0, pending_bytes: int = 0) -> bool:
        """Full, counting puts not yet acknowledged (they are on their way in).

        The puts of those this reader skips (:meth:`skip`) do not count.
        """
        max_items = self.cfg_max_items
        if max_items is not None and self.items + pending_items - self.skipped_items >= max_items:
            return True
        max_size = self.cfg_max_size
        return max_size is not None and self.bytes + pending_bytes - self.skipped_bytes >= max_size

    def make_room(self, now: int, pending_items: int = 0, pending_bytes: int = 0) -> None:
        """Discard oldest items until a new one fits (discard_old_when_full).

        Only items already offered are discarded here; the queue discards puts
        still on their way in when these are not enough (see JournaledQueue.put).
        """
        while self.is_full(pending_items, pending_bytes):
            item = self._pop(now)
            if item is None:
                return
            self.discarded += 1
            self.journal_reader.record_removed(item.id)

    # --- taking -------------------------------------------------------------------------

    def _pop(self, now: int) -> QueueItem | None:
        """The head item, past expired ones: removed from memory and from the counts."""
        memory = self.memory
        max_age = self.cfg_max_age
        while True:
            item = memory.poll()
            if item is None:
                if self.journal_reader.read_behind is None or not self._refill():
                    return None
                continue
            size = len(item.data)
            self.mem_bytes -= size
            self.items -= 1
            self.bytes -= size
            if not self.mem_bytes and self.mem_peak >= RELEASE_AFTER:
                self._drained()
            if (item.expire_time or max_age) and item.expired(now, max_age):
                self._expired(item)
                continue
            if (
                self.journal_reader.read_behind is not None
                and self.mem_bytes + len(memory) * ITEM_OVERHEAD < self.cfg_max_memory // 2
            ):
                self._refill()
            return item

    def take(self, now: int) -> QueueItem | None:
        """Remove and return the head item (None when empty)."""
        item = self._pop(now)
        if item is not None:
            self._delivered(item, now)
        return item

    def peek(self, now: int) -> QueueItem | None:
        item = self._pop(now)
        if item is not None:
            self._put_back(item)
        return item

    def _put_back(self, item: QueueItem) -> None:
        """``item`` goes back to the head of memory (counted again; no hand-off)."""
        size = len(item.data)
        self.memory.put_first(item)
        self.mem_bytes += size
        self.items += 1
        self.bytes += size

    def oldest_add_time(self) -> int | None:
        """``add_time`` (ms) of the item at the head, the oldest waiting; None when empty.

        Open reads are not waiting and do not count.  After a restart the head
        may still be on disk: it is loaded as the next take would load it.
        """
        memory = self.memory
        if not memory and self.journal_reader.read_behind is not None:
            self._refill()
        item = memory.peek()
        return item.add_time if item is not None else None

    def wait(self, loop: asyncio.AbstractEventLoop, timeout: float | None) -> asyncio.Future:
        return self.memory.wait(loop, timeout)

    def enter(self, waiter: Waiter, timeout: float | None) -> None:
        """``waiter`` waits for this reader's next item (``timeout`` seconds at most)."""
        self.memory.enter(waiter, timeout)

    def _removed(self, item: QueueItem, now: int) -> None:
        """An item counted in and handed straight to a waiter: counted out, delivered."""
        self.items -= 1
        self.bytes -= len(item.data)
        self._delivered(item, now)

    def _delivered(self, item: QueueItem, now: int) -> None:
        """A consumer got ``item`` (a take or a hand-off to a waiter; never a discard or an
        expiry): its wait is the reader's age and a delivery latency."""
        age = self.age = max(0, now - item.add_time)
        observe = delivery_observer
        if observe is not None:
            observe(self.full_name, age)

    # --- reliable reads -----------------------------------------------------------------

    def open(self, item: QueueItem, owner: Any = None) -> OpenRead:
        """Hand ``item`` out tentatively, held by ``owner`` (see :class:`OpenRead`)."""
        read = OpenRead.__new__(OpenRead)  # no __init__ call: a C allocation when compiled
        read.item = item
        read.reader = self
        read.opened_at = monotonic()
        read.finished = False
        read.owner = owner
        self.open_reads[item.id] = read
        self.transactions += 1
        return read

    def confirm(self, read: OpenRead) -> Batch | None:
        """Confirm an open read; the ticket to wait on before acknowledging it (or None).

        The read counts as confirmed once the ticket resolves without error;
        if it fails the caller gives the read back with :meth:`reopen`.
        """
        if read.finished:
            return None
        read.finished = True
        if self.open_reads.pop(read.item.id, None) is None or self.deleted:
            return None
        return self.journal_reader.record(read.item.id)

    def consume(self, item: QueueItem) -> Batch | None:
        """A plain get: the item is consumed once the ticket (if any) resolves."""
        return self.journal_reader.record(item.id)

    def reopen(self, read: OpenRead) -> None:
        """Its confirm failed: the read is open again (the caller holds it)."""
        if self.deleted:
            return
        read.finished = False
        id_ = read.item.id
        self.open_reads[id_] = read
        self.journal_reader.hold(id_)

    def abort(self, reads: list[OpenRead]) -> None:
        """Give open reads back to the head of the queue, in their original order."""
        items = []
        for read in reads:
            if read.finished:
                continue
            read.finished = True
            if self.open_reads.pop(read.item.id, None) is None or self.deleted:
                continue
            self.canceled_transactions += 1
            items.append(read.item.aborted())
        if items and self.on_aborted is not None:
            items = self.on_aborted(self, items)
        self.return_items(items)

    def punted(self, item: QueueItem) -> Batch | None:
        """An aborted item is durably in its error queue: it leaves this reader (durably)."""
        if self.deleted:
            return None
        self.punted_items += 1
        return self.journal_reader.record(item.id)

    def return_items(self, items: list[QueueItem]) -> None:
        """Put items back at the head (waiters first), in order; no transaction counted.

        An item past its expiry is expired instead: it never goes to a waiter.
        """
        now = now_ms()
        max_age = self.cfg_max_age
        memory = self.memory
        rest = []
        for item in items:
            if (item.expire_time or max_age) and item.expired(now, max_age):
                self._expired(item)
                continue
            if memory.hand_off(item):
                self._delivered(item, now)
                continue
            rest.append(item)
        for item in reversed(rest):
            self._put_back(item)

    # --- flushing and expiry ------------------------------------------------------------

    def flush(self) -> Batch | None:
        """Drop every queued item; open reads stay open.  The ticket says when it is durable.

        The head jumps to the newest id in constant memory; the reads still
        open are kept by id (held), so a crash gives them back and nothing else.
        """
        self.memory.clear()
        self.mem_bytes = 0
        self.items = 0
        self.bytes = 0
        self.total_flushes += 1
        if self.mem_peak >= RELEASE_AFTER:
            self._drained()
        return self.journal_reader.flush(list(self.open_reads))

    def discard_expired(self, now: int, limit: int | None = None) -> int:
        """Discard expired items at the head (at most ``limit``); returns how many."""
        max_age = self.cfg_max_age
        memory = self.memory
        count = 0
        while limit is None or count < limit:
            if not memory:
                if self.journal_reader.read_behind is None or not self._refill():
                    break
            item = memory.peek()
            if not item.expired(now, max_age):
                break
            memory.poll()
            size = len(item.data)
            self.mem_bytes -= size
            self.items -= 1
            self.bytes -= size
            self._expired(item)
            count += 1
        if count and not self.mem_bytes and self.mem_peak >= RELEASE_AFTER:
            self._drained()
        return count

    def _expired(self, item: QueueItem) -> None:
        """An item out of memory and the counts turned out expired."""
        self.expired_items += 1
        self.journal_reader.record_removed(item.id)
        self._forward_expired(item)

    def _forward_expired(self, item: QueueItem) -> None:
        if self.on_expired is not None and self._config.expire_to_queue:
            self.on_expired(self, item)

    def expired_open_reads(self, now_mono: float) -> list[OpenRead]:
        timeout = self._config.open_transaction_timeout
        if not timeout or not self.open_reads:
            return []
        limit = now_mono - timeout / 1000
        return [r for r in self.open_reads.values() if r.opened_at <= limit]

    def _drained(self) -> None:
        """Memory emptied after holding a burst: the freed items go back to the system.

        glibc keeps freed chunks for reuse; a drained burst of 128 MiB would stay resident
        (and a dict keeps its size after its keys are gone).  Once per burst, by the verb that
        emptied it: an idle server runs nothing for it.
        """
        self.mem_peak = 0
        if not self.open_reads:
            self.open_reads = {}
        heap.release()

    # --- read-behind --------------------------------------------------------------------

    def _refill(self) -> bool:
        """Load items from the journal into memory; False when nothing could be loaded."""
        memory = self.memory
        room = self.cfg_max_memory - self.mem_bytes - len(memory) * ITEM_OVERHEAD
        puts = self.journal_reader.read_ahead(room, bool(memory), ITEM_OVERHEAD)
        for p in puts:
            memory.put(QueueItem(p.id, p.add_time, p.expire_time, p.error_count, p.data))  # type: ignore[arg-type]
            self.mem_bytes += p.size
        if self.mem_bytes > self.mem_peak:
            self.mem_peak = self.mem_bytes
        lost, ended = self.journal_reader.take_lost()
        if lost:
            self.items = max(0, self.items - lost)
        if ended:
            # Past damage, out of read-behind: memory holds everything, the counts are
            # exact again.
            self.items = len(memory)
            self.bytes = self.mem_bytes
        return len(puts) > 0

    # --- the journal side: its progress file ------------------------------------------

    def start_compaction(self) -> Compaction | None:
        """A rewrite of the progress file when the state changed since the last one."""
        return self.journal_reader.start_compaction(self._config.sync_journal is not None)

    def finish_compaction(self, job: Compaction) -> None:
        """Back on the loop after ``job.run()``: append to the new file from now on."""
        self.journal_reader.finish_compaction(job)

    def compact_now(self) -> None:
        """Blocking rewrite (start-up repair, shutdown)."""
        self.journal_reader.compact_now(self._config.sync_journal is not None)

    def floor(self) -> int:
        """Every id at or below this is durably consumed: segments up to it may go."""
        return self.journal_reader.floor()

    def reading_from(self) -> int | None:
        """The stamp of the segment read-behind reads now (None: not in read-behind)."""
        return self.journal_reader.reading_from()

    # --- lifecycle ----------------------------------------------------------------------

    def ask_rewrites_from(self, callback: Callable[[Reader], None]) -> None:
        """Who rewrites the progress file when it must not wait for the next interval
        (the queue: it owns the executor the rewrite runs on)."""
        self.journal_reader.ask_rewrites_from(lambda: callback(self))

    def forward_expired_to(self, callback: Callable[[Reader, QueueItem], None]) -> None:
        """Where expired items go (``expire_to_queue``; the collection knows the queues)."""
        self.on_expired = callback

    def punt_aborted_to(
        self, callback: Callable[[Reader, list[QueueItem]], list[QueueItem]]
    ) -> None:
        """Who decides where aborted items go (the punt keys; the collection knows the
        queues): given them, it returns those that go back to the head."""
        self.on_aborted = callback

    def idle(self) -> bool:
        """Nothing waiting, open or awaited (max_queue_age may delete the queue)."""
        return self.items == 0 and not self.open_reads and not self.memory.live_waiters()

    def wake_waiters(self) -> None:
        """The server stops: every waiting get ends empty-handed."""
        self.memory.wake_all()

    def close(self) -> None:
        """The reader is gone: wake its waiters empty-handed."""
        self.deleted = True
        self.memory.wake_all()
        self.journal_reader.close()

    def erase(self) -> None:
        """Close the reader and delete its progress file."""
        self.deleted = True
        self.memory.wake_all()
        self.journal_reader.erase()

    def stat_figures(self) -> tuple:
        """The ``stats`` figures of this reader, in the order of its lines (``items``,
        ``bytes``, ``total_items``, ``logsize``, ``expired_items``, ``mem_items``,
        ``mem_bytes``, ``age``, ``discarded``, ``waiters``, ``open_transactions``,
        ``transactions``, ``canceled_transactions``, ``total_flushes``,
        ``journal_rotations``, ``punted_items``): the lines are made of these alone, so
        equal figures mean equal lines.  Compiled, one call: a ``stats`` of thousands of
        queues reads every reader's.
        """
        memory = self.memory
        journal = self.journal_reader.journal
        logsize = rotations = 0  # journal.total_size, without its generator
        if journal is not None:
            rotations = journal.rotations
            for segment in journal.segments:
                logsize += segment.size
        return (
            self.items,
            self.bytes,
            self.total_items,
            logsize,
            self.expired_items,
            len(memory.items),
            self.mem_bytes,
            self.age,
            self.discarded,
            memory.live_waiters() if memory.waiters else 0,
            len(self.open_reads),
            self.transactions,
            self.canceled_transactions,
            self.total_flushes,
            rotations,
            self.punted_items,
        )

    def stats(self) -> dict[str, int]:
        journal = self.journal
        return {
            "items": self.items,
            "bytes": self.bytes,
            "total_items": self.total_items,
            "logsize": journal.total_size if journal else 0,
            "expired_items": self.expired_items,
            "mem_items": len(self.memory),
            "mem_bytes": self.mem_bytes,
            "age": self.age,
            "discarded": self.discarded,
            "waiters": self.memory.live_waiters(),
            "open_transactions": len(self.open_reads),
            "transactions": self.transactions,
            "canceled_transactions": self.canceled_transactions,
            "total_flushes": self.total_flushes,
            "journal_rewrites": 0,
            "journal_rotations": journal.rotations if journal else 0,
            "punted_items": self.punted_items,
        }
