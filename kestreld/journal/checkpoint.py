"""Reading a reader's progress file ``<queue>.read.<reader>``.

The file is a libkestrel checkpoint (READ_HEAD, READ_DONE) followed by the
READ_DONE records of every confirm, discard and expiry since its last rewrite,
and READ_HEAD jumps (see :mod:`kestreld.journal.progress`, which writes it).
Its state is the last READ_HEAD and the union of the READ_DONE ids above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kestreld.journal import codec


@dataclass(slots=True)
class Checkpoint:
    head: int
    done: set[int]
    problem: str | None = None  # set when the file was damaged and fell back
    #: Ids at or below the head still owed (reads open when a flush jumped past them).
    held: set[int] = field(default_factory=set)


def read_checkpoint(path: str) -> Checkpoint | None:
    """The state in the progress file at ``path``; None when there is no such file.

    A torn or corrupt tail (a crash in the middle of an append) is dropped:
    the state is that of the records before it, with ``problem`` saying what
    was cut; at worst confirmed items come back, none is lost.  A file whose
    head cannot be read yields head 0 (re-deliver, never lose).
    """
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        return Checkpoint(0, set(), f"cannot read: {e.strerror}")
    head, done, held, problem = codec.decode_progress(data)
    return Checkpoint(head, done, problem, held)
