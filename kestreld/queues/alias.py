"""An alias: a name whose puts go to several queues (Kestrel 2.4's ``AliasedQueue``).

An alias holds nothing.  A put to it is a put to every destination queue; it
counts as stored only when every destination stored it.  Reads, deletes and
flushes of an alias see an empty queue (the collection answers them).
"""

from __future__ import annotations

from collections.abc import Callable

from kestreld.journal.batch import Batch, joined
from kestreld.journal.writer import JournalWriteError
from kestreld.queues.journaled_queue import QueueFull

#: Puts one item to one destination queue: ``(name, data, expire_time, now, error_count)``
#: -> the batch to wait on or None; raises QueueFull or JournalWriteError.
PutOne = Callable[[str, bytes, int, int, int], "Batch | None"]


class AliasedQueue:
    """One alias: its destinations (replaced by a reload) and its put counters."""

    __slots__ = ("name", "destinations", "put_items", "put_bytes")

    def __init__(self, name: str, destinations: tuple[str, ...]) -> None:
        self.name = name
        self.destinations = destinations
        self.put_items = 0  # items ever put to the alias
        self.put_bytes = 0

    def reconfigure(self, destinations: tuple[str, ...]) -> None:
        self.destinations = destinations

    def put(
        self, data: bytes, expire_time: int, now: int, put_one: PutOne, error_count: int = 0
    ) -> Batch | None:
        """Put to every destination; the batch resolves once all of theirs have.

        Every destination gets its put even when an earlier one refused it
        (Kestrel's rule); then QueueFull is raised (``NOT_STORED``).  A
        destination whose write failed makes the returned batch fail.
        """
        self.put_items += 1
        self.put_bytes += len(data)
        batches: list[Batch] = []
        refused: list[str] = []
        for name in self.destinations:
            try:
                batch = put_one(name, data, expire_time, now, error_count)
            except (QueueFull, JournalWriteError, OSError) as e:
                refused.append(f"{name}: {e}")
                continue
            if batch is not None and not batch.done:
                batches.append(batch)
            elif batch is not None and batch.error is not None:
                refused.append(f"{name}: {batch.error}")
        if refused:
            raise QueueFull(f"alias {self.name}: not stored in {'; '.join(refused)}")
        return joined(batches)  # one ticket: resolves once every destination's has

    def stats(self) -> dict[str, object]:
        """Kestrel's alias stats: exactly these three keys."""
        return {
            "put_items": self.put_items,
            "put_bytes": self.put_bytes,
            "children": ",".join(self.destinations),
        }
