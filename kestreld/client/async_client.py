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
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from functools import partial
from operator import methodcaller
from typing import TypeVar

import structlog

from kestreld.client.async_connection import AsyncConnection
from kestreld.client.cluster import (
    MAX_BACKOFF,
    MAX_WAIT_SLICE,
    MIN_BACKOFF,
    Cluster,
    ServerSpec,
    ServerState,
)
from kestreld.client.errors import (
    ConnectionFailed,
    KestrelError,
    NoServerAvailable,
    PipelineBroken,
    ServerError,
)
from kestreld.client.item import Item, ItemState
from kestreld.client.pool import ConnectionPool
from kestreld.client.reliable_reads import AsyncReliableReads
from kestreld.client.stats import ServerStats, parse_stats
from kestreld.client.wire import (
    Data,
    Expiry,
    check_queue_name,
    check_status,
    chunks,
    exptime,
    read_key,
    to_bytes,
)

T = TypeVar("T")
Request = Callable[[AsyncConnection], Awaitable[T]]

log = structlog.get_logger("kestreld.client")


class AsyncClient:
    """An asyncio client of a cluster of kestreld servers.

    Constructed like :class:`kestreld.client.Client`, with the same
    cluster behaviour (random writes, reads polling every server, failover
    and down periods); every request method is a coroutine.  Close it with
    ``await client.close()`` or ``async with AsyncClient([...]) as client``.
    """

    def __init__(
        self,
        servers: Sequence[ServerSpec] = ("127.0.0.1:22133",),
        *,
        connect_timeout: float = 2.0,
        timeout: float = 5.0,
        down_period: float = 5.0,
        max_down_period: float = 60.0,
        poll_interval: float = 0.25,
        max_idle_connections: int = 8,
    ) -> None:
        if isinstance(servers, str):
            servers = [servers]
        self.cluster = Cluster(servers, down_period=down_period, max_down_period=max_down_period)
        self.poll_interval = poll_interval
        self._pools: dict[str, ConnectionPool[AsyncConnection]] = {
            s.address: ConnectionPool(
                partial(
                    AsyncConnection,
                    s.host,
                    s.port,
                    connect_timeout=connect_timeout,
                    timeout=timeout,
                ),
                max_idle_connections,
            )
            for s in self.cluster.servers
        }

    @property
    def servers(self) -> list[ServerState]:
        """Every server with its health (``failures``, ``down_until``, ``last_error``)."""
        return list(self.cluster.everyone())

    # --- writes -----------------------------------------------------------------------

    async def put(self, queue: str, data: Data, expiry: Expiry = None) -> bool:
        """Add one item to ``queue`` on some server; as :meth:`Client.put`."""
        check_queue_name(queue, writable=True)
        request = methodcaller("put", queue, to_bytes(data), exptime(expiry))
        refused = False
        error: ServerError | None = None
        for state in self.cluster.write_order():
            try:
                stored = await self._call(state, request)
            except ConnectionFailed:
                continue
            except ServerError as e:
                error = e
                continue
            if stored:
                return True
            refused = True
        if refused:
            return False
        if error is not None:
            raise error
        raise NoServerAvailable(f"no server could store an item on {queue!r}")

    async def put_many(self, queue: str, items: Iterable[Data], expiry: Expiry = None) -> int:
        """Add many items to ``queue``, pipelined; as :meth:`Client.put_many`."""
        check_queue_name(queue, writable=True)
        expire = exptime(expiry)
        stored = 0
        for chunk in chunks([to_bytes(data) for data in items]):
            pending = chunk
            answered = False
            for state in self.cluster.write_order():
                try:
                    results = await self._call(
                        state, methodcaller("put_many", queue, pending, expire)
                    )
                except PipelineBroken as e:
                    results = e.stored + [False] * (len(pending) - len(e.stored))
                except ConnectionFailed:
                    continue
                answered = True
                stored += sum(results)
                pending = [data for data, ok in zip(pending, results, strict=True) if not ok]
                if not pending:
                    break
            if pending and not answered:
                raise NoServerAvailable(
                    f"no server could store items on {queue!r} ({stored} stored)"
                )
        return stored

    # --- reads --------------------------------------------------------------------------

    async def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take an item from ``queue`` on any server, for good; as :meth:`Client.get`."""
        check_queue_name(queue)
        found = await self._poll(queue, timeout, open_=False)
        return None if found is None else found[2]

    async def peek(self, queue: str) -> bytes | None:
        """The item at the head of ``queue`` on the first server that has one, left in place."""
        check_queue_name(queue)
        request = methodcaller("get", read_key(queue, peek=True))
        for state in self.cluster.read_order():
            try:
                data = await self._call(state, request)
            except (ConnectionFailed, ServerError):
                continue
            if data is not None:
                return data
        return None

    async def open(self, queue: str, timeout: float | None = None) -> Item | None:
        """Reserve an item of ``queue``; as :meth:`Client.open`."""
        check_queue_name(queue)
        found = await self._poll(queue, timeout, open_=True)
        if found is None:
            return None
        state, conn, data = found
        return Item(queue, data, state.address, connection=conn)

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
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pools[item.server]
        try:
            ok = await self._run(state, conn, methodcaller("confirm", item.queue))
        except ConnectionFailed as e:
            item.state = ItemState.ABORTED
            log.warning("confirm_failed", server=item.server, queue=item.queue, error=str(e))
            return False
        except KestrelError:
            item.state = ItemState.ABORTED
            pool.release(conn)
            raise
        item.state = ItemState.CONFIRMED if ok else ItemState.ABORTED
        pool.release(conn)
        return ok

    async def abort(self, item: Item) -> bool:
        """Give an open item back to the head of its queue; as :meth:`Client.abort`."""
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pools[item.server]
        item.state = ItemState.ABORTED
        try:
            await self._run(state, conn, methodcaller("get", read_key(item.queue, abort=True)))
        except ConnectionFailed:
            return False
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return True

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
        """``host:port`` -> ``UP``, ``READONLY`` or ``QUIESCENT``, for every server that answered."""
        raw = await self._on_all(methodcaller("command", "status"))
        return {address: reply.decode("ascii", "replace") for address, reply in raw.items()}

    async def set_status(self, server: str, status: str) -> None:
        """Set one server's status (``up``, ``readonly`` or ``quiescent``); ``server`` is ``host:port``."""
        request = methodcaller("command", f"status {check_status(status)}")
        await self._call(self.cluster.server(server), request)

    async def close(self) -> None:
        """Close every connection; items still open go back to their queues."""
        for pool in self._pools.values():
            pool.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- plumbing -------------------------------------------------------------------------

    async def _run(self, state: ServerState, conn: AsyncConnection, request: Request[T]) -> T:
        """``request`` on ``conn``, recording the server's health; as :meth:`Client._run`."""
        pool = self._pools[state.address]
        started = self.cluster.clock()
        try:
            result = await request(conn)
        except ConnectionFailed as e:
            pool.discard(conn)
            pool.drop_idle()
            self.cluster.mark_down(state, e, started)
            raise
        except KestrelError:
            self.cluster.mark_up(state, started)
            raise
        except BaseException:
            pool.discard(conn)
            raise
        self.cluster.mark_up(state, started)
        return result

    async def _call(self, state: ServerState, request: Request[T]) -> T:
        """``request`` on a pooled connection to ``state``, given back afterwards."""
        pool = self._pools[state.address]
        conn = pool.acquire()
        try:
            result = await self._run(state, conn, request)
        except ConnectionFailed:
            raise
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return result

    def _unpin(self, item: Item) -> tuple[ServerState, AsyncConnection]:
        conn, item.connection = item.connection, None
        return self.cluster.server(item.server), conn

    async def _close_open(self, prev: Item) -> Item | None:
        """Confirm ``prev`` and open the next item on its connection; as :meth:`Client._close_open`."""
        state, conn = self._unpin(prev)
        pool = self._pools[prev.server]
        request = methodcaller("get", read_key(prev.queue, close=True, open=True))
        try:
            data = await self._run(state, conn, request)
        except ConnectionFailed as e:
            prev.state = ItemState.ABORTED
            log.warning("confirm_failed", server=prev.server, queue=prev.queue, error=str(e))
            return None
        except ServerError:
            prev.state = ItemState.CONFIRMED  # the close comes before the refused fetch (quiescent)
            pool.release(conn)
            return None
        except KestrelError:
            prev.state = ItemState.ABORTED
            pool.release(conn)
            raise
        prev.state = ItemState.CONFIRMED
        if data is None:
            pool.release(conn)
            return None
        return Item(prev.queue, data, prev.server, connection=conn)

    async def _on_all(self, request: Request[T], *, require_all: bool = False) -> dict[str, T]:
        states = self.cluster.everyone()
        replies = await asyncio.gather(
            *(self._call(state, request) for state in states), return_exceptions=True
        )
        results: dict[str, T] = {}
        failed: list[str] = []
        for state, reply in zip(states, replies, strict=True):
            if isinstance(reply, ConnectionFailed):
                failed.append(state.address)
            elif isinstance(reply, BaseException):
                raise reply
            else:
                results[state.address] = reply
        if not results:
            raise NoServerAvailable(f"no server answered: {', '.join(failed)}")
        if failed and require_all:
            raise ConnectionFailed(f"not reached: {', '.join(failed)}")
        return results

    async def _poll(
        self, queue: str, timeout: float | None, *, open_: bool
    ) -> tuple[ServerState, AsyncConnection, bytes] | None:
        """Look for an item on every server in turn; as :meth:`Client._poll`."""
        clock = self.cluster.clock
        deadline = clock() + timeout if timeout else None
        alone = len(self.cluster.servers) == 1
        backoff = MIN_BACKOFF
        first_round = True
        answered = False
        rotation = self.cluster.rotation()  # one order for every round: even gaps between visits
        while True:
            waited = False
            for state in self.cluster.available(rotation):
                wait = 0.0
                if deadline is not None and (alone or not first_round):
                    remaining = deadline - clock()
                    if remaining > 0:
                        wait = min(remaining, MAX_WAIT_SLICE if alone else self.poll_interval)
                    elif not first_round:
                        break  # out of time; the first round asks everyone all the same
                pool = self._pools[state.address]
                conn = pool.acquire()
                request = methodcaller("get", read_key(queue, wait=wait, open=open_), wait)
                try:
                    data = await self._run(state, conn, request)
                except ConnectionFailed:
                    continue
                except ServerError:
                    answered = True
                    pool.release(conn)  # this server refuses reads (quiescent): ask the others
                    continue
                except KestrelError:
                    pool.release(conn)
                    raise
                answered = waited = True
                if data is None or not open_:
                    pool.release(conn)
                if data is not None:
                    return state, conn, data
            first_round = False
            remaining = 0.0 if deadline is None else deadline - clock()
            if remaining <= 0:
                if not answered:
                    raise NoServerAvailable(f"no server answered a read of {queue!r}")
                return None
            if waited:
                backoff = MIN_BACKOFF
            else:
                # Nobody could be asked: back off rather than spin.
                await asyncio.sleep(min(remaining, backoff))
                backoff = min(backoff * 2, MAX_BACKOFF)
