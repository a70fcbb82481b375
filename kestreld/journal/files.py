"""Names of the files in a queue folder, and telling them apart.

- writer segments ``<queue>.<epoch_ms>`` (numeric suffix, oldest first)
- reader checkpoints ``<queue>.read.<reader>`` (``<queue>.read.`` = default reader)
- temporaries: any name containing ``~~`` (deleted at start-up)
- ``.kestreld-status`` and ``.lock`` (server state)

Queue names follow :mod:`kestreld.names`.  Because a legal queue name has no
dot, everything before the first dot of a file name is its queue.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kestreld.journal.codec import MAGIC_SIZE, READER_MAGIC, WRITER_MAGIC

# The name rules live in kestreld.names; re-exported for the journal's own users.
from kestreld.names import (  # noqa: F401
    MAX_FANOUT_NAME,
    NAME_RE,
    is_legal_name,
    split_queue_name,
)

STATUS_FILE = ".kestreld-status"
LOCK_FILE = ".lock"
TEMP_MARK = "~~"
KESTREL2_OPCODES = frozenset(range(10))


def fsync_folder(folder: str) -> None:
    """Make the names in ``folder`` (creates, renames, unlinks) survive a power loss."""
    fd = os.open(folder or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_folders(path: str) -> None:
    """``os.makedirs`` whose new folders survive a power loss (each parent fsynced)."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    make_folders(parent)
    try:
        os.mkdir(path)
    except FileExistsError:
        return
    fsync_folder(parent)


def segment_name(queue: str, stamp: int) -> str:
    return f"{queue}.{stamp}"


def checkpoint_name(queue: str, reader: str) -> str:
    return f"{queue}.read.{reader}"


@dataclass(slots=True)
class QueueFiles:
    """The native files of one queue found in a folder."""

    queue: str
    segments: list[tuple[int, str]] = field(default_factory=list)  # (stamp, path), oldest first
    checkpoints: dict[str, str] = field(default_factory=dict)  # reader name -> path


@dataclass(slots=True)
class FolderScan:
    queues: dict[str, QueueFiles]
    temporaries: list[str]  # paths with ~~ in the name
    kestrel2: list[str]  # paths that look like Kestrel 2.x journals
    unknown: list[str]  # other files we leave alone


def _read_magic(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(MAGIC_SIZE)
    except OSError:
        return b""


def scan_folder(path: str) -> FolderScan:
    """Classify every file in a queue folder (no file is read beyond 4 bytes)."""
    queues: dict[str, QueueFiles] = {}
    temporaries: list[str] = []
    kestrel2: list[str] = []
    unknown: list[str] = []
    try:
        names = sorted(os.listdir(path))
    except FileNotFoundError:
        names = []
    for name in names:
        full = os.path.join(path, name)
        if name in (STATUS_FILE, LOCK_FILE) or not os.path.isfile(full):
            continue
        if TEMP_MARK in name:
            temporaries.append(full)
            continue
        queue, dot, rest = name.partition(".")
        if not is_legal_name(queue):
            # Native files never hold a "+", but Kestrel 2.x fanout children do
            # ("jobs+audit", "jobs+audit.100"): those must stop the server too.
            if split_queue_name(queue) is not None and (
                not dot or rest.isdigit() or rest.endswith(".pack")
            ):
                kestrel2.append(full)
            else:
                unknown.append(full)
            continue
        if not dot:
            # A bare queue name is the live file of a Kestrel 2.x journal.
            kestrel2.append(full)
            continue
        if rest.startswith("read."):
            reader = rest[5:]
            if reader == "" or is_legal_name(reader):
                queues.setdefault(queue, QueueFiles(queue)).checkpoints[reader] = full
            else:
                unknown.append(full)
            continue
        if rest.isdigit():
            magic = _read_magic(full)
            if (
                magic == WRITER_MAGIC
                or len(magic) < MAGIC_SIZE
                and WRITER_MAGIC.startswith(magic)
                or magic == bytes(MAGIC_SIZE)
            ):
                # A segment torn before its magic was complete is still ours (and empty);
                # so is one whose first sector a power loss left as a hole of zeros.
                queues.setdefault(queue, QueueFiles(queue)).segments.append((int(rest), full))
            elif magic[:1] and magic[0] in KESTREL2_OPCODES and magic != READER_MAGIC:
                kestrel2.append(full)
            else:
                unknown.append(full)
            continue
        if rest.endswith(".pack") and rest[:-5].isdigit():
            kestrel2.append(full)
            continue
        unknown.append(full)
    for files in queues.values():
        files.segments.sort()
    return FolderScan(queues, temporaries, kestrel2, unknown)


def unlink_quietly(path: str) -> None:
    """Remove a file that may already be gone (cleanup paths: the error is not news)."""
    try:
        os.unlink(path)
    except OSError:
        pass
