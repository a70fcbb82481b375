"""A group-commit ticket: what a put or a confirm waits on before it is acknowledged."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kestreld.journal.writer import Segment


class Batch:
    """Writes made together; resolved once written (and fsynced when required).

    The writer journal gives one to every put of an event-loop tick, and each
    reader's progress log one to every confirm of that tick; both resolve
    after the same write (and, with ``sync_journal = 0``, the same fsync).
    """

    __slots__ = ("done", "error", "callbacks", "started", "end_segment", "end_offset")

    def __init__(self) -> None:
        self.started = time.perf_counter()
        self.end_segment: Segment | None = None  # where its last put ends (puts only)
        self.end_offset = 0
        self.done = False
        self.error: str | None = None
        self.callbacks: list[Callable[[Batch], None]] = []

    def add_done_callback(self, fn: Callable[[Batch], None]) -> None:
        if self.done:
            fn(self)
        else:
            self.callbacks.append(fn)

    def resolve(self, error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.error = error
        callbacks = self.callbacks
        self.callbacks = []
        for fn in callbacks:
            fn(self)
