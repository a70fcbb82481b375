"""The blocking client: a Kestrel cluster through pymemcache connections.

Usable from several threads at once (each request takes its own connection
from the server's pool); an open :class:`Item` and a
:class:`ReliableReads` belong to the thread that holds them.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from operator import methodcaller
from typing import TypeVar

from kestreld.client.connection import Connection
from kestreld.client.errors import ConnectionFailed, KestrelError
from kestreld.client.item import Item
from kestreld.client.operations import ClusterOperations, Operation, Run
from kestreld.client.reliable_reads import ReliableReads
from kestreld.client.stats import ServerStats, parse_stats
from kestreld.client.wire import Data, Expiry, check_queue_name, check_status

T = TypeVar("T")


class Client(ClusterOperations[Connection]):
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

    connection = Connection

    # --- writes -----------------------------------------------------------------------

    def put(self, queue: str, data: Data, expiry: Expiry = None) -> bool:
        """Add one item to ``queue`` on some server.

        ``expiry`` is in seconds (or a ``timedelta``); None never expires.
        True when stored; False when every server that answered refused it
        (``NOT_STORED``: queue full, item over ``max_item_size``).  Raises
        :class:`ServerError` when every server that answered is read-only or
        failing, :class:`NoServerAvailable` when none answered.
        """
        return self._drive(self._put(queue, data, expiry))

    def put_many(self, queue: str, items: Iterable[Data], expiry: Expiry = None) -> int:
        """Add many items to ``queue``, pipelined: one round trip per thousand items.

        Each pipeline goes to one random server and keeps its order there;
        items a server refuses are offered to the next one.  Returns how
        many were stored.  Raises :class:`NoServerAvailable` when no server
        answered for some of them.
        """
        return self._drive(self._put_many(queue, items, expiry))

    # --- reads --------------------------------------------------------------------------

    def get(self, queue: str, timeout: float | None = None) -> bytes | None:
        """Take an item from ``queue`` on any server, for good; None when there is none.

        ``timeout`` is how long to wait for one, in seconds: None or 0 asks
        every server once without waiting, ``math.inf`` waits forever.  An
        item taken this way is lost if this process dies before using it:
        use :meth:`reserve` for work that must not be lost.  Raises
        :class:`NoServerAvailable` when no server could be asked.
        """
        return self._drive(self._get(queue, timeout))

    def peek(self, queue: str) -> bytes | None:
        """The item at the head of ``queue`` on the first server that has one, left in place."""
        return self._drive(self._peek(queue))

    def open(self, queue: str, timeout: float | None = None) -> Item | None:
        """Reserve an item of ``queue`` (``get <queue>/open``); None when there is none.

        The server holds the item for this client until :meth:`confirm`
        (done with it) or :meth:`abort` (give it back); if the client dies
        or its connection breaks, the server gives it back by itself.
        ``timeout`` as for :meth:`get`.  Prefer :meth:`reserve`, which
        never forgets to close the item.
        """
        return self._drive(self._open(queue, timeout))

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
        return self._drive(self._confirm(item))

    def abort(self, item: Item) -> bool:
        """Give an open item back to the head of its queue.

        True when its server took it back now; False when the item was not
        open, or the connection broke (the server then takes it back by
        itself, or on restart if it crashed).
        """
        return self._drive(self._abort(item))

    # --- administration -----------------------------------------------------------------

    def flush(self, queue: str) -> None:
        """Drop every item of ``queue`` on every server (open reads stay open).

        Raises :class:`ConnectionFailed` naming the servers it could not
        reach (or skipped because they are marked down), after flushing the others.
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
        """``host:port`` -> parsed stats, for every server that answered.

        Servers marked down are not asked until their retry time (unless all are).
        """
        raw = self._on_all(methodcaller("stats"))
        return {address: parse_stats(address, *replies) for address, replies in raw.items()}

    def version(self) -> dict[str, str]:
        """``host:port`` -> version, for every server that answered."""
        return self._on_all(methodcaller("version"))

    def status(self) -> dict[str, str]:
        """``host:port`` -> the ``status`` reply (``UP``, ``WRITEAVOID``, ``READONLY``, ``QUIESCENT``), for every server that answered."""
        raw = self._on_all(methodcaller("command", "status"))
        return {address: reply.decode("ascii", "replace") for address, reply in raw.items()}

    def set_status(self, server: str, status: str) -> None:
        """Set one server's status (``up``, ``writeavoid``, ``readonly`` or ``quiescent``); ``server`` is ``host:port``."""
        request = methodcaller("command", f"status {check_status(status)}")
        self._drive(self._call(self.cluster.server(server), request))

    def close(self) -> None:
        """Close every connection; items still open go back to their queues."""
        self._close_discovery()
        for pool in list(self._pools.values()):
            pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- plumbing -------------------------------------------------------------------------

    def _drive(self, op: Operation[T]) -> T:
        """Run an operation: its requests as blocking calls, its back-offs as sleeps."""
        try:
            effect = next(op)
            while True:
                try:
                    if effect.__class__ is Run:
                        result = effect.request(effect.conn)  # type: ignore[union-attr]
                    else:
                        time.sleep(effect.seconds)  # type: ignore[union-attr]
                        result = None
                except BaseException as e:
                    effect = op.throw(e)
                else:
                    effect = op.send(result)
        except StopIteration as done:
            return done.value

    def confirm_and_open(self, prev: Item) -> Item | None:
        """Confirm ``prev`` and open the next item on its connection, in one round trip.

        None when that server has no next item (``prev`` is confirmed all
        the same) or the connection broke (``prev`` goes back to its queue).
        """
        return self._drive(self._next_open(prev))

    def _on_all(
        self, request: Callable[[Connection], T], *, require_all: bool = False
    ) -> dict[str, T]:
        results: dict[str, T] = {}
        targets, skipped = self.cluster.admin_targets()
        failed = [f"{s.address} (marked down)" for s in skipped]
        for state in targets:
            try:
                results[state.address] = self._drive(self._call(state, request))
            except ConnectionFailed:
                failed.append(state.address)
        self._gather(results, failed, require_all)
        return results
