"""A FIFO that consumers can wait on: libkestrel's ConcurrentBlockingQueue, in asyncio form.

Items live in a deque; waiting consumers are futures in a second deque, oldest
first.  A put hands the item straight to the oldest live waiter (the airport
taxi line) and only queues it when nobody waits.  A waiter that timed out or
whose connection died is a done future and is skipped, so it never swallows
an item.  Everything runs on the event loop thread: no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

# Items are QueueItems; the type stays open so the class can be a compiled cdef class
# (blocking.pxd), which cannot derive from typing.Generic.
T = Any


class BlockingQueue:
    __slots__ = ("items", "waiters")

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        self.waiters: deque[asyncio.Future[T | None]] = deque()

    def __len__(self) -> int:
        return len(self.items)

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
        """Append at the tail, unless a waiter takes it first."""
        if not self.hand_off(item):
            self.items.append(item)

    def put_head(self, items: Iterable[T]) -> None:
        """Return items to the head in their original order (waiters served first)."""
        rest = [item for item in items if not self.hand_off(item)]
        self.items.extendleft(reversed(rest))

    def poll(self) -> T | None:
        return self.items.popleft() if self.items else None

    def peek(self) -> T | None:
        return self.items[0] if self.items else None

    def wait(
        self, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> asyncio.Future[T | None]:
        """A future for the next item; resolved with None after ``timeout`` seconds."""
        fut: asyncio.Future[T | None] = loop.create_future()
        waiters = self.waiters
        if len(waiters) > 32 and waiters[0].done():
            # Timed-out waiters pile up at the head when nothing arrives: prune them.
            self.waiters = waiters = deque(f for f in waiters if not f.done())
        waiters.append(fut)
        if timeout is not None:
            handle = loop.call_later(timeout, _expire, fut)
            fut.add_done_callback(lambda _f: handle.cancel())
        return fut

    def live_waiters(self) -> int:
        return sum(1 for f in self.waiters if not f.done())

    def wake_all(self) -> None:
        """Resolve every waiter with None (the queue was deleted or the server stops)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)


def _expire(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)
