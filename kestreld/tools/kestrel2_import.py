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
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from kestreld.journal import codec
from kestreld.journal.files import (
    checkpoint_name,
    fsync_folder,
    make_folders,
    scan_folder,
    segment_name,
    split_queue_name,
)
from kestreld.journal.kestrel2 import (
    ItemData,
    Kestrel2Folder,
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
    data_bytes: int


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
class MergedJournal:
    """The one item order of a queue's new journal (ids 1, 2, 3 ... in list order).

    ``holders[i]`` has bit ``bits[reader]`` set when that reader's old journal
    held ``items[i]`` (``""`` is the parent's default reader).
    """

    items: list[Kestrel2Item]
    holders: list[int]
    bits: dict[str, int]


def _key(item: Kestrel2Item, data: ItemData) -> bytes:
    h = hashlib.blake2b(struct.pack("<qq", item.add_time, item.size), digest_size=16)
    h.update(data(item))
    return h.digest()


def merge_readers(readers: dict[str, list[Kestrel2Item]], data: ItemData) -> MergedJournal:
    """One item order serving every reader (``readers[""]`` is the parent's items).

    Each child is aligned against the order built so far, from the tail
    backwards (readers consumed different prefixes of the same puts): a child
    item matches the latest unmatched equal item (same data and add time)
    before the previous match; child-only items go just before the next
    matched one.  An equal item found only out of order is still written once
    (that reader then sees it in the shared order).
    """
    names = ["", *sorted(r for r in readers if r)]
    bits = {name: 1 << n for n, name in enumerate(names)}
    items = list(readers.get("", []))
    holders = [1] * len(items)
    if len(names) == 1:
        return MergedJournal(items, holders, bits)
    keys = [_key(item, data) for item in items]
    for child in names[1:]:
        bit = bits[child]
        index: dict[bytes, list[int]] = {}
        for pos, key in enumerate(keys):
            index.setdefault(key, []).append(pos)
        before: dict[int, list[tuple[Kestrel2Item, bytes]]] = {}  # insertions, newest first
        anchor = len(items)
        for item in reversed(readers[child]):
            key = _key(item, data)
            positions = index.get(key)
            if positions:
                i = bisect.bisect_left(positions, anchor)
                pos = positions.pop(i - 1) if i else positions.pop()
                holders[pos] |= bit
                anchor = min(anchor, pos)
            else:
                before.setdefault(anchor, []).append((item, key))
        if not before:
            continue
        merged_items: list[Kestrel2Item] = []
        merged_holders: list[int] = []
        merged_keys: list[bytes] = []
        for pos in range(len(items) + 1):
            for item, key in reversed(before.get(pos, ())):
                merged_items.append(item)
                merged_holders.append(bit)
                merged_keys.append(key)
            if pos < len(items):
                merged_items.append(items[pos])
                merged_holders.append(holders[pos])
                merged_keys.append(keys[pos])
        items, holders, keys = merged_items, merged_holders, merged_keys
    return MergedJournal(items, holders, bits)


def reader_checkpoint(journal: MergedJournal, reader: str) -> tuple[int, list[int]]:
    """(head, done ids) for ``reader``: the items its old journal did not hold count as
    consumed; a leading run of them is the head, the others the done set.
    """
    bit = journal.bits[reader]
    head = 0
    done: list[int] = []
    for id_, holders in enumerate(journal.holders, 1):
        if holders & bit:
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


def write_queue(
    new_dir: str,
    queue: str,
    journal: MergedJournal,
    *,
    stamp: int,
    data: ItemData,
    progress: Callable[[int], None] | None = None,
) -> WrittenQueue:
    """Write one queue's segments and a checkpoint per reader; all of them or none.

    Every file is written and fsynced under a ``~~`` name, then renamed; a
    failure removes whatever this call created and re-raises.  ``progress``
    is called with the item bytes written so far.
    """
    temps: list[str] = []
    finals: list[str] = []
    renamed: list[str] = []
    done_bytes = 0
    try:
        out = None
        size = 0
        for id_, item in enumerate(journal.items, 1):
            payload = data(item)
            header = codec.put_header(id_, item.add_time, len(payload), item.expire_time or 0)
            if out is None or (
                size + len(header) + len(payload) > SEGMENT_LIMIT and size > codec.MAGIC_SIZE
            ):
                if out is not None:
                    out.flush()
                    os.fsync(out.fileno())
                    out.close()
                final = os.path.join(new_dir, segment_name(queue, stamp + len(finals)))
                finals.append(final)
                temps.append(final + TEMP_SUFFIX)
                out = open(temps[-1], "wb")  # closed on rotation, below, or on failure
                out.write(codec.WRITER_MAGIC)
                size = codec.MAGIC_SIZE
            out.write(header)
            out.write(payload)
            size += len(header) + len(payload)
            done_bytes += len(payload)
            if progress is not None:
                progress(done_bytes)
        if out is not None:
            out.flush()
            os.fsync(out.fileno())
            out.close()
            out = None
        segments = list(finals)
        checkpoints: list[str] = []
        for reader in sorted(journal.bits):
            head, done = reader_checkpoint(journal, reader)
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
        # Raises: an import is reported only once its names survive a power loss.
        fsync_folder(new_dir)
    except BaseException:
        if out is not None:
            out.close()
        for path in temps + renamed:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise
    return WrittenQueue(queue, segments, checkpoints, len(journal.items), done_bytes)


# --- the command ----------------------------------------------------------------------


@dataclass(slots=True)
class _Plan:
    folder: Kestrel2Folder
    groups: dict[str, list[str]]  # parent queue -> its fanout children, to import


def _plan(old_dir: str, new_dir: str, queues: list[str] | None) -> _Plan:
    """What to import; refuses (nothing written) on bad folders or existing native files."""
    if not os.path.isdir(old_dir):
        raise ImportRefused(f"{old_dir} is not a folder")
    if os.path.isdir(new_dir) and os.path.samefile(old_dir, new_dir):
        raise ImportRefused("NEW_DIR must not be OLD_DIR (old and new file names can collide)")
    if os.path.exists(new_dir) and not os.path.isdir(new_dir):
        raise ImportRefused(f"{new_dir} is not a folder")
    try:
        folder = scan_kestrel2_folder(old_dir)
    except OSError as e:
        raise ImportRefused(f"cannot list {old_dir}: {e.strerror or e}") from e
    groups: dict[str, list[str]] = {}
    for name in folder.queues:
        split = split_queue_name(name)
        if split is None:  # scan_kestrel2_folder only returns legal names
            continue
        parent, child = split
        children = groups.setdefault(parent, [])
        if child:
            children.append(child)
    if queues:
        for name in queues:
            split = split_queue_name(name)
            if split is None or split[1]:
                raise ImportRefused(
                    f"--queue {name}: give a queue name (its fanout children come with it)"
                )
            if name not in groups:
                raise ImportRefused(f"--queue {name}: no Kestrel 2.x journal for it in {old_dir}")
        groups = {name: groups[name] for name in queues}
    if os.path.isdir(new_dir):
        existing = scan_folder(new_dir)
        clashes = []
        for parent in sorted(groups):
            files = existing.queues.get(parent)
            if files is not None and (files.segments or files.checkpoints):
                clashes.append(parent)
            elif any(os.path.basename(p).partition(".")[0] == parent for p in existing.kestrel2):
                clashes.append(parent)
        if clashes:
            raise ImportRefused(
                f"{new_dir} already holds files of queue(s) {', '.join(clashes)}; "
                "nothing was written (remove them or import into another folder)"
            )
    return _Plan(folder, groups)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def print_summary(report: ImportReport, out: TextIO) -> None:
    """One row per queue and fanout child (empty ones too), then every fault and warning."""
    rows = [("queue", "files", "items", "bytes", "open returned", "faults", "warnings")]
    for name in sorted(report.replays):
        q = report.replays[name]
        rows.append(
            (
                name,
                str(len(q.files)),
                str(len(q.items)),
                str(sum(i.size for i in q.items)),
                str(q.result.open_returned),
                str(len(q.problems)),
                str(len(q.result.warnings)),
            )
        )
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    for row in rows:
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        print("  ".join(cells), file=out)
    for name in sorted(report.replays):
        q = report.replays[name]
        for p in q.problems:
            after = ""
            if p.dropped_bytes and q.files and p.path != q.files[-1]:
                after = "; replay went on with the next file"
            print(f"fault: {name}: {p}{after}", file=out)
        for p in q.result.warnings:
            print(f"warning: {name}: {p}", file=out)


def import_kestrel2(
    old_dir: str,
    new_dir: str,
    *,
    queues: list[str] | None = None,
    dry_run: bool = False,
    strict: bool = False,
    kestrel_2_0: bool = False,
    out: TextIO | None = None,
    err: TextIO | None = None,
    now_ms: int | None = None,
    progress_min_bytes: int = PROGRESS_MIN_BYTES,
) -> ImportReport:
    """Run an import.  ``exit_code`` in the report: 0, or 1 when it was refused,
    failed, or found faults under ``strict``.

    Nothing is written with ``dry_run``, with ``strict`` when any fault was
    found, or when the import is refused (``err`` says why).  A write failure
    leaves the queues written before it complete and nothing of the failed
    one.  ``now_ms`` is the import time (segment names, add time of ADD items).
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    report = ImportReport()
    import_time = int(time.time() * 1000) if now_ms is None else now_ms
    try:
        plan = _plan(old_dir, new_dir, queues)
    except ImportRefused as e:
        print(f"import-kestrel2: {e}", file=err)
        report.exit_code = 1
        return report
    files_of = plan.folder.queues

    names = sorted({*plan.groups, *(f"{p}+{c}" for p, cs in plan.groups.items() for c in cs)})
    total = sum(_file_size(path) for name in names for path in files_of.get(name, []))
    bar = ProgressBar("replaying", total, err, progress_min_bytes)
    done = 0
    for name in names:
        files = files_of.get(name, [])
        result = replay(
            files,
            kestrel_2_0=kestrel_2_0,
            import_time_ms=import_time,
            include_data=False,
            progress=lambda n, base=done: bar.update(base + n),
        )
        done += result.file_bytes
        result.items, too_large = _too_large(result)
        report.replays[name] = QueueReplay(name, files, result, result.problems + too_large)
    bar.finish()

    print(f"Kestrel 2.x journals in {old_dir}:", file=out)
    print_summary(report, out)
    for path in plan.folder.superseded:
        print(f"skipped: {os.path.basename(path)} (superseded by a pack file)", file=out)

    if strict and report.faults:
        print(f"--strict: {report.faults} fault(s); nothing written", file=out)
        report.exit_code = 1
        return report
    if dry_run:
        print("dry run: nothing written", file=out)
        return report

    # Durably: the files are fsynced into new_dir, so new_dir's own name must be too.
    make_folders(new_dir)
    with ItemData() as data:
        try:
            journals = {}
            for parent in sorted(plan.groups):
                readers = {"": report.replays[parent].items}
                for child in plan.groups[parent]:
                    readers[child] = report.replays[f"{parent}+{child}"].items
                journals[parent] = merge_readers(readers, data)
        except (OSError, ValueError) as e:
            print(f"import-kestrel2: reading the old journals failed: {e}", file=err)
            report.exit_code = 1
            return report
        total_bytes = sum(i.size for j in journals.values() for i in j.items)
        wbar = ProgressBar("writing", total_bytes, err, progress_min_bytes)
        written_bytes = 0
        for parent, journal in journals.items():
            try:
                written = write_queue(
                    new_dir,
                    parent,
                    journal,
                    stamp=import_time,
                    data=data,
                    progress=lambda n, base=written_bytes: wbar.update(base + n),
                )
            except (OSError, ValueError) as e:
                wbar.finish()
                print(f"import-kestrel2: writing queue {parent} failed: {e}", file=err)
                report.exit_code = 1
                break
            written_bytes += written.data_bytes
            report.written.append(written)
    if report.exit_code == 0:
        wbar.finish()
    for w in report.written:
        segments = f"{len(w.segments)} segment(s)" if w.segments else "no segment"
        ids = f" (ids 1-{w.items})" if w.items else ""
        cps = ", ".join(os.path.basename(c) for c in w.checkpoints)
        print(f"wrote {w.queue}: {w.items} item(s){ids} in {segments}; checkpoints {cps}", file=out)
    if report.exit_code:
        print(
            "the queue that failed has no files in NEW_DIR; fix the cause and import it again "
            "with --queue",
            file=out,
        )
    return report


def main(argv: list[str]) -> int:
    """``kestreld journal import-kestrel2 OLD_DIR NEW_DIR ...``; returns the exit code."""
    p = argparse.ArgumentParser(
        prog="kestreld journal import-kestrel2",
        description="Import Kestrel 2.x journals as native kestreld journal files.",
    )
    p.add_argument("old_dir", metavar="OLD_DIR", help="the Kestrel 2.x queue folder (read only)")
    p.add_argument("new_dir", metavar="NEW_DIR", help="the kestreld queue folder to write into")
    p.add_argument(
        "--queue",
        action="append",
        metavar="NAME",
        help="import only this queue and its fanout children (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="replay and report; write nothing")
    p.add_argument(
        "--strict", action="store_true", help="exit 1 and write nothing if any fault is found"
    )
    p.add_argument(
        "--kestrel-2.0",
        dest="kestrel_2_0",
        action="store_true",
        help="read opcode 8 as Kestrel 2.0's STATE_DUMP (default: 2.1+ CONTINUE)",
    )
    args = p.parse_args(argv)
    report = import_kestrel2(
        args.old_dir,
        args.new_dir,
        queues=args.queue,
        dry_run=args.dry_run,
        strict=args.strict,
        kestrel_2_0=args.kestrel_2_0,
    )
    return report.exit_code
