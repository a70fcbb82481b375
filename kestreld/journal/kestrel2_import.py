"""``kestreld journal import-kestrel2``: turn Kestrel 2.x journals into native kestreld files.

    kestreld journal import-kestrel2 OLD_DIR NEW_DIR [--queue NAME] [--dry-run]
                                     [--strict] [--kestrel-2.0]

Each old queue is replayed (:mod:`kestreld.journal.kestrel2`) and written to
NEW_DIR as writer segments ``<queue>.<ms>`` (ids 1, 2, 3 ... in queue order,
add and expiry times kept, at most 16 MiB a segment unless one item is
larger) and one reader checkpoint per reader: ``<queue>.read.`` and
``<queue>.read.<child>`` for each Kestrel 2.x fanout queue ``<queue>+<child>``.

Fanout children become readers of their parent's journal.  An item a child
holds is the parent's item when data and add time are equal; every item is
written once, and each reader's checkpoint marks as done exactly the items
its old journal did not hold (a leading run of them is folded into the
head), so every reader sees the items it had, in their old order as far as
one shared order allows.

Files are written under ``~~`` names and renamed once a queue is complete;
existing native files of a queue in NEW_DIR are never overwritten.  With
``--strict`` any fault (a record that could not be read, an item too large
for kestreld) makes the command exit 1 and write nothing at all.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

from kestreld.journal import codec
from kestreld.journal.files import (
    checkpoint_name,
    scan_folder,
    segment_name,
    split_queue_name,
)
from kestreld.journal.kestrel2 import (
    ItemData,
    Kestrel2Item,
    Problem,
    ReplayResult,
    replay,
    scan_kestrel2_folder,
)

#: A new segment starts when the current one would pass this size.
SEGMENT_LIMIT = 16 * 1024 * 1024
#: Journals smaller than this (in total) get no progress bar.
PROGRESS_MIN_BYTES = 64 * 1024 * 1024
TEMP_SUFFIX = "~~import"


@dataclass(slots=True)
class QueueReplay:
    """One old queue (or fanout child ``parent+child``) after replay."""

    name: str
    files: list[str]
    result: ReplayResult
    problems: list[Problem]  # the replay's faults plus items too large for kestreld

    @property
    def items(self) -> list[Kestrel2Item]:
        return self.result.items


@dataclass(slots=True)
class WrittenQueue:
    """The native files written for one queue and its readers."""

    queue: str
    segments: list[str]
    checkpoints: list[str]
    items: int


@dataclass(slots=True)
class ImportReport:
    """What an import found and did; ``exit_code`` is what the command returns."""

    replays: dict[str, QueueReplay] = field(default_factory=dict)
    written: list[WrittenQueue] = field(default_factory=list)
    exit_code: int = 0

    @property
    def faults(self) -> int:
        return sum(len(q.problems) for q in self.replays.values())


class ImportRefused(Exception):
    """The import cannot go ahead; the message says why (nothing was written)."""


# --- progress -------------------------------------------------------------------------


class ProgressBar:
    """A one-line text bar on a stream; silent when ``total`` is below the threshold.

    On a terminal the line is redrawn in place; otherwise a line is printed
    every 10 %.
    """

    WIDTH = 30

    def __init__(self, label: str, total: int, stream: TextIO, min_total: int) -> None:
        self.label = label
        self.total = total
        self.stream = stream
        self.enabled = total > 0 and total >= min_total
        self.tty = self.enabled and hasattr(stream, "isatty") and stream.isatty()
        self._shown = -1
        self._step = 1 if self.tty else 10

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        percent = min(100, done * 100 // self.total)
        if percent // self._step == self._shown // self._step and self._shown >= 0:
            return
        self._shown = percent
        filled = self.WIDTH * percent // 100
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        mib = 1024 * 1024
        line = f"{self.label} [{bar}] {percent:3d}%  {done / mib:.1f}/{self.total / mib:.1f} MiB"
        if self.tty:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if not self.enabled:
            return
        self.update(self.total)
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()


# --- replay ---------------------------------------------------------------------------


def _too_large(result: ReplayResult) -> tuple[list[Kestrel2Item], list[Problem]]:
    kept: list[Kestrel2Item] = []
    problems: list[Problem] = []
    for item in result.items:
        if item.size > codec.MAX_DATA_SIZE:
            problems.append(
                Problem(
                    item.path,
                    item.data_offset,
                    f"item of {item.size} bytes (data at this offset) is larger than "
                    f"kestreld's limit of {codec.MAX_DATA_SIZE} bytes; not imported",
                )
            )
        else:
            kept.append(item)
    return kept, problems


# --- merging fanout readers into one journal ------------------------------------------


@dataclass(slots=True)
class _Entry:
    """One item of the new journal and the readers whose old journal held it."""

    item: Kestrel2Item
    readers: set[str]


def _key(item: Kestrel2Item, data: ItemData) -> tuple[int, int, bytes]:
    return item.add_time, item.size, hashlib.blake2b(data(item), digest_size=16).digest()


def merge_readers(readers: dict[str, list[Kestrel2Item]], data: ItemData) -> list[_Entry]:
    """One item order for every reader (``""`` is the parent's default reader).

    Each child is aligned against the order built so far, from the tail
    backwards (readers consumed different prefixes of the same puts): a child
    item matches the latest unmatched equal item (data and add time) before
    the previous match; child-only items go just before the next matched
    one.  An item equal to one out of order is still written once (that
    reader then sees it in the shared order).
    """
    entries = [_Entry(item, {""}) for item in readers.get("", [])]
    children = sorted(r for r in readers if r)
    if not children:
        return entries
    keys = [_key(e.item, data) for e in entries]
    for child in children:
        index: dict[tuple[int, int, bytes], list[int]] = {}
        for pos, key in enumerate(keys):
            index.setdefault(key, []).append(pos)
        before: list[list[tuple[_Entry, tuple[int, int, bytes]]]] = [[] for _ in range(len(entries) + 1)]
        anchor = len(entries)
        for item in reversed(readers[child]):
            key = _key(item, data)
            positions = index.get(key)
            if positions:
                i = bisect.bisect_left(positions, anchor)
                pos = positions.pop(i - 1) if i else positions.pop()
                entries[pos].readers.add(child)
                anchor = min(anchor, pos)
            else:
                before[anchor].append((_Entry(item, {child}), key))
        merged: list[_Entry] = []
        merged_keys: list[tuple[int, int, bytes]] = []
        for pos in range(len(entries) + 1):
            for entry, key in reversed(before[pos]):
                merged.append(entry)
                merged_keys.append(key)
            if pos < len(entries):
                merged.append(entries[pos])
                merged_keys.append(keys[pos])
        entries, keys = merged, merged_keys
    return entries


def reader_checkpoint(entries: list[_Entry], reader: str) -> tuple[int, list[int]]:
    """(head, done ids) for ``reader`` when ``entries`` get ids 1, 2, 3 ...

    The items the reader's old journal did not hold count as consumed: a
    leading run of them is the head, the others the done set.
    """
    head = 0
    done: list[int] = []
    for id_, entry in enumerate(entries, 1):
        if reader in entry.readers:
            continue
        if head == id_ - 1:
            head = id_
        else:
            done.append(id_)
    return head, done


# --- writing --------------------------------------------------------------------------


def _fsync_write(path: str, chunks: list[bytes]) -> None:
    with open(path, "wb") as f:
        for chunk in chunks:
            f.write(chunk)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_queue(
    new_dir: str,
    queue: str,
    readers: dict[str, list[Kestrel2Item]],
    *,
    stamp: int,
    data: ItemData,
    on_bytes: ProgressBar | None = None,
) -> WrittenQueue:
    """Write one queue's segments and checkpoints; all of them or none.

    Every file is written and fsynced under a ``~~`` name, then renamed; a
    failure removes whatever this call created and re-raises.
    """
    entries = merge_readers(readers, data)
    temps: list[str] = []
    finals: list[str] = []
    renamed: list[str] = []
    done_bytes = 0
    try:
        out = None
        size = 0
        for id_, entry in enumerate(entries, 1):
            item = entry.item
            payload = data(item)
            header = codec.put_header(id_, item.add_time, len(payload), item.expire_time or 0)
            if out is None or (size + len(header) + len(payload) > SEGMENT_LIMIT and size > codec.MAGIC_SIZE):
                if out is not None:
                    out.flush()
                    os.fsync(out.fileno())
                    out.close()
                final = os.path.join(new_dir, segment_name(queue, stamp + len(finals)))
                finals.append(final)
                temps.append(final + TEMP_SUFFIX)
                out = open(temps[-1], "wb")  # noqa: SIM115 - closed above or in finally
                out.write(codec.WRITER_MAGIC)
                size = codec.MAGIC_SIZE
            out.write(header)
            out.write(payload)
            size += len(header) + len(payload)
            done_bytes += len(payload)
            if on_bytes is not None:
                on_bytes.update(done_bytes)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            out = None
        segments = list(finals)
        checkpoints: list[str] = []
        for reader in sorted(readers):
            head, done = reader_checkpoint(entries, reader)
            final = os.path.join(new_dir, checkpoint_name(queue, reader))
            finals.append(final)
            checkpoints.append(final)
            temps.append(final + TEMP_SUFFIX)
            _fsync_write(temps[-1], [codec.encode_checkpoint(head, done)])
        for temp, final in zip(temps, finals, strict=True):
            if os.path.exists(final):
                raise FileExistsError(f"{final} appeared during the import; not overwritten")
            os.rename(temp, final)
            renamed.append(final)
        _fsync_dir(new_dir)
    except BaseException:
        if out is not None:
            out.close()
        for path in temps + renamed:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise
    return WrittenQueue(queue, segments, checkpoints, len(entries))


