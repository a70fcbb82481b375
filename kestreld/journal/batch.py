"""A group-commit ticket: what a put or a confirm waits on before it is acknowledged."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from kestreld.journal.clock import monotonic

if TYPE_CHECKING:
    from kestreld.journal.segment import Segment


class Batch:
    """Writes made together; resolved once written (and fsynced when required).

    The writer journal gives one to every put of an event-loop tick, and each
    reader's progress log one to every confirm of that tick; both resolve
    after the same write (and, with ``sync_journal = 0``, the same fsync).
    """

    __slots__ = (
        "done",
        "error",
        "first",
        "second",
        "callbacks",
        "started",
        "end_segment",
        "end_offset",
        "payload",
        "behind",
        "stored",
        "on_stored",
    )

    def __init__(self) -> None:
        self.started = monotonic()
        self.end_segment: Segment | None = None  # where its last put ends (puts only)
        self.end_offset = 0
        self.done = False
        self.error: str | None = None
        # The callbacks, in the order they were added: the first two in fields of their own
        # (a put's batch has the queue's and the session's), the rest in a list made for
        # the third (most batches have one or two: no list each).
        self.first: Callable[[Batch], None] | None = None
        self.second: Callable[[Batch], None] | None = None
        self.callbacks: list[Callable[[Batch], None]] | None = None
        self.payload: object = None  # what the batch's owner keeps with it (a queue: its puts)
        #: The batch whose large write was in flight when this one was made (None: none): this
        #: one may be on disk (stored) before that one resolves, and resolves after it.
        self.behind: Batch | None = None
        #: On disk (and synced as sync_journal asks) but not resolved yet: its puts' replies
        #: may go out, its items reach readers once the batches before it resolve.
        self.stored = False
        self.on_stored: list[Callable[[Batch], None]] | None = None

    def add_done_callback(self, fn: Callable[[Batch], None]) -> None:
        if self.done:
            fn(self)
        elif self.first is None:
            self.first = fn
        elif self.second is None:
            self.second = fn
        elif self.callbacks is None:
            self.callbacks = [fn]
        else:
            self.callbacks.append(fn)

    def add_stored_callback(self, fn: Callable[[Batch], None]) -> None:
        """``fn(batch)`` once the batch is stored or resolved, whichever comes first."""
        if self.done or self.stored:
            fn(self)
        elif self.on_stored is None:
            self.on_stored = [fn]
        else:
            self.on_stored.append(fn)

    def store(self) -> None:
        """Its writes are safe, ahead of its resolution (see :attr:`stored`)."""
        if self.done or self.stored:
            return
        self.stored = True
        callbacks, self.on_stored = self.on_stored, None
        if callbacks is not None:
            for fn in callbacks:
                fn(self)

    def resolve(self, error: str | None = None) -> None:
        if self.done:
            return
        self.done = True
        self.on_stored = None  # the done callbacks say it now
        self.behind = None  # resolved batches do not keep a chain of earlier ones alive
        self.error = error
        # Nothing is added once done (add_done_callback calls at once).
        first = self.first
        second = self.second
        callbacks = self.callbacks
        self.first = self.second = self.callbacks = None
        if first is not None:
            first(self)
        if second is not None:
            second(self)
        if callbacks is not None:
            for fn in callbacks:
                fn(self)


def joined(batches: list[Batch | None]) -> Batch | None:
    """One ticket for several (``flush_all``): resolves once all did, with the first error."""
    waiting = [b for b in batches if b is not None and not (b.done and b.error is None)]
    if not waiting:
        return None
    if len(waiting) == 1:
        return waiting[0]
    together = Batch()
    left = [len(waiting)]
    errors: list[str] = []

    def one_done(batch: Batch) -> None:
        if batch.error is not None:
            errors.append(batch.error)
        left[0] -= 1
        if not left[0]:
            together.resolve(errors[0] if errors else None)

    for batch in waiting:
        batch.add_done_callback(one_done)
    return together
