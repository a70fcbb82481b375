"""``kestreld journal dump PATH... [--stats] [--kestrel-2.0]``: journal files, readably.

Native writer segments and reader checkpoints are decoded with
:mod:`kestreld.journal.codec`, Kestrel 2.x journals with
:mod:`kestreld.journal.kestrel2`; nothing here decodes bytes itself.  A
folder argument means every journal file in it; every other file of the
folder is named on stderr with the reason it was left out.

Each record is one line: offset, operation, ids, times (ISO-8601 UTC, ``Z``),
sizes and a short escaped preview of the data.  ``--stats`` prints one
summary line per file instead.  A damaged or truncated tail is reported
after the records before it and named on stderr; it never stops the dump
of the next file, and makes the exit status 1 (a health check can rely on
``journal dump --stats FOLDER`` exiting 0 only when nothing is damaged).
Files are memory-mapped and decoded in batches, so any size can be dumped.
"""

from __future__ import annotations

import argparse
import datetime as dt
import mmap
import os
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TextIO

from kestreld.journal import codec
from kestreld.journal.files import LOCK_FILE, STATUS_FILE, TEMP_MARK, split_queue_name
from kestreld.journal.kestrel2 import Kestrel2Op, scan_kestrel2

PREVIEW_BYTES = 32
BATCH = 10_000

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def iso_time(ms: int) -> str:
    """``2023-11-14T22:13:20.000Z`` for ms since the epoch (the raw number if out of range)."""
    try:
        t = _EPOCH + dt.timedelta(milliseconds=ms)
    except OverflowError:
        return f"{ms}ms"
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def preview(data: bytes | None, limit: int = PREVIEW_BYTES) -> str:
    """The first ``limit`` bytes, quoted, with non-printable bytes escaped."""
    if data is None:
        return "-"
    out = []
    for b in data[:limit]:
        if b == 0x22 or b == 0x5C:
            out.append("\\" + chr(b))
        elif 0x20 <= b < 0x7F:
            out.append(chr(b))
        elif b == 0x0A:
            out.append("\\n")
        elif b == 0x09:
            out.append("\\t")
        elif b == 0x0D:
            out.append("\\r")
        else:
            out.append(f"\\x{b:02x}")
    more = f"...(+{len(data) - limit})" if len(data) > limit else ""
    return '"' + "".join(out) + '"' + more


def id_ranges(ids: list[int]) -> str:
    """``[3-5, 9, 12-13]``: every id, runs folded."""
    parts = []
    run_start = prev = None
    for i in sorted(ids):
        if prev is not None and i == prev + 1:
            prev = i
            continue
        if run_start is not None:
            parts.append(f"{run_start}-{prev}" if prev != run_start else f"{run_start}")
        run_start = prev = i
    if run_start is not None:
        parts.append(f"{run_start}-{prev}" if prev != run_start else f"{run_start}")
    return "[" + ", ".join(parts) + "]"


# --- reading files --------------------------------------------------------------------


class _Mapped:
    """A file's bytes, memory-mapped (plain bytes for an empty file)."""

    def __init__(self, path: str) -> None:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self.map: mmap.mmap | None = None
            if size:
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.buf: bytes | mmap.mmap = self.map if self.map is not None else b""

    def close(self) -> None:
        if self.map is not None:
            self.map.close()

    def __enter__(self) -> _Mapped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _all_zero(buf: bytes | mmap.mmap, start: int) -> bool:
    step = 1 << 20
    for pos in range(start, len(buf), step):
        chunk = buf[pos : pos + step]
        if chunk.count(0) != len(chunk):
            return False
    return True


def _native_records(buf: bytes | mmap.mmap, include_data: bool) -> Iterator[codec.Record | str]:
    """Every record after the magic, then (if decoding stopped early) a problem string."""
    pos = codec.MAGIC_SIZE
    while True:
        res = codec.scan(buf, pos, include_data=include_data, limit=BATCH)
        yield from res.records
        if res.status == codec.Status.CORRUPT:
            yield f"corrupt record at offset {res.pos}: {res.problem}"
            return
        if res.status == codec.Status.END:
            if not _all_zero(buf, res.pos):
                yield f"data after the end marker at offset {res.pos}"
            return
        if res.pos >= len(buf):
            return
        if len(res.records) < BATCH:
            yield f"truncated record at offset {res.pos} ({len(buf) - res.pos} bytes cut)"
            return
        pos = res.pos


def _kestrel2_ops(
    buf: bytes | mmap.mmap, kestrel_2_0: bool, include_data: bool
) -> Iterator[Kestrel2Op | str]:
    pos = 0
    while True:
        ops, pos, problem = scan_kestrel2(
            buf, pos, kestrel_2_0=kestrel_2_0, include_data=include_data, limit=BATCH
        )
        yield from ops
        if problem is not None:
            yield f"{problem}; {len(buf) - pos} bytes not decoded"
            return
        if pos >= len(buf):
            return


_TITLES = {
    "writer": "writer segment",
    "reader": "reader checkpoint",
    "kestrel2": "Kestrel 2.x journal",
}


def file_kind(path: str) -> str | None:
    """``"writer"``, ``"reader"``, ``"kestrel2"``, or None for a file that is no journal.

    Native files are known by their magic.  A file is taken as Kestrel 2.x
    when its name has a 2.x journal's form (``q``, ``q.<ms>``, ``q.<ms>.pack``)
    and it is empty or starts with a 2.x opcode.
    """
    try:
        with open(path, "rb") as f:
            magic = f.read(codec.MAGIC_SIZE)
    except OSError:
        return None
    kind = codec.file_kind(magic)
    if kind is codec.FileKind.WRITER:
        return "writer"
    if kind is codec.FileKind.READER:
        return "reader"
    name = os.path.basename(path)
    queue, dot, rest = name.partition(".")
    if len(magic) < codec.MAGIC_SIZE and magic and rest.isdigit():
        if codec.WRITER_MAGIC.startswith(magic):
            return "writer"  # torn before its magic was complete
    named_2x = not dot or rest.isdigit() or (rest.endswith(".pack") and rest[:-5].isdigit())
    if split_queue_name(queue) is not None and named_2x and (not magic or magic[0] <= 9):
        return "kestrel2"
    return None


@dataclass(slots=True)
class Skipped:
    """A file of a folder that is not dumped, and why; ``damaged`` when it should have been."""

    path: str
    reason: str
    damaged: bool


def _named_native(name: str) -> str | None:
    """``"reader"`` or ``"writer"`` when a name has a native file's form, else None."""
    queue, dot, rest = name.partition(".")
    if not dot or split_queue_name(queue) is None:
        return None
    if rest.startswith("read."):
        return "reader"
    return "writer" if rest.isdigit() else None


def _skip_reason(path: str) -> Skipped:
    """Why a file that :func:`file_kind` does not recognise is left out."""
    name = os.path.basename(path)
    if name in (STATUS_FILE, LOCK_FILE):
        return Skipped(path, "server state, not a journal file", damaged=False)
    named = _named_native(name)
    if named is None:
        return Skipped(path, "not a journal file", damaged=False)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            magic = f.read(codec.MAGIC_SIZE)
    except OSError as e:
        return Skipped(path, f"cannot be read: {e.strerror}", damaged=True)
    title = _TITLES[named]
    if size == 0:
        return Skipped(path, f"named as a {title} but empty (0 bytes)", damaged=True)
    return Skipped(
        path,
        f"named as a {title} but does not start with its magic "
        f"(first bytes {magic.hex()}, {size} bytes)",
        damaged=True,
    )


def folder_files(folder: str) -> tuple[list[tuple[str, str]], list[Skipped]]:
    """The journal files of a folder as ``(path, kind)``, sorted by name, and every file skipped.

    Temporaries, server state and files that are no journal are skipped with
    their reason; a file named as a native journal file that does not decode
    as one is skipped as damaged.  Subfolders are not entered.
    """
    found: list[tuple[str, str]] = []
    skipped: list[Skipped] = []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isdir(path):
            skipped.append(Skipped(path, "a folder (folders are not entered)", damaged=False))
            continue
        if not os.path.isfile(path):
            skipped.append(Skipped(path, "not a regular file", damaged=False))
            continue
        if TEMP_MARK in name:
            skipped.append(
                Skipped(path, "a temporary (the server deletes it at start-up)", damaged=False)
            )
            continue
        kind = file_kind(path)
        if kind is None:
            skipped.append(_skip_reason(path))
        else:
            found.append((path, kind))
    return found, skipped


# --- printing -------------------------------------------------------------------------


@dataclass(slots=True)
class FileStats:
    """The ``--stats`` summary of one file."""

    records: int = 0
    items: int = 0
    data_bytes: int = 0
    min_id: int | None = None
    max_id: int | None = None
    head: int | None = None  # reader checkpoints
    problems: list[str] = field(default_factory=list)
    by_op: Counter[str] = field(default_factory=Counter)

    def see_id(self, id_: int) -> None:
        self.min_id = id_ if self.min_id is None else min(self.min_id, id_)
        self.max_id = id_ if self.max_id is None else max(self.max_id, id_)


def _expire(ms: int | None) -> str:
    return iso_time(ms) if ms else "never"


def _put_line(rec: codec.Put) -> str:
    return (
        f"{rec.offset:>10}  PUT         id={rec.id} add={iso_time(rec.add_time)} "
        f"expire={_expire(rec.expire_time)} size={rec.size} errors={rec.error_count} "
        f"data={preview(rec.data)}"
    )


def _dump_native(buf: bytes | mmap.mmap, stats_only: bool, out: TextIO) -> FileStats:
    stats = FileStats()
    if len(buf) < codec.MAGIC_SIZE:
        stats.problems.append(f"torn before its magic was complete ({len(buf)} bytes, no records)")
        return stats
    for rec in _native_records(buf, include_data=not stats_only):
        if isinstance(rec, str):
            stats.problems.append(rec)
            continue
        stats.records += 1
        if isinstance(rec, codec.Put):
            stats.items += 1
            stats.data_bytes += rec.size
            stats.see_id(rec.id)
            stats.by_op["PUT"] += 1
            if not stats_only:
                print(_put_line(rec), file=out)
        elif isinstance(rec, codec.ReadHead):
            stats.by_op["READ_HEAD"] += 1
            stats.head = rec.id
            if not stats_only:
                print(f"{rec.offset:>10}  READ_HEAD   id={rec.id}", file=out)
        elif isinstance(rec, codec.ReadDone):
            stats.by_op["READ_DONE"] += 1
            stats.items += len(rec.ids)
            for i in rec.ids:
                stats.see_id(i)
            if not stats_only:
                print(
                    f"{rec.offset:>10}  READ_DONE   count={len(rec.ids)} ids={id_ranges(rec.ids)}",
                    file=out,
                )
        else:
            stats.by_op[f"command {rec.command}"] += 1
            if not stats_only:
                print(
                    f"{rec.offset:>10}  UNKNOWN     command={rec.command} length={rec.length} "
                    "(skipped)",
                    file=out,
                )
    return stats


def _op_line(op: Kestrel2Op) -> str:
    parts = [f"{op.offset:>10}  {op.name:<20}"]
    if op.xid is not None:
        parts.append(f"xid={op.xid}")
    if op.count is not None:
        parts.append(f"count={op.count}")
    if op.size is not None:
        parts.append(f"add={iso_time(op.add_time) if op.add_time is not None else '(import time)'}")
        parts.append(f"expire={_expire(op.expire_time)}")
        parts.append(f"size={op.size}")
        parts.append(f"data={preview(op.data)}")
    return " ".join(parts).rstrip()


def _dump_kestrel2(
    buf: bytes | mmap.mmap, stats_only: bool, kestrel_2_0: bool, out: TextIO
) -> FileStats:
    stats = FileStats()
    for op in _kestrel2_ops(buf, kestrel_2_0, include_data=not stats_only):
        if isinstance(op, str):
            stats.problems.append(op)
            continue
        stats.records += 1
        stats.by_op[op.name] += 1
        if op.size is not None:
            stats.items += 1
            stats.data_bytes += op.size
        if op.xid is not None:
            stats.see_id(op.xid)
        if not stats_only:
            print(_op_line(op), file=out)
    return stats


def dump_file(
    path: str, kind: str, *, stats_only: bool, kestrel_2_0: bool, out: TextIO
) -> FileStats:
    """Print one file (records, or with ``stats_only`` the summary line); returns its stats."""
    with _Mapped(path) as mapped:
        buf = mapped.buf
        size = len(buf)
        if not stats_only:
            print(f"== {path}: {_TITLES[kind]}, {size} bytes", file=out)
        if kind == "kestrel2":
            stats = _dump_kestrel2(buf, stats_only, kestrel_2_0, out)
        else:
            stats = _dump_native(buf, stats_only, out)
    if stats_only:
        print(_stats_line(path, kind, size, stats), file=out)
    else:
        for problem in stats.problems:
            print(f"   problem: {problem}", file=out)
    return stats


def _stats_line(path: str, kind: str, size: int, stats: FileStats) -> str:
    problems = "; ".join(stats.problems) if stats.problems else "none"
    if kind == "reader":
        span = f"{stats.min_id}-{stats.max_id}" if stats.min_id is not None else "none"
        what = f"head {stats.head}, {stats.items} done id(s) ({span})"
    else:
        ids = "ids" if kind == "writer" else "xids"
        span = f"{stats.min_id}-{stats.max_id}" if stats.min_id is not None else "none"
        noun = "records" if kind == "writer" else "ops"
        what = f"{stats.records} {noun}, {stats.items} items, {stats.data_bytes} data bytes, {ids} {span}"
        if kind == "kestrel2" and stats.by_op:
            what += " (" + ", ".join(f"{k} {v}" for k, v in sorted(stats.by_op.items())) + ")"
    return f"{path}: {_TITLES[kind]}, {size} bytes, {what}, problems: {problems}"


def main(argv: list[str], out: TextIO | None = None, err: TextIO | None = None) -> int:
    """``kestreld journal dump``.  Returns 0, or 1 when anything was missing or damaged.

    Every file left out and every damaged file is named on ``err`` with its
    reason (``journal dump: PATH: skipped: ...`` / ``damaged: ...``); the other
    files are dumped all the same.  Damaged means a file named as a journal
    that is not one, or a journal whose records stop at a problem (also shown
    in its dump); a temporary or a file that is no journal is only named.
    """
    out = sys.stdout if out is None else out
    err = sys.stderr if err is None else err
    p = argparse.ArgumentParser(
        prog="kestreld journal dump",
        description="Print native kestreld journal files and Kestrel 2.x journals record by record. "
        "Files left out and damage found are named on stderr; the exit status is 1 when any "
        "path was missing or any file damaged.",
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="journal files or queue folders")
    p.add_argument("--stats", action="store_true", help="one summary line per file instead")
    p.add_argument(
        "--kestrel-2.0",
        dest="kestrel_2_0",
        action="store_true",
        help="read 2.x opcode 8 as Kestrel 2.0's STATE_DUMP (default: CONTINUE)",
    )
    args = p.parse_args(argv)
    status = 0
    for arg in args.paths:
        if os.path.isdir(arg):
            try:
                files, skipped = folder_files(arg)
            except OSError as e:
                print(f"journal dump: {arg}: {e.strerror}", file=err)
                status = 1
                continue
            for skip in skipped:
                label = "damaged" if skip.damaged else "skipped"
                print(f"journal dump: {skip.path}: {label}: {skip.reason}", file=err)
                if skip.damaged:
                    status = 1
            if not files:
                print(f"{arg}: no journal files", file=out)
        elif os.path.isfile(arg):
            kind = file_kind(arg)
            if kind is None:
                skip = _skip_reason(arg)
                why = f" ({skip.reason})" if skip.damaged else ""
                print(f"journal dump: {arg}: not a journal file{why}", file=err)
                status = 1
                continue
            files = [(arg, kind)]
        else:
            print(f"journal dump: {arg}: no such file or folder", file=err)
            status = 1
            continue
        for path, kind in files:
            try:
                stats = dump_file(
                    path, kind, stats_only=args.stats, kestrel_2_0=args.kestrel_2_0, out=out
                )
            except OSError as e:
                print(f"journal dump: {path}: {e.strerror or e}", file=err)
                status = 1
                continue
            for problem in stats.problems:
                print(f"journal dump: {path}: damaged: {problem}", file=err)
                status = 1
    return status
