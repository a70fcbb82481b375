"""The blocking client: a Kestrel cluster through pymemcache connections.

Usable from several threads at once (each request takes its own connection
from the server's pool); an open :class:`Item` and a
:class:`ReliableReads` belong to the thread that holds them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from functools import partial
from operator import methodcaller
from typing import TypeVar

import structlog

from kestreld.client.cluster import (
    MAX_BACKOFF,
    MAX_WAIT_SLICE,
    MIN_BACKOFF,
    Cluster,
    ServerSpec,
    ServerState,
)
from kestreld.client.connection import Connection
from kestreld.client.errors import (
    ConnectionFailed,
    KestrelError,
    NoServerAvailable,
    PipelineBroken,
    ServerError,
)
from kestreld.client.item import Item, ItemState
from kestreld.client.pool import ConnectionPool
from kestreld.client.reliable_reads import ReliableReads
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

log = structlog.get_logger("kestreld.client")


class Client:
    """A client of a cluster of kestreld servers.

    ``servers`` are ``"host:port"`` strings or ``(host, port)`` pairs.
    Writes go to a random server that is up; reads poll every server in
    turn.  A server whose connection fails is avoided for ``down_period``
    seconds (doubling per consecutive failure, up to ``max_down_period``)
    and the request moves on to the next server.  ``timeout`` bounds every
    socket operation beyond the wait a read asked for; ``poll_interval`` is
    how long a blocking read waits on one server before trying the next.

    Delivery is at least once: an item whose confirmation never reached its
    server (the server or the connection died) is delivered again, and a
    put whose reply was lost in a broken connection is retried on another
    server.
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
        self._pools: dict[str, ConnectionPool[Connection]] = {
            s.address: ConnectionPool(
                partial(
                    Connection, s.host, s.port, connect_timeout=connect_timeout, timeout=timeout
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

    def put(self, queue: str, data: Data, expiry: Expiry = None) -> bool:
        """Add one item to ``queue`` on some server.

        ``expiry`` is in seconds (or a ``timedelta``); None never expires.
        True when stored; False when every server that answered refused it
        (``NOT_STORED``: queue full, item over ``max_item_size``).  Raises
        :class:`ServerError` when every server that answered is read-only or
        failing, :class:`NoServerAvailable` when none answered.
        """
        check_queue_name(queue, writable=True)
        request = methodcaller("put", queue, to_bytes(data), exptime(expiry))
        refused = False
        error: ServerError | None = None
        for state in self.cluster.write_order():
            try:
                stored = self._call(state, request)
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

    def put_many(self, queue: str, items: Iterable[Data], expiry: Expiry = None) -> int:
        """Add many items to ``queue``, pipelined: one round trip per thousand items.

        Each pipeline goes to one random server and keeps its order there;
        items a server refuses are offered to the next one.  Returns how
        many were stored.  Raises :class:`NoServerAvailable` when no server
        answered for some of them.
        """
        check_queue_name(queue, writable=True)
        expire = exptime(expiry)
        stored = 0
        for chunk in chunks([to_bytes(data) for data in items]):
            pending = chunk
            answered = False
            for state in self.cluster.write_order():
                try:
                    results = self._call(state, methodcaller("put_many", queue, pending, expire))
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

    def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take an item from ``queue`` on any server, for good; None when there is none.

        ``timeout`` is how long to wait for one, in seconds: None or 0 asks
        every server once without waiting, ``math.inf`` waits forever.  An
        item taken this way is lost if this process dies before using it:
        use :meth:`reserve` for work that must not be lost.  Raises
        :class:`NoServerAvailable` when no server could be asked.
        """
        check_queue_name(queue)
        found = self._poll(queue, timeout, open_=False)
        return None if found is None else found[2]

    def peek(self, queue: str) -> bytes | None:
        """The item at the head of ``queue`` on the first server that has one, left in place."""
        check_queue_name(queue)
        request = methodcaller("get", read_key(queue, peek=True))
        for state in self.cluster.read_order():
            try:
                data = self._call(state, request)
            except (ConnectionFailed, ServerError):
                continue
            if data is not None:
                return data
        return None

    def open(self, queue: str, timeout: float | None = None) -> Item | None:
        """Reserve an item of ``queue`` (``get <queue>/open``); None when there is none.

        The server holds the item for this client until :meth:`confirm`
        (done with it) or :meth:`abort` (give it back); if the client dies
        or its connection breaks, the server gives it back by itself.
        ``timeout`` as for :meth:`get`.  Prefer :meth:`reserve`, which
        never forgets to close the item.
        """
        check_queue_name(queue)
        found = self._poll(queue, timeout, open_=True)
        if found is None:
            return None
        state, conn, data = found
        return Item(queue, data, state.address, connection=conn)

    @contextlib.contextmanager
    def reserve(self, queue: str, timeout: float | None = None) -> Iterator[Item | None]:
        """A reliable read as a context manager.

        ``with client.reserve("jobs", timeout=1.0) as item:`` gives an open
        :class:`Item` (or None when none came within ``timeout``); leaving
        the block normally confirms it, leaving by an exception aborts it
        (it goes back to the head of its queue) and re-raises.  An item the
        block already confirmed or aborted is left alone.  A confirmation
        that cannot reach the server is logged (``confirm_failed``), not
        raised: the server gives the item back and it comes again.
        """
        item = self.open(queue, timeout)
        if item is None:
            yield None
            return
        try:
            yield item
        except BaseException:
            if item.is_open:
                with contextlib.suppress(KestrelError):
                    self.abort(item)
            raise
        if item.is_open:
            self.confirm(item)

    def reliable_reads(
        self, queue: str, timeout: float | None = None, *, switch_after: int = 100
    ) -> ReliableReads:
        """An iterator of reliable reads of ``queue``; see :class:`ReliableReads`.

        ``with client.reliable_reads("jobs", timeout=5.0) as reads:`` then
        ``for item in reads:``.  Asking for the next item confirms the
        previous one and opens the next in one round trip
        (``get jobs/close/open``) on the same server; the iteration ends
        when no item came within ``timeout``.  After ``switch_after`` items
        in a row from one server, the next is looked for on all of them.
        """
        check_queue_name(queue)
        return ReliableReads(self, queue, timeout, switch_after)

    def confirm(self, item: Item) -> bool:
        """Remove an open item for good.

        True when the server confirmed it.  False when the item was not
        open any more, or the confirmation did not reach its server: the
        server then gives the item back and it will be delivered again.
        """
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pools[item.server]
        try:
            ok = self._run(state, conn, methodcaller("confirm", item.queue))
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

    def abort(self, item: Item) -> bool:
        """Give an open item back to the head of its queue.

        True when its server took it back now; False when the item was not
        open, or the connection broke (the server then takes it back by
        itself, or on restart if it crashed).
        """
        if not item.is_open:
            return False
        state, conn = self._unpin(item)
        pool = self._pools[item.server]
        item.state = ItemState.ABORTED
        try:
            self._run(state, conn, methodcaller("get", read_key(item.queue, abort=True)))
        except ConnectionFailed:
            return False
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return True

    # --- administration -----------------------------------------------------------------

    def flush(self, queue: str) -> None:
        """Drop every item of ``queue`` on every server (open reads stay open).

        Raises :class:`ConnectionFailed` naming the servers it could not
        reach, after flushing the others.
        """
        check_queue_name(queue)
        self._on_all(methodcaller("command", f"flush {queue}"), require_all=True)

    def delete(self, queue: str) -> None:
        """Delete ``queue`` (or the fanout reader ``q+r``) and its files on every server.

        Raises :class:`ConnectionFailed` naming the servers it could not
        reach, after deleting on the others.
        """
        check_queue_name(queue)
        self._on_all(methodcaller("command", f"delete {queue}"), require_all=True)

    def stats(self) -> dict[str, ServerStats]:
        """``host:port`` -> parsed stats, for every server that answered."""
        raw = self._on_all(methodcaller("stats"))
        return {address: parse_stats(address, *replies) for address, replies in raw.items()}

    def version(self) -> dict[str, str]:
        """``host:port`` -> version, for every server that answered."""
        return self._on_all(methodcaller("version"))

    def status(self) -> dict[str, str]:
        """``host:port`` -> ``UP``, ``READONLY`` or ``QUIESCENT``, for every server that answered."""
        raw = self._on_all(methodcaller("command", "status"))
        return {address: reply.decode("ascii", "replace") for address, reply in raw.items()}

    def set_status(self, server: str, status: str) -> None:
        """Set one server's status (``up``, ``readonly`` or ``quiescent``); ``server`` is ``host:port``."""
        request = methodcaller("command", f"status {check_status(status)}")
        self._call(self.cluster.server(server), request)

    def close(self) -> None:
        """Close every connection; items still open go back to their queues."""
        for pool in self._pools.values():
            pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -------------------------------------------------------------------------

    def _run(self, state: ServerState, conn: Connection, request: Callable[[Connection], T]) -> T:
        """``request`` on ``conn``, recording the server's health.

        A broken connection is discarded (and the server marked down); after
        an error reply, and after success, the caller still owns ``conn``.
        """
        pool = self._pools[state.address]
        started = self.cluster.clock()
        try:
            result = request(conn)
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

    def _call(self, state: ServerState, request: Callable[[Connection], T]) -> T:
        """``request`` on a pooled connection to ``state``, given back afterwards."""
        pool = self._pools[state.address]
        conn = pool.acquire()
        try:
            result = self._run(state, conn, request)
        except ConnectionFailed:
            raise
        except KestrelError:
            pool.release(conn)
            raise
        pool.release(conn)
        return result

    def _unpin(self, item: Item) -> tuple[ServerState, Connection]:
        conn, item.connection = item.connection, None
        return self.cluster.server(item.server), conn

    def _close_open(self, prev: Item) -> Item | None:
        """Confirm ``prev`` and open the next item on its connection, in one round trip.

        None when that server has no next item (``prev`` is confirmed all
        the same) or the connection broke (``prev`` goes back to its queue).
        """
        state, conn = self._unpin(prev)
        pool = self._pools[prev.server]
        request = methodcaller("get", read_key(prev.queue, close=True, open=True))
        try:
            data = self._run(state, conn, request)
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

    def _on_all(
        self, request: Callable[[Connection], T], *, require_all: bool = False
    ) -> dict[str, T]:
        results: dict[str, T] = {}
        failed: list[str] = []
        for state in self.cluster.everyone():
            try:
                results[state.address] = self._call(state, request)
            except ConnectionFailed:
                failed.append(state.address)
        if not results:
            raise NoServerAvailable(f"no server answered: {', '.join(failed)}")
        if failed and require_all:
            raise ConnectionFailed(f"not reached: {', '.join(failed)}")
        return results

    def _poll(
        self, queue: str, timeout: float | None, *, open_: bool
    ) -> tuple[ServerState, Connection, bytes] | None:
        """Look for an item on every server in turn until one has it or ``timeout`` ends.

        The first round asks each server without waiting; later rounds wait
        ``poll_interval`` on each in turn (a lone server: the whole time).
        With ``open_`` the connection stays leased to the returned item.
        Raises :class:`NoServerAvailable` when no server answered at all.
        """
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
                    data = self._run(state, conn, request)
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
                time.sleep(min(remaining, backoff))
                backoff = min(backoff * 2, MAX_BACKOFF)
