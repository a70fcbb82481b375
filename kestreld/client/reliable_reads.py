"""Iterators of reliable reads: each next item confirms the previous one in the same round trip.

Kestrel's reliable-read loop is ``get q/close/open``: confirm the item this
connection holds and open the next one.  The iterator keeps to the server
that gave it the last item while that server has more, then polls the whole
cluster again; after ``switch_after`` items in a row from one server it
polls the cluster anyway, so a busy server cannot starve the others.

Use them as context managers: leaving the ``with`` block normally confirms
the item in hand, leaving it by an exception aborts that item (it goes back
to the head of its queue).  An iteration that runs out (no item within the
timeout) has nothing open.  Without ``with``, an item in hand when the loop
is left by ``break`` or an exception stays open until the client is
closed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kestreld.client.item import Item

if TYPE_CHECKING:
    from kestreld.client.async_client import AsyncClient
    from kestreld.client.sync_client import Client


class ReliableReads:
    """``for item in client.reliable_reads("jobs", timeout=5.0)``: open items, one at a time."""

    def __init__(
        self, client: Client, queue: str, timeout: float | None, switch_after: int
    ) -> None:
        self.client = client
        self.queue = queue
        self.timeout = timeout
        self.switch_after = max(1, switch_after)
        #: The item handed out last (open until the next one is asked for).
        self.current: Item | None = None
        self._streak = 0
        self._finished = False

    def __iter__(self) -> ReliableReads:
        return self

    def __next__(self) -> Item:
        if self._finished:
            raise StopIteration
        prev, self.current = self.current, None
        if prev is not None and prev.is_open:
            if self._streak < self.switch_after:
                item = self.client.confirm_and_open(prev)
                if item is not None:
                    self._streak += 1
                    self.current = item
                    return item
            else:
                self.client.confirm(prev)
        item = self.client.open(self.queue, self.timeout)
        if item is None:
            self._finished = True
            raise StopIteration
        self._streak = 1
        self.current = item
        return item

    def __enter__(self) -> ReliableReads:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._finished = True
        item, self.current = self.current, None
        if item is None or not item.is_open:
            return
        if exc_type is None:
            self.client.confirm(item)
        else:
            self.client.abort(item)


class AsyncReliableReads:
    """``async for item in client.reliable_reads("jobs", timeout=5.0)``: open items, one at a time."""

    def __init__(
        self, client: AsyncClient, queue: str, timeout: float | None, switch_after: int
    ) -> None:
        self.client = client
        self.queue = queue
        self.timeout = timeout
        self.switch_after = max(1, switch_after)
        #: The item handed out last (open until the next one is asked for).
        self.current: Item | None = None
        self._streak = 0
        self._finished = False

    def __aiter__(self) -> AsyncReliableReads:
        return self

    async def __anext__(self) -> Item:
        if self._finished:
            raise StopAsyncIteration
        prev, self.current = self.current, None
        if prev is not None and prev.is_open:
            if self._streak < self.switch_after:
                item = await self.client.confirm_and_open(prev)
                if item is not None:
                    self._streak += 1
                    self.current = item
                    return item
            else:
                await self.client.confirm(prev)
        item = await self.client.open(self.queue, self.timeout)
        if item is None:
            self._finished = True
            raise StopAsyncIteration
        self._streak = 1
        self.current = item
        return item

    async def __aenter__(self) -> AsyncReliableReads:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        self._finished = True
        item, self.current = self.current, None
        if item is None or not item.is_open:
            return
        if exc_type is None:
            await self.client.confirm(item)
        else:
            await self.client.abort(item)
