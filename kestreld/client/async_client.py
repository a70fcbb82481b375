"""The asyncio client: the same API as :class:`kestreld.client.Client`, awaited.

Usable from many tasks of one event loop at once (each request takes its
own connection from the server's pool); an open :class:`Item` and an
:class:`AsyncReliableReads` belong to the task that holds them.  Cancelling
a request closes its connection, so the server gives back an item it was
reserving; an item taken by a cancelled plain :meth:`AsyncClient.get` may be
lost, as with any non-reliable read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from operator import methodcaller
from typing import TypeVar

from kestreld.client.async_connection import AsyncConnection
from kestreld.client.errors import ConnectionFailed, KestrelError
from kestreld.client.item import Item
from kestreld.client.operations import ClusterOperations, Operation, Run
from kestreld.client.reliable_reads import AsyncReliableReads
from kestreld.client.stats import ServerStats, parse_stats
from kestreld.client.wire import Data, Expiry, check_queue_name, check_status

T = TypeVar("T")
Request = Callable[[AsyncConnection], Awaitable[T]]


class AsyncClient(ClusterOperations[AsyncConnection]):
    """An asyncio client of a cluster of kestreld servers.

    Constructed like :class:`kestreld.client.Client`, with the same
    cluster behaviour (random writes, reads polling every server, failover
    and down periods); every request method is a coroutine.  Close it with
    ``await client.close()`` or ``async with AsyncClient([...]) as client``.
    """

    connection = AsyncConnection

    # --- writes -----------------------------------------------------------------------

    async def put(self, queue: str, data: Data, expiry: Expiry = None) -> bool:
        """Add one item to ``queue`` on some server; as :meth:`Client.put`."""
        return await self._drive(self._put(queue, data, expiry))

    async def put_many(self, queue: str, items: Iterable[Data], expiry: Expiry = None) -> int:
        """Add many items to ``queue``, pipelined; as :meth:`Client.put_many`."""
        return await self._drive(self._put_many(queue, items, expiry))

    # --- reads --------------------------------------------------------------------------

    async def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take an item from ``queue`` on any server, for good; as :meth:`Client.get`."""
        return await self._drive(self._get(queue, timeout))

    async def peek(self, queue: str) -> bytes | None:
        """The item at the head of ``queue`` on the first server that has one, left in place."""
        return await self._drive(self._peek(queue))

    async def open(self, queue: str, timeout: float | None = None) -> Item | None:
        """Reserve an item of ``queue``; as :meth:`Client.open`."""
        return await self._drive(self._open(queue, timeout))

    @contextlib.asynccontextmanager
    async def reserve(self, queue: str, timeout: float | None = None) -> AsyncIterator[Item | None]:
        """A reliable read as an async context manager; as :meth:`Client.reserve`.

        ``async with client.reserve("jobs", timeout=1.0) as item:`` confirms
        on a normal exit and aborts on an exception (cancellation included).
        """
        item = await self.open(queue, timeout)
        if item is None:
            yield None
            return
        try:
            yield item
        except BaseException:
            if item.is_open:
                with contextlib.suppress(KestrelError):
                    await self.abort(item)
            raise
        if item.is_open:
            await self.confirm(item)

    def reliable_reads(
        self, queue: str, timeout: float | None = None, *, switch_after: int = 100
    ) -> AsyncReliableReads:
        """An async iterator of reliable reads; as :meth:`Client.reliable_reads`.

        ``async with client.reliable_reads("jobs", timeout=5.0) as reads:``
        then ``async for item in reads:``.
        """
        check_queue_name(queue)
        return AsyncReliableReads(self, queue, timeout, switch_after)

    async def confirm(self, item: Item) -> bool:
        """Remove an open item for good; as :meth:`Client.confirm`."""
        return await self._drive(self._confirm(item))

    async def abort(self, item: Item) -> bool:
        """Give an open item back to the head of its queue; as :meth:`Client.abort`."""
        return await self._drive(self._abort(item))

    # --- administration -----------------------------------------------------------------

    async def flush(self, queue: str) -> None:
        """Drop every item of ``queue`` on every server; as :meth:`Client.flush`."""
        check_queue_name(queue)
        await self._on_all(methodcaller("command", f"flush {queue}"), require_all=True)

    async def delete(self, queue: str) -> None:
        """Delete ``queue`` (or ``q+r``) on every server; as :meth:`Client.delete`."""
        check_queue_name(queue)
        await self._on_all(methodcaller("command", f"delete {queue}"), require_all=True)

    async def stats(self) -> dict[str, ServerStats]:
        """``host:port`` -> parsed stats, for every server that answered."""
        raw = await self._on_all(methodcaller("stats"))
        return {address: parse_stats(address, *replies) for address, replies in raw.items()}

    async def version(self) -> dict[str, str]:
        """``host:port`` -> version, for every server that answered."""
        return await self._on_all(methodcaller("version"))

    async def status(self) -> dict[str, str]:
        """``host:port`` -> the ``status`` reply (``UP``, ``WRITEAVOID``, ``READONLY``, ``QUIESCENT``), for every server that answered."""
        raw = await self._on_all(methodcaller("command", "status"))
        return {address: reply.decode("ascii", "replace") for address, reply in raw.items()}

    async def set_status(self, server: str, status: str) -> None:
        """Set one server's status (``up``, ``writeavoid``, ``readonly`` or ``quiescent``); ``server`` is ``host:port``."""
        request = methodcaller("command", f"status {check_status(status)}")
        await self._drive(self._call(self.cluster.server(server), request))

    async def close(self) -> None:
        """Close every connection; items still open go back to their queues."""
        await asyncio.to_thread(self._close_discovery)
        for pool in list(self._pools.values()):
            pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing -------------------------------------------------------------------------

    async def _drive(self, op: Operation[T]) -> T:
        """Run an operation: its requests awaited, its back-offs as ``asyncio.sleep``."""
        try:
            effect = next(op)
            while True:
                try:
                    if effect.__class__ is Run:
                        result = await effect.request(effect.conn)  # type: ignore[union-attr]
                    else:
                        await asyncio.sleep(effect.seconds)  # type: ignore[union-attr]
                        result = None
                except BaseException as e:
                    effect = op.throw(e)
                else:
                    effect = op.send(result)
        except StopIteration as done:
            return done.value

    async def confirm_and_open(self, prev: Item) -> Item | None:
        """Confirm ``prev`` and open the next item on its connection; as :meth:`Client.confirm_and_open`."""
        return await self._drive(self._next_open(prev))

    async def _on_all(self, request: Request[T], *, require_all: bool = False) -> dict[str, T]:
        states, skipped = self.cluster.admin_targets()
        replies = await asyncio.gather(
            *(self._drive(self._call(state, request)) for state in states),
            return_exceptions=True,
        )
        results: dict[str, T] = {}
        failed = [f"{s.address} (marked down)" for s in skipped]
        for state, reply in zip(states, replies, strict=True):
            if isinstance(reply, ConnectionFailed):
                failed.append(state.address)
            elif isinstance(reply, BaseException):
                raise reply
            else:
                results[state.address] = reply
        self._gather(results, failed, require_all)
        return results
