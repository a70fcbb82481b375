"""One reader of a queue: its in-memory items, read-behind, open reads and checkpoint state.

A queue has one reader per consumer group: the default reader (``q``) and any
fanout readers (``q+r``).  Each reader holds at most ``max_memory_size``
bytes of items in memory; past that it is in *read-behind*: new items stay in
the writer journal only and are streamed back in order as memory drains.

Consumption is tracked the libkestrel way: ``head`` is the highest id below
which every item is done, ``done`` holds ids confirmed out of order, and
``held`` the ids below the head still owed (reads open when a flush moved
the head past them).  Every removal is journaled in the progress file: a
confirm or a plain get before its reply, a discard, a full reader's drop and
an expiry as they happen, a flush as one READ_HEAD jump.

A reader knows its queue's name, folder and journal, not the queue itself.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from kestreld.config import QueueConfig
from kestreld.journal.batch import Batch
from kestreld.journal.clock import monotonic, now_ms
from kestreld.journal.codec import MAGIC_SIZE
from kestreld.journal.files import checkpoint_name, unlink_quietly
from kestreld.journal.progress import FolderNotSynced, ProgressLog, rewrite
from kestreld.journal.segment import ReadBehind, Segment
from kestreld.journal.writer import WriterJournal
from kestreld.queues.blocking import BlockingQueue, Waiter
from kestreld.queues.item import QueueItem

log = structlog.get_logger("kestreld.queues")


#: Most bytes read back from the journal in one refill (keeps the event loop responsive).
REFILL_CHUNK = 1024 * 1024
#: Counts and sizes are C integers when compiled: a count read from damaged files, or a
#: configured max_memory_size, past this (4 Ei) is taken as this.
COUNT_CAP = 1 << 62

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


@dataclass(slots=True, eq=False)
class Compaction:
    """One rewrite of a reader's progress file: snapshot on the loop, ``run`` off it."""

    reader: Reader
    path: str
    head: int
    done: list[int]
    sync_folder: bool
    held: list[int]
    error: str | None = "not run"
    #: The new file was renamed over the old one (also when ``error`` says the folder's
    #: fsync after it failed): appends must go to the new file.
    renamed: bool = False
    finished: bool = False

    def run(self) -> None:
        """Blocking: write, fsync and rename the new file (never raises)."""
        try:
            rewrite(self.path, self.head, self.done, self.sync_folder, self.held)
            self.error = None
            self.renamed = True
        except FolderNotSynced as e:
            self.error = f"folder fsync failed: {e.strerror or e}"
            self.renamed = True
        except OSError as e:
            self.error = e.strerror or str(e)


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
        "items",
        "bytes",
        "rb",
        "open_reads",
        "head",
        "done",
        "held",
        "tail",
        "skipped_items",
        "skipped_bytes",
        "dirty",
        "saved_head",
        "deleted",
        "progress",
        "_journal",
        "on_expired",
        "on_aborted",
        "on_rewrite_needed",
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
        self.items = 0  # unconsumed items (memory + journal only), open reads excluded
        self.bytes = 0
        self.rb: ReadBehind | None = None
        self.open_reads: dict[int, OpenRead] = {}
        self.head = 0
        self.done: set[int] = set()
        self.held: set[int] = set()  # ids <= head still owed (open when a flush passed them)
        self.tail = 0  # the newest id offered (or dropped): where a flush moves the head
        # Puts not yet acknowledged that this reader will not get (dropped or discarded).
        self.skipped_items = 0
        self.skipped_bytes = 0
        self.dirty = False  # state changed since the last rewrite of the progress file
        self.saved_head = 0  # the head in the last rewrite: segments below it may go
        self.deleted = False
        self.progress: ProgressLog | None = None
        # The queue's journal (or None) never changes: kept here, a field read per request.
        self._journal: WriterJournal | None = journal
        if journal is not None:
            self.progress = ProgressLog(
                os.path.join(folder, checkpoint_name(queue_name, name)),
                self.checkpoint_state,
                self._progress_acked,
            )
        self.on_expired: Callable[[Reader, QueueItem], None] | None = None
        # Asked for a rewrite of the progress file now, not at the next interval (the
        # queue runs it off the loop): see _progress_acked.
        self.on_rewrite_needed: Callable[[Reader], None] | None = None
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
        return self._journal

    # --- start-up ---------------------------------------------------------------------

    def restore(
        self, head: int, done: set[int], rewrite: bool = False, held: set[int] | None = None
    ) -> None:
        """Resume from a checkpoint: items after ``head`` and not in ``done`` are unread.

        ``held``: ids at or below ``head`` still owed (they come back first).
        ``rewrite``: the file is missing or was damaged; the next compaction
        replaces it with this state (the damaged tail is cut).
        """
        journal = self.journal
        while head + 1 in done:
            head += 1
            done.discard(head)
        self.head = self.saved_head = head
        self.done = done
        self.dirty = self.dirty or rewrite
        if journal is None:
            self.done = set()
            return
        self.tail = journal.last_id
        held = held or set()
        if journal.last_id <= head and not held:
            self.done = set()
            return
        items, nbytes, owed = journal.unread(head, done, held)
        for p in owed:
            item = QueueItem(p.id, p.add_time, p.expire_time, p.error_count, p.data)  # type: ignore[arg-type]
            self.held.add(p.id)
            self.memory.put(item)
            self.mem_bytes += p.size
            items += 1
            nbytes += p.size
        if len(owed) != len(held):
            self.dirty = True  # some held ids are no longer in the journal: forget them
        self.items = min(items, COUNT_CAP)
        self.bytes = min(nbytes, COUNT_CAP)
        seg = journal.segment_for(head + 1)
        if seg is not None and items > len(owed):
            self.rb = ReadBehind(seg, MAGIC_SIZE, head + 1)

    def start_at_tail(self, last_id: int) -> Batch | None:
        """A reader created at run time sees only items added after ``last_id``.

        Its progress file is written (a READ_HEAD jump) with the next group
        commit, before any later put to the queue is acknowledged.
        """
        self.head = self.saved_head = self.tail = last_id
        self.dirty = True
        return self._journal_jump()

    # --- adding -------------------------------------------------------------------------

    def offer(self, item: QueueItem, seg: Segment | None, offset: int, now: int) -> None:
        """A new item for this reader (called once its put is acknowledged)."""
        id_ = item.id
        if id_ > self.tail:
            self.tail = id_
        if id_ <= self.head:
            return  # put before this reader existed
        self.total_items += 1
        size = len(item.data)
        if item.expired(now, self.cfg_max_age):
            self.expired_items += 1
            self._removed_for_good(id_)
            self._forward_expired(item)
            return
        self.items += 1
        self.bytes += size
        if self.rb is None:
            memory = self.memory
            if seg is None or self.mem_bytes + size <= self.cfg_max_memory or not memory:
                if memory.hand_off(item):
                    self._removed(item, now)
                else:
                    memory.put(item)
                    self.mem_bytes += size
                return
            self.rb = ReadBehind(seg, offset, id_)

    def skip(self, size: int) -> None:
        """A put on its way in (not yet acknowledged) will not be offered: see :meth:`drop`."""
        self.skipped_items += 1
        self.skipped_bytes += size

    def journal_drop(self, id_: int) -> None:
        """Journal now that this reader will drop ``id_`` (a put on its way in): the record
        goes out with the put's own write, before the put is acknowledged."""
        progress = self.progress
        journal = self._journal
        if progress is not None and journal is not None and not journal.closed:
            progress.record(id_)
            journal.join(progress)

    def drop(self, id_: int, size: int = -1) -> None:
        """A new item this reader does not take: it was full (Kestrel 2.x: its own queue was
        full), or it discarded the item before it was acknowledged (discard_old_when_full).

        ``size``: the item was skipped (:meth:`skip`) while its put was on its way in;
        its drop is journaled already (:meth:`journal_drop`).
        """
        if size >= 0:
            self.skipped_items -= 1
            self.skipped_bytes -= size
        if id_ > self.tail:
            self.tail = id_
        if size < 0 and id_ <= self.head:
            return  # put before this reader existed
        self.total_items += 1
        self.discarded += 1
        self.commit(id_)

    def unskip(self, size: int) -> None:
        """A skipped put failed: it was never stored."""
        self.skipped_items -= 1
        self.skipped_bytes -= size

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
            self._removed_for_good(item.id)

    # --- taking -------------------------------------------------------------------------

    def _pop(self, now: int) -> QueueItem | None:
        """The head item, past expired ones: removed from memory and from the counts."""
        memory = self.memory
        max_age = self.cfg_max_age
        while True:
            item = memory.poll()
            if item is None:
                if self.rb is None or not self._refill():
                    return None
                continue
            size = len(item.data)
            self.mem_bytes -= size
            self.items -= 1
            self.bytes -= size
            if (item.expire_time or max_age) and item.expired(now, max_age):
                self._expired(item)
                continue
            if self.rb is not None and self.mem_bytes < self.cfg_max_memory // 2:
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
        if not memory and self.rb is not None:
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
        return self._durably_commit(read.item.id)

    def consume(self, item: QueueItem) -> Batch | None:
        """A plain get: the item is consumed once the ticket (if any) resolves."""
        return self._durably_commit(item.id)

    def reopen(self, read: OpenRead) -> None:
        """Its confirm failed: the read is open again (the caller holds it)."""
        if self.deleted:
            return
        read.finished = False
        id_ = read.item.id
        self.open_reads[id_] = read
        if id_ <= self.head and id_ not in self.held:
            self.held.add(id_)  # a flush passed it meanwhile: still owed
            self.dirty = True

    def _durably_commit(self, id_: int) -> Batch | None:
        progress = self.progress
        journal = self._journal
        if progress is None or journal is None or journal.closed:
            self.commit(id_)
            return None
        batch = progress.record(id_)
        journal.join(progress)
        return batch

    def _removed_for_good(self, id_: int) -> None:
        """An id discarded, dropped or expired: consumed now, journaled with the next tick.

        Nobody waits for it; a failed append marks the state dirty (the next
        rewrite has it), so a kill -9 never brings the item back once written.
        """
        self.commit(id_)
        progress = self.progress
        journal = self._journal
        if progress is not None and journal is not None and not journal.closed:
            progress.record(id_)
            journal.join(progress)

    def _journal_jump(self) -> Batch | None:
        """Append the head (and the ids still owed below it) as a READ_HEAD jump."""
        progress = self.progress
        journal = self._journal
        if progress is None or journal is None or journal.closed:
            return None
        batch = progress.jump(self.head, list(self.held))
        journal.join(progress)
        return batch

    def _progress_acked(self, ids: list[int], batch: Batch) -> None:
        if batch.error is None:
            for id_ in ids:
                self.commit(id_)
        else:
            # The record may be on disk although the write or fsync failed: the
            # next rewrite replaces the file by the state without those ids.
            self.dirty = True
            if batch.end_offset < 0 and self.on_rewrite_needed is not None:
                # Appended to a file a rewrite has replaced since: that rewrite kept
                # these ids as done (they were in flight), and it is durable.  Until
                # the file is rewritten again a crash would forget reads that are
                # still open, so the rewrite runs now.
                self.on_rewrite_needed(self)

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
        return self._durably_commit(item.id)

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

    # --- consumption bookkeeping ------------------------------------------------------

    def commit(self, id_: int) -> None:
        """Mark one id consumed: advance the head or remember it as done out of order."""
        head = self.head
        if id_ <= head:
            if self.held and id_ in self.held:
                self.held.discard(id_)
                self.dirty = True
            return
        self.dirty = True
        if id_ == head + 1:
            done = self.done
            head = id_
            if done:  # ids confirmed out of order wait above the head
                while head + 1 in done:
                    head += 1
                    done.discard(head)
            self.head = head
        else:
            self.done.add(id_)

    def commit_range(self, lo: int, hi: int) -> None:
        """Mark every id in [lo, hi] consumed."""
        if hi <= self.head:
            return
        lo = max(lo, self.head + 1)
        self.dirty = True
        if lo == self.head + 1:
            self.head = hi
            done = self.done
            if done:
                self.done = done = {i for i in done if i > hi}
                while self.head + 1 in done:
                    self.head += 1
                    done.discard(self.head)
        else:
            self.done.update(range(lo, hi + 1))

    # --- flushing and expiry ------------------------------------------------------------

    def flush(self) -> Batch | None:
        """Drop every queued item; open reads stay open.  The ticket says when it is durable.

        The head jumps to the newest id in constant memory; the reads still
        open are kept by id (held), so a crash gives them back and nothing else.
        """
        head = max(self.head, self.tail)
        self.held = {i for i in self.open_reads if i <= head}
        self.head = head
        self.done = set()
        self.dirty = True
        self.memory.clear()
        self.mem_bytes = 0
        self.items = 0
        self.bytes = 0
        self.rb = None
        self.total_flushes += 1
        return self._journal_jump()

    def discard_expired(self, now: int, limit: int | None = None) -> int:
        """Discard expired items at the head (at most ``limit``); returns how many."""
        max_age = self.cfg_max_age
        memory = self.memory
        count = 0
        while limit is None or count < limit:
            if not memory:
                if self.rb is None or not self._refill():
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
        return count

    def _expired(self, item: QueueItem) -> None:
        """An item out of memory and the counts turned out expired."""
        self.expired_items += 1
        self._removed_for_good(item.id)
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

    # --- read-behind --------------------------------------------------------------------

    def _refill(self) -> bool:
        """Load items from the journal into memory; False when nothing could be loaded."""
        rb = self.rb
        journal = self.journal
        if rb is None or journal is None:
            self.rb = None
            return False
        loaded = 0
        head, done = self.head, self.done
        memory = self.memory
        max_mem = self._config.max_memory_size
        while (
            self.rb is not None
            and loaded < REFILL_CHUNK
            and (self.mem_bytes < max_mem or not memory)
        ):
            seg = rb.segment
            try:
                puts, offset, problem = journal.read(seg, rb.offset, REFILL_CHUNK - loaded)
            except FileNotFoundError:
                # Deleted under us: its items are gone; go on with the next segment.
                puts, offset, problem = [], rb.offset, "segment file is missing"
            except OSError as e:
                # Unreadable for now (EIO, EACCES): keep the position and retry later.
                log.error(
                    "journal_read_failed", queue=self.full_name, path=seg.path, error=e.strerror
                )
                break
            for p in puts:
                id_ = p.id
                if id_ < rb.next_id or id_ <= head or id_ in done:
                    continue
                if memory and self.mem_bytes + p.size > max_mem:
                    # Full: resume at this record next time.
                    offset, problem = p.offset, None
                    break
                memory.put(QueueItem(id_, p.add_time, p.expire_time, p.error_count, p.data))  # type: ignore[arg-type]
                self.mem_bytes += p.size
                loaded += p.size + 1
                rb.next_id = id_ + 1
            else:
                rb.offset = offset
                if problem is not None:
                    self._skip_damage(seg, problem)
                    continue
                if not puts:
                    nxt = journal.following(seg)
                    if nxt is None:
                        # Caught up with the writer: back to memory-only mode.
                        if offset >= seg.visible:
                            # Puts still pending will be offered when acknowledged.
                            self.rb = None
                        break
                    rb.segment, rb.offset = nxt, MAGIC_SIZE
                continue
            rb.offset = offset
            break
        return loaded > 0

    def _skip_damage(self, seg: Segment, problem: str) -> None:
        """Damage inside a segment: skip to the next one, counting its lost ids as done."""
        journal = self.journal
        assert journal is not None and self.rb is not None
        nxt = journal.following(seg)
        log.warning("journal_damage_skipped", queue=self.full_name, path=seg.path, problem=problem)
        if nxt is None:
            lost_hi = journal.last_id
            self.rb = None
        else:
            lost_hi = (nxt.first_id - 1) if nxt.first_id else journal.last_id
            self.rb.segment, self.rb.offset = nxt, MAGIC_SIZE
        lo = self.rb.next_id if self.rb is not None else self.head + 1
        if lost_hi >= lo:
            lost = sum(1 for i in range(lo, lost_hi + 1) if i not in self.done)
            self.items = max(0, self.items - lost)
            self.commit_range(lo, lost_hi)
            if self.rb is not None:
                self.rb.next_id = lost_hi + 1
        if self.rb is None:
            self._resync_counts()

    def _resync_counts(self) -> None:
        """Past damage, out of read-behind: memory holds everything, the counts are exact again."""
        self.items = len(self.memory)
        self.bytes = self.mem_bytes

    # --- lifecycle ----------------------------------------------------------------------

    def checkpoint_state(self) -> tuple[int, list[int]]:
        """(head, ids) for a new progress file's first records; held ids are negative."""
        return self.head, [-i for i in sorted(self.held)] + sorted(self.done)

    # --- persistence: the one place the progress file is rewritten -----------------------

    def start_compaction(self) -> Compaction | None:
        """A rewrite of the progress file when the state changed since the last one.

        Appends wait while it runs.  Ids written but not yet acknowledged are
        kept in the snapshot: they are on disk already and the rename must not
        take them away.
        """
        progress = self.progress
        if progress is None or self.deleted or progress.compacting or not self.dirty:
            return None
        self.dirty = False
        progress.begin_rewrite()
        head = self.head
        inflight = progress.inflight_ids()
        done = self.done.union(i for i in inflight if i > head)
        held = self.held.difference(inflight)
        sync_folder = self._config.sync_journal is not None
        return Compaction(self, progress.path, head, sorted(done), sync_folder, sorted(held))

    def finish_compaction(self, job: Compaction) -> None:
        """Back on the loop after ``job.run()``: append to the new file from now on."""
        if job.finished:
            return
        job.finished = True
        progress = self.progress
        journal = self.journal
        assert progress is not None and journal is not None
        if self.deleted:
            unlink_quietly(job.path)  # the rewrite raced the reader's deletion
            return
        if job.error is not None:
            log.error("checkpoint_failed", queue=self.full_name, error=job.error)
            self.dirty = True  # rewritten again next interval
        if job.renamed:
            # The name holds the new file even when the folder's fsync failed: appending
            # to the old (now nameless) file would acknowledge confirms a crash forgets.
            journal.retire(progress.swap())
            if job.error is None:
                self.saved_head = max(self.saved_head, job.head)
            else:
                journal.sync.new_file()  # the next group commit fsyncs the folder first
        else:
            progress.rewrite_failed()
        if progress.has_pending:
            journal.join(progress)

    def compact_now(self) -> None:
        """Blocking rewrite (start-up repair, shutdown)."""
        job = self.start_compaction()
        if job is not None:
            job.run()
            self.finish_compaction(job)

    def ask_rewrites_from(self, callback: Callable[[Reader], None]) -> None:
        """Who rewrites the progress file when it must not wait for the next interval
        (the queue: it owns the executor the rewrite runs on)."""
        self.on_rewrite_needed = callback

    def forward_expired_to(self, callback: Callable[[Reader, QueueItem], None]) -> None:
        """Where expired items go (``expire_to_queue``; the collection knows the queues)."""
        self.on_expired = callback

    def punt_aborted_to(
        self, callback: Callable[[Reader, list[QueueItem]], list[QueueItem]]
    ) -> None:
        """Who decides where aborted items go (the punt keys; the collection knows the
        queues): given them, it returns those that go back to the head."""
        self.on_aborted = callback

    def floor(self) -> int:
        """Every id at or below this is durably consumed: segments up to it may go."""
        held = self.held
        return min(self.saved_head, min(held) - 1) if held else self.saved_head

    def reading_from(self) -> int | None:
        """The stamp of the segment read-behind reads now (None: not in read-behind)."""
        rb = self.rb
        return rb.segment.stamp if rb is not None else None

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
        if self.progress is not None and self.journal is not None:
            self.journal.retire(self.progress.close())

    def erase(self) -> None:
        """Close the reader and delete its progress file."""
        self.close()
        if self.progress is not None:
            unlink_quietly(self.progress.path)

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
