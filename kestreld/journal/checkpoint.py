"""Reader checkpoints: ``<queue>.read.<reader>`` holding the head and the done-set.

A checkpoint is rewritten whole and atomically: ``<file>~~<ms>`` is written
and fsynced, then renamed over the old file, so a crash leaves either the old
or the new checkpoint, never a torn one.  The folder is fsynced after the
rename: until then a power loss brings the old checkpoint back (or none), and
a dead segment deleted on the strength of the new head could already be gone.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from kestreld.journal import codec
from kestreld.journal.files import fsync_folder


@dataclass(slots=True)
class Checkpoint:
    head: int
    done: set[int]
    problem: str | None = None  # set when the file was damaged and fell back


def read_checkpoint(path: str) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is no such file.

    A damaged file yields what could be read with ``problem`` set; a file
    whose head cannot be read yields head 0 (re-deliver, never lose).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        return Checkpoint(0, set(), f"cannot read: {e.strerror}")
    head, done, problem = codec.decode_checkpoint(data)
    if problem is not None:
        # The done-set may be partial: keep only the head, which is safe (at worst
        # confirmed items come back), unless the head itself was unreadable.
        done = set()
    return Checkpoint(head, done, problem)


def write_checkpoint(path: str, head: int, done: list[int] | tuple[int, ...] | set[int]) -> None:
    """Atomically replace the checkpoint at ``path`` (blocking: run off the event loop)."""
    tmp = f"{path}~~{int(time.time() * 1000)}"
    data = codec.encode_checkpoint(head, sorted(done))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        fsync_folder(os.path.dirname(path))
    except OSError:
        # A full disk fails every interval: leave no temporary behind each time.
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
