"""Every queue's ``stats`` lines, kept between calls.

A ``stats`` of thousands of queues formats only the lines of the readers whose figures
changed (and each one's ``oldest_item_age``, which grows with the clock), and sums the
server's totals in the same pass.  The queues' order is kept until a queue comes or goes.
Compiled when a compiler is present (see kestreld/compiled.py): a reader's figures are one
C call and its lines one string build.
"""

from __future__ import annotations

import gc
import time
from operator import attrgetter

from kestreld.queues.collection import QueueCollection
from kestreld.queues.journaled_queue import JournaledQueue
from kestreld.queues.reader import Reader

#: Per-queue keys, in the reference order.
QUEUE_STAT_KEYS = (
    "items", "bytes", "total_items", "logsize", "expired_items", "mem_items", "mem_bytes",
    "age", "discarded", "waiters", "open_transactions", "transactions",
    "canceled_transactions", "total_flushes", "journal_rewrites", "journal_rotations",
    "punted_items", "oldest_item_age",
)  # fmt: skip

#: Where ``mem_items`` is in :meth:`Reader.stat_figures`.
MEM_ITEMS = 5


def reader_text(prefix: str, figures: tuple) -> bytes:
    """A reader's lines from its :meth:`Reader.stat_figures`, ``<prefix><key> <value>``
    each, up to ``<prefix>oldest_item_age `` (its value is the clock's)."""
    (items, nbytes, total_items, logsize, expired_items, mem_items, mem_bytes, age, discarded,
     waiters, open_transactions, transactions, canceled, flushes, rotations, punted) = figures  # fmt: skip
    p = prefix
    return (
        f"{p}items {items}\r\n"
        f"{p}bytes {nbytes}\r\n"
        f"{p}total_items {total_items}\r\n"
        f"{p}logsize {logsize}\r\n"
        f"{p}expired_items {expired_items}\r\n"
        f"{p}mem_items {mem_items}\r\n"
        f"{p}mem_bytes {mem_bytes}\r\n"
        f"{p}age {age}\r\n"
        f"{p}discarded {discarded}\r\n"
        f"{p}waiters {waiters}\r\n"
        f"{p}open_transactions {open_transactions}\r\n"
        f"{p}transactions {transactions}\r\n"
        f"{p}canceled_transactions {canceled}\r\n"
        f"{p}total_flushes {flushes}\r\n"
        f"{p}journal_rewrites 0\r\n"
        f"{p}journal_rotations {rotations}\r\n"
        f"{p}punted_items {punted}\r\n"
        f"{p}oldest_item_age "
    ).encode()


class ReaderLines:
    """One reader's lines, kept while its figures stay the same."""

    __slots__ = ("reader", "prefix", "figures", "added", "text")

    def __init__(self, reader: Reader, name: str) -> None:
        self.reader = reader
        self.prefix = f"STAT queue_{name}_"
        self.figures: tuple = ()  # none yet: the first render makes the lines
        #: The oldest waiting item's add time: the head changes only with a figure (a take, a
        #: put to an empty queue, an abort, an expiry, a load from disk all count somewhere).
        self.added: int | None = None
        self.text = b""

    def render(self, out: list[bytes], now_ms: int) -> None:
        """Append the reader's lines to ``out``, formatted again only if a figure changed."""
        reader = self.reader
        figures = reader.stat_figures()
        if figures != self.figures:
            self.added = reader.oldest_add_time()
            if not figures[MEM_ITEMS]:  # nothing in memory: the head may just have been loaded
                figures = reader.stat_figures()
            self.figures = figures
            self.text = reader_text(self.prefix, figures)
        out.append(self.text)
        added = self.added
        out.append(b"%d\r\n" % (now_ms - added if added is not None and now_ms > added else 0))


class QueueLines:
    """One queue's lines: its own reader's, then (when it has fanout readers) a ``children``
    line and theirs, sorted by name.  A ``fanout_only`` queue has no reader of its own: its
    lines are zeros but for ``logsize`` and ``total_items``."""

    __slots__ = ("name", "queue", "reader_list", "masked", "default", "children", "line")

    def __init__(self, queue: JournaledQueue, masked: bool) -> None:
        self.name: str = queue.name
        self.queue = queue
        self.masked = masked  # an alias of its name carries the name in stats: no lines
        self.reader_list: tuple = ()
        self.default: ReaderLines | None = None
        self.children: list[ReaderLines] = []
        self.line = b""  # "STAT queue_<name>_children <names>", or none
        self.follow_readers()

    def follow_readers(self) -> None:
        """Take the queue's readers as they are now (one came or went); each kept reader
        keeps its lines."""
        queue = self.queue
        known = {lines.reader: lines for lines in self.children}
        if self.default is not None:
            known[self.default.reader] = self.default
        default = queue.default_reader
        self.default = None
        if default is not None:
            self.default = known.get(default) or ReaderLines(default, self.name)
        children = sorted(queue.children(), key=attrgetter("name"))
        self.children = [known.get(r) or ReaderLines(r, r.full_name) for r in children]
        names = ",".join([r.name for r in children])
        self.line = f"STAT queue_{self.name}_children {names}\r\n".encode() if names else b""
        self.reader_list = queue.reader_list

    def render(self, out: list[bytes], now_ms: int) -> None:
        """Append the queue's lines to ``out``."""
        if self.queue.reader_list is not self.reader_list:
            self.follow_readers()
        default = self.default
        if default is not None:
            default.render(out, now_ms)
        else:
            queue = self.queue
            values = dict.fromkeys(QUEUE_STAT_KEYS, 0)
            values["logsize"] = queue.journal.total_size if queue.journal is not None else 0
            values["total_items"] = queue.last_id
            prefix = f"STAT queue_{self.name}_"
            out.append("".join([f"{prefix}{k} {v}\r\n" for k, v in values.items()]).encode())
        if self.line:
            out.append(self.line)
            for child in self.children:
                child.render(out, now_ms)


class StatLinesCache:
    """Every queue's :class:`QueueLines`, in ``stats`` order (sorted by name)."""

    __slots__ = ("entries", "aliases")

    def __init__(self) -> None:
        self.entries: list[QueueLines] = []
        self.aliases: tuple = ()  # the alias names the entries were made with

    def render(self, queues: QueueCollection, out: list[bytes]) -> tuple[int, int, int, int]:
        """Append the queues' and readers' lines to ``out``, in ``stats`` order; return the
        server's totals over every reader (those of queues masked by an alias included):
        ``(curr_items, total_items, bytes, reserved memory)``."""
        # A render after every queue changed makes records per reader: tens of thousands of
        # allocations, which start collections that walk the queues' objects (half the CPU
        # of a 10,000-queue stats, profiled). Nothing made here forms a cycle, so reference
        # counting frees all of it; the cyclic collector is paused for the render only.
        if not gc.isenabled():
            return self._render(queues, out)
        gc.disable()
        try:
            return self._render(queues, out)
        finally:
            gc.enable()

    def _render(self, queues: QueueCollection, out: list[bytes]) -> tuple[int, int, int, int]:
        if not self._current(queues):
            self._follow(queues)
        now_ms = int(time.time() * 1000)
        items = total_items = nbytes = reserved = 0
        for entry in self.entries:
            queue = entry.queue
            journaled = queue.journal is not None
            for reader in queue.reader_list:
                items += reader.items
                total_items += reader.total_items
                nbytes += reader.bytes
                if journaled:
                    reserved += reader._config.max_memory_size
            if not entry.masked:
                entry.render(out, now_ms)
        return items, total_items, nbytes, reserved

    def _current(self, queues: QueueCollection) -> bool:
        """The entries are the collection's queues: none came, went or was replaced."""
        by_name = queues.queues
        if len(by_name) != len(self.entries) or tuple(queues.aliases) != self.aliases:
            return False
        for entry in self.entries:
            if by_name.get(entry.name) is not entry.queue:
                return False
        return True

    def _follow(self, queues: QueueCollection) -> None:
        """Entries for the queues as they are now; a queue kept keeps its lines."""
        known = {entry.name: entry for entry in self.entries}
        aliases = queues.aliases
        entries = []
        for name in sorted(queues.queues):
            queue = queues.queues[name]
            entry = known.get(name)
            if entry is None or entry.queue is not queue:
                entry = QueueLines(queue, name in aliases)
            else:
                entry.masked = name in aliases
            entries.append(entry)
        self.entries = entries
        self.aliases = tuple(aliases)
