"""A FIFO that consumers can wait on: libkestrel's ConcurrentBlockingQueue, in asyncio form.

Items live in a deque; waiting consumers are futures in a second deque, oldest
first.  A put hands the item straight to the oldest live waiter (the airport
taxi line) and only queues it when nobody waits.  A waiter that timed out or
whose connection died is a done future and is skipped, so it never swallows
an item; such dead waiters are pruned once they make up half the line, so a
long-waiting get cannot make short polls behind it pile up.  Everything runs
on the event loop thread: no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

# Items are QueueItems; the type stays open so the class can be a compiled cdef class
# (blocking.pxd), which cannot derive from typing.Generic.
T = Any

#: Dead waiters tolerated before the line is pruned (then: once they are half of it).
PRUNE_AFTER = 32


class BlockingQueue:
    __slots__ = ("items", "waiters", "dead")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self.waiters: deque[asyncio.Future[T | None]] = deque()
        self.dead = 0  # waiters resolved since the last prune (some may be gone already)

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def hand_off(self, item: T) -> bool:
        """Give ``item`` to the oldest live waiter; False when nobody is waiting."""
        waiters = self.waiters
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(item)
                return True
        return False

    def put(self, item: T) -> None:
        """Append at the tail (no hand-off: the caller offered it to waiters first)."""
        self.items.append(item)

    def put_first(self, item: T) -> None:
        """Put ``item`` back at the head (no hand-off)."""
        self.items.appendleft(item)

    def put_head(self, items: Iterable[T]) -> None:
        """Return items to the head in their original order (no hand-off)."""
        self.items.extendleft(reversed(list(items)))

    def poll(self) -> T | None:
        return self.items.popleft() if self.items else None

    def peek(self) -> T | None:
        return self.items[0] if self.items else None

    def clear(self) -> None:
        self.items.clear()

    def wait(
        self, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> asyncio.Future[T | None]:
        """A future for the next item; resolved with None after ``timeout`` seconds."""
        fut: asyncio.Future[T | None] = loop.create_future()
        self.waiters.append(fut)
        if timeout is not None:
            handle = loop.call_later(timeout, _expire, fut)
            fut.add_done_callback(_Cancel(handle, self))
        else:
            fut.add_done_callback(self.waiter_done)
        return fut

    def waiter_done(self, _fut: Any = None) -> None:
        """A waiter resolved (timed out, cancelled or served): prune the dead ones now and then."""
        self.dead += 1
        waiters = self.waiters
        if self.dead > PRUNE_AFTER and self.dead * 2 > len(waiters):
            self.dead = 0
            self.waiters = deque(f for f in waiters if not f.done())

    def live_waiters(self) -> int:
        return sum(1 for f in self.waiters if not f.done())

    def wake_all(self) -> None:
        """Resolve every waiter with None (the queue was deleted or the server stops)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)


class _Cancel:
    """A timed waiter resolved: cancel its timer and tell its queue (no closure per waiter)."""

    __slots__ = ("handle", "queue")

    def __init__(self, handle: asyncio.TimerHandle, queue: BlockingQueue) -> None:
        self.handle = handle
        self.queue = queue

    def __call__(self, _fut: Any) -> None:
        self.handle.cancel()
        self.queue.waiter_done()


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
