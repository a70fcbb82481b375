"""Which journal files a ``load(...)`` path names, and how they are split into partitions.

A path is a queue folder (live or archive) or a single file.  Folders are
classified with :func:`kestreld.journal.files.scan_folder` (native files) and
:func:`kestreld.journal.kestrel2.journal_files` (Kestrel 2.x journals);
temporaries (``~~``) are skipped.  A segment found both in the live folder
and in the archive folder (moved while we listed) is read once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from enum import StrEnum

from kestreld.journal.codec import MAGIC_SIZE, READER_MAGIC, WRITER_MAGIC
from kestreld.journal.files import TEMP_MARK, scan_folder, split_queue_name


class FileKind(StrEnum):
    SEGMENT = "segment"
    CHECKPOINT = "checkpoint"
    KESTREL2 = "kestrel2"


@dataclass(slots=True)
class JournalFile:
    """One file to read.  ``paths`` are the places it may be, tried in order."""

    kind: FileKind
    name: str  # file name without folder; the ``segment`` column
    queue: str
    reader: str | None  # checkpoint / 2.x fanout reader; None for writer segments
    paths: list[str]
    size: int
    stamp: int = 0  # segment number (0 when the name has none)


@dataclass(slots=True)
class Listing:
    files: list[JournalFile] = field(default_factory=list)
    #: (path, offset, message) for files that cannot be read at all
    problems: list[tuple[str, int, str]] = field(default_factory=list)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAGIC_SIZE)
    except OSError:
        return b""


def _stamp(name: str) -> int:
    rest = name.partition(".")[2]
    rest = rest[: -len(".pack")] if rest.endswith(".pack") else rest
    return int(rest) if rest.isdigit() else 0


def _kestrel2_file(path: str, name: str) -> JournalFile | None:
    split = split_queue_name(name.partition(".")[0])
    if split is None:
        return None
    queue, reader = split
    return JournalFile(FileKind.KESTREL2, name, queue, reader, [path], _size(path), _stamp(name))


def _list_folder(folder: str, listing: Listing) -> None:
    found = scan_folder(folder)
    for files in found.queues.values():
        for stamp, path in files.segments:
            name = os.path.basename(path)
            listing.files.append(
                JournalFile(FileKind.SEGMENT, name, files.queue, None, [path], _size(path), stamp)
            )
        for reader, path in sorted(files.checkpoints.items()):
            name = os.path.basename(path)
            listing.files.append(
                JournalFile(FileKind.CHECKPOINT, name, files.queue, reader, [path], _size(path))
            )
    if found.kestrel2:
        from kestreld.journal.kestrel2 import journal_files

        for paths in journal_files(folder).values():
            for path in paths:
                jf = _kestrel2_file(path, os.path.basename(path))
                if jf is not None:
                    listing.files.append(jf)
    for path in found.unknown:
        name = os.path.basename(path)
        if name.partition(".")[2].isdigit():
            # Named like a segment but neither native nor 2.x: say so rather than skip silently.
            listing.problems.append((path, 0, "not a journal file (unknown header); skipped"))


def _list_file(path: str, listing: Listing) -> None:
    name = os.path.basename(path)
    queue, dot, rest = name.partition(".")
    magic = _magic(path)
    if TEMP_MARK in name:
        return
    if magic == READER_MAGIC or (dot and rest.startswith("read.")):
        if magic != READER_MAGIC and magic:
            listing.problems.append((path, 0, "not a reader checkpoint (bad magic)"))
            return
        listing.files.append(
            JournalFile(FileKind.CHECKPOINT, name, queue, rest[5:], [path], _size(path))
        )
    elif magic == WRITER_MAGIC or (rest.isdigit() and WRITER_MAGIC.startswith(magic)):
        listing.files.append(
            JournalFile(FileKind.SEGMENT, name, queue, None, [path], _size(path), _stamp(name))
        )
    else:
        jf = _kestrel2_file(path, name)
        if jf is None:
            listing.problems.append((path, 0, "not a journal file (unknown name)"))
        else:
            listing.files.append(jf)


def list_journal_files(paths: list[str], archive_path: str | None = None) -> Listing:
    """Every journal file under ``paths`` (and ``archive_path``), in a stable order.

    Order: by queue, then segments oldest first, checkpoints, 2.x files in
    replay order.  A path that does not exist is reported as a problem.
    """
    listing = Listing()
    roots = list(paths) + ([archive_path] if archive_path else [])
    for root in roots:
        if os.path.isdir(root):
            _list_folder(root, listing)
        elif os.path.isfile(root):
            _list_file(root, listing)
        elif root != archive_path:
            listing.problems.append((root, 0, "no such file or folder"))
    # One entry per segment name: the live copy first, the archived one as fallback.
    merged: dict[tuple[FileKind, str], JournalFile] = {}
    order: list[JournalFile] = []
    for jf in listing.files:
        key = (jf.kind, jf.name)
        seen = merged.get(key)
        if seen is None:
            merged[key] = jf
            order.append(jf)
        elif jf.kind is FileKind.SEGMENT:
            seen.paths.extend(p for p in jf.paths if p not in seen.paths)
            seen.size = max(seen.size, jf.size)
    if archive_path:
        # A live segment may be archived between listing and reading: look there next.
        for jf in order:
            moved = os.path.join(archive_path, jf.name)
            if jf.kind is FileKind.SEGMENT and moved not in jf.paths:
                jf.paths.append(moved)
    kind_rank = {FileKind.SEGMENT: 0, FileKind.CHECKPOINT: 1, FileKind.KESTREL2: 2}
    position = {id(jf): i for i, jf in enumerate(order)}
    order.sort(
        key=lambda jf: (
            jf.queue,
            kind_rank[jf.kind],
            jf.stamp if jf.kind is FileKind.SEGMENT else 0,
            position[id(jf)],
        )
    )
    listing.files = order
    return listing


def group_files(
    files: list[JournalFile],
    target_bytes: int = 32 << 20,
    max_files: int = 256,
    one_per_file_up_to: int = 32,
) -> list[list[JournalFile]]:
    """Partitions: one per file, except that many small neighbours share one.

    Up to ``one_per_file_up_to`` files, every file is its own partition.
    Beyond that, files are packed in order: a group closes once it holds
    ``target_bytes`` or ``max_files`` files, so big segments keep a partition
    each and hundreds of checkpoints do not become hundreds of tasks.
    """
    if len(files) <= one_per_file_up_to:
        return [[jf] for jf in files]
    groups: list[list[JournalFile]] = []
    current: list[JournalFile] = []
    current_bytes = 0
    for jf in files:
        if current and (current_bytes + jf.size > target_bytes or len(current) >= max_files):
            groups.append(current)
            current, current_bytes = [], 0
        current.append(jf)
        current_bytes += jf.size
    if current:
        groups.append(current)
    return groups
