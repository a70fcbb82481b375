"""Which worker owns a queue: a stable function of the queue's name and the worker count.

A fanout reader ``orders+audit`` lives with its queue ``orders`` (the base name decides),
so a queue's readers, journals and progress files stay in one process and every journal
keeps one writer.  The function depends on nothing but the name and N: a restart with the
same N finds the same owner, and one with another N moves no file (each worker just opens
the queues it owns now).
"""

from __future__ import annotations

import zlib


def owner_of(name: bytes | str, count: int) -> int:
    """The index (0 .. count-1) of the worker owning queue or reader ``name``."""
    if count <= 1:
        return 0
    raw = name.encode("ascii", "replace") if isinstance(name, str) else name
    plus = raw.find(b"+")
    if plus >= 0:
        raw = raw[:plus]
    return zlib.crc32(raw) % count


class Ownership:
    """Worker ``index`` of ``count``: what it owns (the queue collection asks at load and
    before creating a queue)."""

    __slots__ = ("index", "count")

    def __init__(self, index: int, count: int) -> None:
        self.index = index
        self.count = count

    def owns(self, name: str) -> bool:
        return owner_of(name, self.count) == self.index

    def owner(self, name: bytes | str) -> int:
        return owner_of(name, self.count)
