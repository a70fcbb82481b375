"""A reader's side of the journal (libkestrel's ``Journal.Reader``): what it consumed, where it
reads behind, and its progress file.

Consumption is tracked the libkestrel way: ``head`` is the highest id below which every item
is done, ``done`` holds ids confirmed out of order, and ``held`` the ids below the head still
owed (reads open when a flush moved the head past them).  Every removal is journaled in the
progress file: a confirm or a plain get before its reply, a discard, a full reader's drop and
an expiry as they happen, a flush as one READ_HEAD jump.  The file is rewritten (compacted)
off the event loop when the state changed since the last rewrite.

A reader whose items do not fit in memory reads them back from the writer's segments with a
:class:`ReadBehind` cursor, in order, skipping what it consumed already.

The queue side (``kestreld.queues.reader``: items in memory, open reads, waiters, expiry, the
counts) drives a :class:`JournalReader` through its verbs; nothing here knows the queue.
A memory-only queue's readers have one too, with no journal and no file: the head and the
done set still say what was consumed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import structlog

from kestreld.journal.batch import Batch
from kestreld.journal.codec import MAGIC_SIZE, Put
from kestreld.journal.files import unlink_quietly
from kestreld.journal.progress import FolderNotSynced, ProgressLog, rewrite
from kestreld.journal.segment import Segment
from kestreld.journal.writer import WriterJournal

log = structlog.get_logger("kestreld.journal")

#: Most bytes read back from the journal in one refill (keeps the event loop responsive).
REFILL_CHUNK = 1024 * 1024


class ReadBehind:
    """Where a reader resumes reading items that are only in the journal."""

    __slots__ = ("segment", "offset", "next_id")

    def __init__(self, segment: Segment, offset: int, next_id: int) -> None:
        self.segment = segment
        self.offset = offset
        self.next_id = next_id  # the lowest id not yet loaded

    def loaded(self, id_: int) -> None:
        """The item ``id_`` went to memory: the next one is above it."""
        self.next_id = id_ + 1

    def advance(self, offset: int) -> None:
        """Read up to ``offset`` of the current segment."""
        self.offset = offset

    def move_to(self, segment: Segment) -> None:
        """Go on at the start of ``segment`` (the next one)."""
        self.segment = segment
        self.offset = MAGIC_SIZE

    def skip_to(self, next_id: int) -> None:
        """Ids below ``next_id`` are gone (damage): never load them."""
        self.next_id = next_id


@dataclass(slots=True, eq=False)
class Compaction:
    """One rewrite of a reader's progress file: snapshot on the loop, ``run`` off it."""

    reader: JournalReader
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


class JournalReader:
    """One reader's consumption state, its read-behind cursor and its progress file."""

    __slots__ = (
        "full_name",
        "journal",
        "progress",
        "head",
        "done",
        "held",
        "tail",
        "dirty",
        "saved_head",
        "read_behind",
        "closed",
        "lost_items",
        "lost_track",
        "on_rewrite_needed",
    )

    def __init__(self, full_name: str, journal: WriterJournal | None, path: str | None) -> None:
        """``path``: the progress file (used when there is a ``journal``)."""
        self.full_name = full_name
        self.journal = journal
        self.progress: ProgressLog | None = None
        if journal is not None and path is not None:
            self.progress = ProgressLog(path, self.checkpoint_state, self._progress_acked)
            journal.logs.append(self.progress)  # closed with the segment when idle
        self.head = 0
        self.done: set[int] = set()
        self.held: set[int] = set()  # ids <= head still owed (open when a flush passed them)
        self.tail = 0  # the newest id offered (or dropped): where a flush moves the head
        self.dirty = False  # state changed since the last rewrite of the progress file
        self.saved_head = 0  # the head in the last rewrite: segments below it may go
        self.read_behind: ReadBehind | None = None
        self.closed = False
        # Damage read-behind skipped since the queue side last asked (take_lost).
        self.lost_items = 0
        self.lost_track = False  # ... and it left read-behind past it: memory holds all
        self.on_rewrite_needed: Callable[[], None] | None = None

    # --- start-up ---------------------------------------------------------------------

    def restore(
        self, head: int, done: set[int], rewrite: bool, held: set[int]
    ) -> tuple[list[Put], int, int]:
        """Resume from a checkpoint: items after ``head`` and not in ``done`` are unread.

        Returns (the puts still owed below the head, in order: they come back first;
        the unread items and bytes, those owed included).  ``rewrite``: the file is
        missing or was damaged; the next compaction replaces it with this state.
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
            return [], 0, 0
        self.tail = journal.last_id
        if journal.last_id <= head and not held:
            self.done = set()
            return [], 0, 0
        items, nbytes, owed = journal.unread(head, done, held)
        for p in owed:
            self.held.add(p.id)
            items += 1
            nbytes += p.size
        if len(owed) != len(held):
            self.dirty = True  # some held ids are no longer in the journal: forget them
        seg = journal.segment_for(head + 1)
        if seg is not None and items > len(owed):
            self.read_behind = ReadBehind(seg, MAGIC_SIZE, head + 1)
        return owed, items, nbytes

    def start_at(self, last_id: int) -> Batch | None:
        """A reader created at run time sees only items added after ``last_id``.

        Its progress file is written (a READ_HEAD jump) with the next group
        commit, before any later put to the queue is acknowledged.
        """
        self.head = self.saved_head = self.tail = last_id
        self.dirty = True
        return self.jump()

    # --- what the queue side tells -------------------------------------------------------

    def seen(self, id_: int) -> bool:
        """A new id reached the reader (offered or dropped): the tail moves.  False when
        the id is at or below the head: put before the reader existed."""
        if id_ > self.tail:
            self.tail = id_
        return id_ > self.head

    def read_behind_from(self, segment: Segment, offset: int, id_: int) -> None:
        """Memory is full: items from ``id_`` (at ``offset`` of ``segment``) stay in the journal."""
        self.read_behind = ReadBehind(segment, offset, id_)

    def record(self, id_: int) -> Batch | None:
        """A confirm or a plain get: consumed once the ticket (if any) resolves."""
        progress = self.progress
        journal = self.journal
        if progress is None or journal is None or journal.closed:
            self.commit(id_)
            return None
        batch = progress.record(id_)
        journal.join(progress)
        return batch

    def record_removed(self, id_: int) -> None:
        """An id discarded, dropped or expired: consumed now, journaled with the next tick.

        Nobody waits for it; a failed append marks the state dirty (the next
        rewrite has it), so a kill -9 never brings the item back once written.
        """
        self.commit(id_)
        self.journal_drop(id_)

    def journal_drop(self, id_: int) -> None:
        """Journal now that this reader will drop ``id_`` (a put on its way in): the record
        goes out with the put's own write, before the put is acknowledged."""
        progress = self.progress
        journal = self.journal
        if progress is not None and journal is not None and not journal.closed:
            progress.record(id_)
            journal.join(progress)

    def hold(self, id_: int) -> None:
        """A read of ``id_`` is open again (its confirm failed): if a flush passed it
        meanwhile, it is still owed."""
        if id_ <= self.head and id_ not in self.held:
            self.held.add(id_)
            self.dirty = True

    def flush(self, open_ids: list[int]) -> Batch | None:
        """Every queued id is consumed, those of ``open_ids`` excepted: the head jumps to the
        newest id in constant memory.  The ticket says when it is durable."""
        head = max(self.head, self.tail)
        self.held = {i for i in open_ids if i <= head}
        self.head = head
        self.done = set()
        self.dirty = True
        self.read_behind = None
        return self.jump()

    def jump(self) -> Batch | None:
        """Append the head (and the ids still owed below it) as a READ_HEAD jump."""
        progress = self.progress
        journal = self.journal
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
                self.on_rewrite_needed()

    def ask_rewrites_from(self, callback: Callable[[], None]) -> None:
        """Who rewrites the progress file when it must not wait for the next interval."""
        self.on_rewrite_needed = callback

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

    # --- read-behind --------------------------------------------------------------------

    def read_ahead(self, room: int, have: bool, per_item: int) -> list[Put]:
        """The next unconsumed puts of read-behind, in order, the cursor moved past them.

        At most about :data:`REFILL_CHUNK` bytes, and ``room`` bytes counting ``per_item``
        beside each put's data (what it costs in memory), but at least one put when
        ``have`` is False (memory is empty).  Damage skipped on the way is
        counted for :meth:`take_lost`.  Leaves read-behind when it catches up with the
        writer.
        """
        rb = self.read_behind
        journal = self.journal
        if rb is None or journal is None:
            self.read_behind = None
            return []
        out: list[Put] = []
        loaded = 0
        head, done = self.head, self.done
        while self.read_behind is not None and loaded < REFILL_CHUNK and (room > 0 or not have):
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
                if have and p.size + per_item > room:
                    # Full: resume at this record next time.
                    offset, problem = p.offset, None
                    break
                out.append(p)
                room -= p.size + per_item
                have = True
                loaded += p.size + 1
                rb.loaded(id_)
            else:
                rb.advance(offset)
                if problem is not None:
                    self._skip_damage(seg, problem)
                    continue
                if not puts:
                    if journal.large.holding(seg):
                        break  # a large write is on its way into it: later ones wait
                    nxt = journal.following(seg)
                    if nxt is None:
                        # Caught up with the writer: back to memory-only mode.
                        if offset >= seg.visible:
                            # Puts still pending will be offered when acknowledged.
                            self.read_behind = None
                        break
                    rb.move_to(nxt)
                continue
            rb.advance(offset)
            break
        return out

    def _skip_damage(self, seg: Segment, problem: str) -> None:
        """Damage inside a segment: skip to the next one, counting its lost ids as done."""
        journal = self.journal
        rb = self.read_behind
        assert journal is not None and rb is not None
        nxt = journal.following(seg)
        log.warning("journal_damage_skipped", queue=self.full_name, path=seg.path, problem=problem)
        if nxt is None:
            lost_hi = journal.last_id
            self.read_behind = None
        else:
            lost_hi = (nxt.first_id - 1) if nxt.first_id else journal.last_id
            rb.move_to(nxt)
        lo = rb.next_id if self.read_behind is not None else self.head + 1
        if lost_hi >= lo:
            self.lost_items += sum(1 for i in range(lo, lost_hi + 1) if i not in self.done)
            self.commit_range(lo, lost_hi)
            if self.read_behind is not None:
                rb.skip_to(lost_hi + 1)
        if self.read_behind is None:
            self.lost_track = True

    def take_lost(self) -> tuple[int, bool]:
        """(items lost to damage since the last call, whether read-behind ended past it:
        then memory holds every unread item and the counts can be taken from it)."""
        lost, ended = self.lost_items, self.lost_track
        self.lost_items = 0
        self.lost_track = False
        return lost, ended

    def reading_from(self) -> int | None:
        """The stamp of the segment read-behind reads now (None: not in read-behind)."""
        rb = self.read_behind
        return rb.segment.stamp if rb is not None else None

    # --- the progress file: the one place it is rewritten ------------------------------

    def checkpoint_state(self) -> tuple[int, list[int]]:
        """(head, ids) for a new progress file's first records; held ids are negative."""
        return self.head, [-i for i in sorted(self.held)] + sorted(self.done)

    def start_compaction(self, sync_folder: bool) -> Compaction | None:
        """A rewrite of the progress file when the state changed since the last one.

        Appends wait while it runs.  Ids written but not yet acknowledged are
        kept in the snapshot: they are on disk already and the rename must not
        take them away.
        """
        progress = self.progress
        if progress is None or self.closed or progress.compacting or not self.dirty:
            return None
        self.dirty = False
        progress.begin_rewrite()
        head = self.head
        inflight = progress.inflight_ids()
        done = self.done.union(i for i in inflight if i > head)
        held = self.held.difference(inflight)
        return Compaction(self, progress.path, head, sorted(done), sync_folder, sorted(held))

    def finish_compaction(self, job: Compaction) -> None:
        """Back on the loop after ``job.run()``: append to the new file from now on."""
        if job.finished:
            return
        job.finished = True
        progress = self.progress
        journal = self.journal
        assert progress is not None and journal is not None
        if self.closed:
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

    def compact_now(self, sync_folder: bool) -> None:
        """Blocking rewrite (start-up repair, shutdown)."""
        job = self.start_compaction(sync_folder)
        if job is not None:
            job.run()
            self.finish_compaction(job)

    def floor(self) -> int:
        """Every id at or below this is durably consumed: segments up to it may go."""
        held = self.held
        return min(self.saved_head, min(held) - 1) if held else self.saved_head

    def close(self) -> None:
        """The reader is gone: its progress file is closed (and retired by the journal)."""
        self.closed = True
        if self.progress is not None and self.journal is not None:
            if self.progress in self.journal.logs:
                self.journal.logs.remove(self.progress)
            self.journal.retire(self.progress.close())

    def erase(self) -> None:
        """Close, and delete the progress file."""
        self.close()
        if self.progress is not None:
            unlink_quietly(self.progress.path)
