"""Connections to one server: idle ones kept for reuse, leased ones tracked.

A connection is used by one request at a time.  A reliable read keeps its
connection leased until the item is confirmed or aborted, because the
server ties an open read to the connection that opened it.  Both clients
use this pool; it only ever touches the connections' ``close()``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class PooledConnection(Protocol):
    def usable(self) -> bool:
        """False when the server closed the connection while it sat idle (the connection closes itself)."""
        ...

    def close(self) -> None: ...


C = TypeVar("C", bound=PooledConnection)


class ConnectionPool(Generic[C]):
    """Hands out connections made by ``factory``; keeps up to ``max_idle`` for reuse."""

    def __init__(self, factory: Callable[[], C], max_idle: int = 8) -> None:
        self._factory = factory
        self._max_idle = max_idle
        self._idle: list[C] = []
        self._leased: set[C] = set()
        self._lock = threading.Lock()

    def acquire(self) -> C:
        """An idle connection still open at the server's end, or a new (not yet connected) one.

        Idle connections the server closed (it restarted, or timed the
        client out) are dropped here, so that they are not mistaken for a
        server that is down.
        """
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
                if conn is None:
                    conn = self._factory()
                    self._leased.add(conn)
                    return conn
            if conn.usable():
                with self._lock:
                    self._leased.add(conn)
                return conn
            conn.close()

    def release(self, conn: C) -> None:
        """``conn`` is in step and free for the next request."""
        with self._lock:
            self._leased.discard(conn)
            if len(self._idle) < self._max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def discard(self, conn: C) -> None:
        """``conn`` broke or is out of step: close it, never reuse it."""
        with self._lock:
            self._leased.discard(conn)
        conn.close()

    def drop_idle(self) -> None:
        """Close the idle connections (their server went away)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def close(self) -> None:
        """Close every connection, leased ones too (their open reads go back to the queue)."""
        with self._lock:
            conns = self._idle + list(self._leased)
            self._idle = []
            self._leased = set()
        for conn in conns:
            conn.close()

    @property
    def leased(self) -> int:
        return len(self._leased)

    @property
    def idle(self) -> int:
        return len(self._idle)
