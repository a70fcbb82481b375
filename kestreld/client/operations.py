"""The cluster operations both clients share, written once (sans-IO).

Each operation (put, a polled read, confirm, ...) is a generator: it decides
which server to ask, keeps the servers' health and the pooled connections
right, and tracks items, and for every request it *yields* an effect
instead of doing I/O:

- :class:`Run` — run ``request`` on ``conn``; the driver sends back its
  result, or throws in the exception it raised;
- :class:`Sleep` — back off for ``seconds``.

:class:`~kestreld.client.Client` drives an operation with blocking calls
and ``time.sleep``, :class:`~kestreld.client.AsyncClient` with ``await`` and
``asyncio.sleep``, so the two cannot drift apart in behaviour.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from operator import methodcaller
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import structlog

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
from kestreld.client.pool import ConnectionPool, PooledConnection
from kestreld.client.wire import Data, Expiry, check_queue_name, chunks, exptime, read_key, to_bytes

if TYPE_CHECKING:
    from kestreld.client.discovery import Discovery

T = TypeVar("T")
C = TypeVar("C", bound=PooledConnection)

log = structlog.get_logger("kestreld.client")


@dataclass(slots=True)
class Run:
    """Effect: ``request(conn)`` (awaited by the asyncio client)."""

    conn: Any
    request: Callable[[Any], Any]


@dataclass(slots=True)
class Sleep:
    """Effect: wait ``seconds`` before going on."""

    seconds: float


Effect = Run | Sleep
Operation = Generator[Effect, Any, T]


class ClusterOperations(Generic[C]):
    """The cluster, its connection pools and every operation on them.

    A client sets :attr:`connection` to its connection class (made with
    ``(host, port, connect_timeout=..., timeout=..., username=..., password=..., tls=...)``).
    ``username`` and ``password``: every connection authenticates with them (a server
    with an ``auth_file``); ``tls``: an :class:`ssl.SSLContext` for servers on TLS.
    """

    connection: Callable[..., C]

    def __init__(
        self,
        servers: Sequence[ServerSpec] | None = None,
        *,
        zookeeper: str | None = None,
        discovery: Discovery | None = None,
        connect_timeout: float = 2.0,
        timeout: float = 5.0,
        down_period: float = 5.0,
        max_down_period: float = 60.0,
        poll_interval: float = 0.25,
        max_idle_connections: int = 8,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if sum(x is not None for x in (servers, zookeeper, discovery)) > 1:
            raise ValueError("give servers, zookeeper or discovery, not several")
        if isinstance(servers, str):
            servers = [servers]
        if zookeeper is not None:
            from kestreld.client.discovery import Discovery

            discovery = Discovery(zookeeper)
            self._owned_discovery: Discovery | None = discovery
        else:
            self._owned_discovery = None
        #: The ZooKeeper server sets this client follows, or None (a fixed server list).
        self.discovery = discovery
        self.cluster = Cluster(
            ()
            if discovery is not None
            else servers
            if servers is not None
            else ("127.0.0.1:22133",),
            down_period=down_period,
            max_down_period=max_down_period,
            discovered=discovery is not None,
        )
        self.poll_interval = poll_interval
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._max_idle = max_idle_connections
        self._username = username
        self._password = password
        self._tls = tls
        self._pools: dict[str, ConnectionPool[C]] = {}
        self._pools_lock = threading.Lock()
        if discovery is not None:
            discovery.subscribe(self.cluster.set_members)
            if self._owned_discovery is not None:
                discovery.start()

    def _pool(self, state: ServerState) -> ConnectionPool[C]:
        """The connection pool of ``state`` (made on first use: discovered servers come and go)."""
        pool = self._pools.get(state.address)
        if pool is None:
            with self._pools_lock:
                pool = self._pools.get(state.address)
                if pool is None:
                    factory = partial(
                        self.connection,
                        state.host,
                        state.port,
                        connect_timeout=self._connect_timeout,
                        timeout=self._timeout,
                        username=self._username,
                        password=self._password,
                        tls=self._tls,
                    )
                    pool = self._pools[state.address] = ConnectionPool(factory, self._max_idle)
        return pool

    def _close_discovery(self) -> None:
        """Stop following the server sets, when this client started doing so."""
        if self._owned_discovery is not None:
            self._owned_discovery.close()
        elif self.discovery is not None:
            self.discovery.unsubscribe(self.cluster.set_members)

    @property
    def servers(self) -> list[ServerState]:
        """Every server with its health (``failures``, ``down_until``, ``last_error``)."""
        return list(self.cluster.everyone())

    # --- requests on one server -------------------------------------------------------------

    def _run(self, state: ServerState, conn: C, request: Callable[[C], Any]) -> Operation[Any]:
        """``request`` on ``conn``, recording the server's health.

        A broken connection is discarded (and the server marked down); after
        an error reply, and after success, the caller still owns ``conn``.
        """
        pool = self._pool(state)
        started = self.cluster.clock()
        try:
            result = yield Run(conn, request)
        except ConnectionFailed as e:
            pool.discard(conn)
            pool.drop_idle()
            self.cluster.mark_down(state, e, started)
            raise
        except KestrelError:
            self.cluster.mark_up(state, started)
            raise
        except BaseException:  # cancelled, or a bug: the connection may be out of step
            pool.discard(conn)
            raise
        self.cluster.mark_up(state, started)
        return result

    def _call(self, state: ServerState, request: Callable[[C], Any]) -> Operation[Any]:
        """``request`` on a pooled connection to ``state``, given back afterwards."""
        pool = self._pool(state)
        conn = pool.acquire()
        try:
            result = yield from self._run(state, conn, request)
        except ConnectionFailed:
            raise
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return result

    def _unpin(self, item: Item) -> tuple[ServerState, C]:
        conn, item.connection = item.connection, None
        return self.cluster.server(item.server), conn  # type: ignore[return-value]

    # --- writes ---------------------------------------------------------------------------

    def _put(self, queue: str, data: Data, expiry: Expiry) -> Operation[bool]:
        check_queue_name(queue, writable=True)
        request = methodcaller("put", queue, to_bytes(data), exptime(expiry))
        refused = False
        error: ServerError | None = None
        for state in self.cluster.write_order():
            try:
                stored = yield from self._call(state, request)
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

    def _put_many(self, queue: str, items: Iterable[Data], expiry: Expiry) -> Operation[int]:
        check_queue_name(queue, writable=True)
        expire = exptime(expiry)
        stored = 0
        for chunk in chunks([to_bytes(data) for data in items]):
            pending = chunk
            answered = False
            for state in self.cluster.write_order():
                try:
                    results = yield from self._call(
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

    # --- reads ----------------------------------------------------------------------------

    def _peek(self, queue: str) -> Operation[bytes | None]:
        check_queue_name(queue)
        request = methodcaller("get", read_key(queue, peek=True))
        for state in self.cluster.read_order():
            try:
                data = yield from self._call(state, request)
            except (ConnectionFailed, ServerError):
                continue
            if data is not None:
                return data
        return None

    def _get(self, queue: str, timeout: float | None) -> Operation[bytes | None]:
        check_queue_name(queue)
        found = yield from self._poll(queue, timeout, open_=False)
        return None if found is None else found[2]

    def _open(self, queue: str, timeout: float | None) -> Operation[Item | None]:
        check_queue_name(queue)
        found = yield from self._poll(queue, timeout, open_=True)
        if found is None:
            return None
        state, conn, data = found
        return Item(queue, data, state.address, connection=conn)

    def _poll(
        self, queue: str, timeout: float | None, *, open_: bool
    ) -> Operation[tuple[ServerState, C, bytes] | None]:
        """Look for an item on every server in turn until one has it or ``timeout`` ends.

        The first round asks each server without waiting; later rounds wait
        ``poll_interval`` on each in turn (a lone server: the whole time).
        With ``open_`` the connection stays leased to the returned item.
        Raises :class:`NoServerAvailable` when no server answered at all.
        """
        clock = self.cluster.clock
        deadline = clock() + timeout if timeout else None
        backoff = MIN_BACKOFF
        first_round = True
        answered = False
        version = self.cluster.version
        rotation = self.cluster.rotation()  # one order for every round: even gaps between visits
        while True:
            if self.cluster.version != version:  # the server sets changed (discovery)
                version = self.cluster.version
                rotation = self.cluster.rotation()
            alone = len(rotation) == 1
            waited = False
            for state in self.cluster.available(rotation):
                wait = 0.0
                if deadline is not None and (alone or not first_round):
                    remaining = deadline - clock()
                    if remaining > 0:
                        wait = min(remaining, MAX_WAIT_SLICE if alone else self.poll_interval)
                    elif not first_round:
                        break  # out of time; the first round asks everyone all the same
                pool = self._pool(state)
                conn = pool.acquire()
                request = methodcaller("get", read_key(queue, wait=wait, open=open_), wait)
                try:
                    data = yield from self._run(state, conn, request)
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
                yield Sleep(min(remaining, backoff))
                backoff = min(backoff * 2, MAX_BACKOFF)

    # --- open items -----------------------------------------------------------------------

    def _confirm(self, item: Item) -> Operation[bool]:
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pool(state)
        try:
            ok = yield from self._run(state, conn, methodcaller("confirm", item.queue))
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

    def _abort(self, item: Item) -> Operation[bool]:
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pool(state)
        item.state = ItemState.ABORTED
        try:
            yield from self._run(state, conn, methodcaller("get", read_key(item.queue, abort=True)))
        except ConnectionFailed:
            return False
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return True

    def _next_open(self, prev: Item) -> Operation[Item | None]:
        """Confirm ``prev`` and open the next item on its connection, in one round trip.

        None when that server has no next item (``prev`` is confirmed all
        the same) or the connection broke (``prev`` goes back to its queue).
        """
        state, conn = self._unpin(prev)
        pool = self._pool(state)
        request = methodcaller("get", read_key(prev.queue, close=True, open=True))
        try:
            data = yield from self._run(state, conn, request)
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

    # --- every server ---------------------------------------------------------------------

    def _gather(self, results: dict[str, Any], failed: list[str], require_all: bool) -> None:
        """The end of an operation on every server: enough of them answered?"""
        if not results:
            raise NoServerAvailable(f"no server answered: {', '.join(failed)}")
        if failed and require_all:
            raise ConnectionFailed(f"not reached: {', '.join(failed)}")
