"""One ZooKeeper session (kazoo) that never gives up, and starts afresh when it must.

kazoo reconnects by itself, forever with the retry policy used here.  One
case it cannot leave: an ensemble that lost its data (or was replaced)
refuses a client that has seen a newer transaction than it has, and never
tells it that its session is gone, so the client retries forever.  As
Apache Curator does, a session disconnected for longer than its timeout is
taken for expired: :meth:`ZooKeeperSession.check` stops the client (the
listeners see LOST) and starts a new session, with a wait that doubles each
time it happens again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import structlog
from kazoo.client import KazooClient, KazooState
from kazoo.retry import KazooRetry

log = structlog.get_logger("kestreld.cluster")

#: The longest wait before another fresh session (seconds).
MAX_RESTART_WAIT = 60.0


class _KazooLogHandler(logging.Handler):
    """kazoo's own warnings (stdlib logging) as ``zookeeper_client`` events in our log."""

    def emit(self, record: logging.LogRecord) -> None:
        method = log.error if record.levelno >= logging.ERROR else log.warning
        method("zookeeper_client", message=record.getMessage())


def _kazoo_logger() -> logging.Logger:
    logger = logging.getLogger("kestreld.kazoo")
    if not logger.handlers:
        logger.addHandler(_KazooLogHandler())
        logger.setLevel(logging.WARNING)
        logger.propagate = False
    return logger


class ZooKeeperSession:
    """A kazoo client; ``on_state`` gets kazoo's CONNECTED, SUSPENDED and LOST (from its thread)."""

    def __init__(
        self,
        hosts: str,
        session_timeout: float,
        *,
        credentials: str | None = None,
        default_acl: list[Any] | None = None,
        on_state: Callable[[str], None] | None = None,
    ) -> None:
        self.hosts = hosts
        self.session_timeout = session_timeout
        self._on_state = on_state
        self._lock = threading.Lock()
        self.connected = False
        self._disconnected_at = time.monotonic()
        self._restart_wait = session_timeout
        auth = [("digest", credentials)] if credentials else None
        self.zk = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            auth_data=auth,
            default_acl=default_acl,
            # Never give up reconnecting: ZooKeeper down must not end membership for good.
            connection_retry=KazooRetry(max_tries=-1, delay=0.2, backoff=2, max_delay=5.0),
            command_retry=KazooRetry(max_tries=2, delay=0.1, backoff=2, max_delay=1.0),
            logger=_kazoo_logger(),
        )
        self.zk.add_listener(self._state_changed)

    def start(self) -> None:
        """Connect in the background; returns at once."""
        with self._lock:
            self._disconnected_at = time.monotonic()
        self.zk.start_async()

    def _state_changed(self, state: str) -> None:
        with self._lock:
            connected = state == KazooState.CONNECTED
            if self.connected and not connected:
                self._disconnected_at = time.monotonic()
            if connected:
                self._restart_wait = self.session_timeout
            self.connected = connected
        if self._on_state is not None:
            self._on_state(state)

    def seconds_until_check(self) -> float | None:
        """When :meth:`check` may next have work (None while connected)."""
        with self._lock:
            if self.connected:
                return None
            return max(0.0, self._disconnected_at + self._restart_wait - time.monotonic())

    def check(self) -> bool:
        """Start a fresh session if this one has been disconnected too long; True if it did.

        Call from a thread of your own (never a kazoo callback): stopping waits for kazoo.
        """
        with self._lock:
            if self.connected:
                return False
            waited = time.monotonic() - self._disconnected_at
            if waited < self._restart_wait:
                return False
            self._restart_wait = min(self._restart_wait * 2, MAX_RESTART_WAIT)
            self._disconnected_at = time.monotonic()
        log.warning(
            "zookeeper_session_abandoned", hosts=self.hosts, disconnected_for=round(waited, 1)
        )
        try:
            self.zk.stop()  # the listeners see LOST: ephemeral nodes are taken for gone
        except Exception as e:
            log.warning("zookeeper_stop_failed", error=str(e))
        self.zk.start_async()
        return True

    def close(self) -> None:
        """End the session (its ephemeral nodes go with it)."""
        try:
            self.zk.stop()
            self.zk.close()
        except Exception as e:  # closing is best effort: the session ends with the process
            log.warning("zookeeper_close_failed", error=str(e))
