"""A queued item and its metadata (libkestrel's ``QueueItem``)."""

from __future__ import annotations

import sys


class QueueItem:
    """One item.  Immutable by convention: fanout readers share the same object."""

    __slots__ = ("id", "add_time", "expire_time", "error_count", "data")

    def __init__(
        self, id: int, add_time: int, expire_time: int, error_count: int, data: bytes
    ) -> None:
        self.id = id
        self.add_time = add_time  # ms since the epoch
        self.expire_time = expire_time  # ms since the epoch, 0 = never
        self.error_count = error_count
        self.data = data

    @property
    def size(self) -> int:
        return len(self.data)

    def expired(self, now: int, max_age: int | None) -> bool:
        """True when ``min(expire_time, add_time + max_age) <= now``."""
        if self.expire_time and self.expire_time <= now:
            return True
        return bool(max_age) and self.add_time + max_age <= now  # type: ignore[operator]

    def aborted(self) -> QueueItem:
        """The same item with its error count raised, as an abort returns it."""
        return QueueItem(self.id, self.add_time, self.expire_time, self.error_count + 1, self.data)

    def __repr__(self) -> str:
        return f"QueueItem(id={self.id}, size={len(self.data)}, errors={self.error_count})"


def new_item(id_: int, add_time: int, expire_time: int, error_count: int, data: bytes) -> QueueItem:
    """A :class:`QueueItem` made as every put makes one: without the ``__init__`` call (a C
    allocation and five field writes when compiled)."""
    item = QueueItem.__new__(QueueItem)
    item.id = id_
    item.add_time = add_time
    item.expire_time = expire_time
    item.error_count = error_count
    item.data = data
    return item


def memory_overhead() -> int:
    """Bytes an item held in memory costs beside its data: what ``max_memory_size`` charges
    each item on top of ``len(data)``, so that a reader's items really stay within it.

    The item record (with its cycle-collector header, when it has one), the value's bytes
    header, what the allocator adds to the value (its chunk header and rounding, 16 bytes
    on average) and the item's slot in the queue.  As plain Python the id and add time are
    int objects of their own; compiled they are C fields of the record.
    """
    sample = new_item(1 << 40, 1 << 40, 0, 0, b"")
    record = -(-sys.getsizeof(sample) // 16) * 16  # Python's allocator hands out 16-byte steps
    cost = record + sys.getsizeof(b"") + 16 + 8
    if __file__.endswith(".py"):
        cost += 2 * sys.getsizeof(1 << 40)
    return cost
