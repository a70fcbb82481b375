"""A large set held back while its queue's journal writes another large item.

Handed to the journal then, a large put would wait in the journal's buffer, and the
small puts of other connections that share its tick with it (``LargeWrites.busy``,
kestreld/journal/large_write.py).  The connection holds it back instead, with the input
behind it, and runs it when the journal calls it back; the queue's small puts are written,
and answered, meanwhile.  A connection holds at most one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: A set of at least this size may be held back: the journal's large-write threshold
#: (kestreld/journal/large_write.py).
HELD_BLOCK_BYTES = 512 * 1024


class HeldPut:
    """One held set: its request, and the connection's verb that runs it on its turn."""

    __slots__ = ("queues", "name", "request", "turn")

    def __init__(
        self, session: Any, name: str, request: tuple, turn: Callable[[HeldPut], None]
    ) -> None:
        self.queues = session.queues  # the session's queue collection
        self.name = name
        self.request = request  # what the connection needs to run it (a memcache set's parts)
        self.turn = turn  # called with this HeldPut once it may go

    def wait(self) -> bool:
        """Ask the queue's journal to call back once it may take a large put; False: it may
        now (the queue is gone or idle: run the set at once)."""
        queue = self.queues.queues.get(self.name)
        journal = queue.journal if queue is not None else None
        if journal is None or not journal.large.busy():
            return False
        journal.large.call_when_free(self._called)
        return True

    def _called(self) -> None:
        # Another large set may have taken the turn first: then wait again.
        if not self.wait():
            self.turn(self)


def hold(
    session: Any, name: str, request: tuple, turn: Callable[[HeldPut], None]
) -> HeldPut | None:
    """A :class:`HeldPut` of ``session``'s set to queue ``name``, waiting for its turn; None
    when the set may run now."""
    held = HeldPut(session, name, request, turn)
    return held if held.wait() else None
