"""What the running server is, as the protocol and stats layers may see it.

- :class:`ServerStatus` (Kestrel 2.4): UP, WRITEAVOID, READONLY or QUIESCENT,
  kept in the status file so a restart comes back in the same status.
- :class:`ServerState`: the server's state and admin actions (a structural
  type), so ``protocol`` and ``stats`` never import ``kestreld.server``.
- :class:`StartupError`: why the server (or one of its listeners) cannot start.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from kestreld.journal.files import STATUS_FILE

if TYPE_CHECKING:
    from kestreld.config import ServerConfig
    from kestreld.queues.collection import QueueCollection
    from kestreld.stats.counters import ServerStats

log = structlog.get_logger("kestreld.state")


class ServerStatus(Enum):
    """Kestrel 2.4's statuses, loosest first; ``strictness`` orders them."""

    UP = "UP"
    WRITEAVOID = "WRITEAVOID"  # writes accepted, but the server leaves the write server set
    READONLY = "READONLY"  # writes refused
    QUIESCENT = "QUIESCENT"  # reads and writes refused (draining before maintenance)

    @property
    def strictness(self) -> int:
        return _STRICTNESS[self]

    def stricter_than(self, other: ServerStatus) -> bool:
        return _STRICTNESS[self] > _STRICTNESS[other]

    @property
    def refuses_writes(self) -> bool:
        return self is ServerStatus.READONLY or self is ServerStatus.QUIESCENT

    @property
    def refuses_reads(self) -> bool:
        return self is ServerStatus.QUIESCENT

    @property
    def in_read_set(self) -> bool:
        """A member of ``<path_prefix>/read``: UP, WRITEAVOID or READONLY."""
        return self is not ServerStatus.QUIESCENT

    @property
    def in_write_set(self) -> bool:
        """A member of ``<path_prefix>/write``: UP only."""
        return self is ServerStatus.UP


_STRICTNESS = {
    ServerStatus.UP: 1,
    ServerStatus.WRITEAVOID: 2,
    ServerStatus.READONLY: 3,
    ServerStatus.QUIESCENT: 4,
}


class StartupError(Exception):
    """The server cannot start; the message says why (and what to do)."""


class ServerState(Protocol):
    """The server as its connections and its stats see it."""

    config: ServerConfig
    config_path: str | None
    stats: ServerStats
    queues: QueueCollection
    status: ServerStatus
    #: Why writes / fetches are refused now (the status in force, the connection limits),
    #: else None, and the latency observer: kept current by the server in its gate
    #: (kestreld.session.gate.Gate), which every session holds and reads per request.
    gate: Any
    writes_refused: str | None
    reads_refused: str | None
    #: The server-set membership when [zookeeper] is configured, else None.
    membership: Any
    zookeeper_connected: bool
    connections: set[Any]
    #: The event loop's poll after a reply (kestreld.loop.busy_poll.BusyPoll).
    busy_poll: Any
    #: How late the event loop serves a timer (kestreld.loop.hold.HoldProbe).
    loop_hold: Any
    loop: asyncio.AbstractEventLoop
    #: Called with (kind, seconds[, queue or reader name]) for "set", "get_hit" and
    #: "get_timeout" (metrics).
    latency_observer: Callable[..., None] | None
    #: The users of the auth file (kestreld.security.Authenticator); None: no authentication.
    authenticator: Any
    #: kestreld.session.trace.SessionTrace with enable_session_trace, else None.
    session_trace: Any

    def render_stats(self) -> bytes: ...

    def render_dump_stats(self, names: list[str]) -> bytes: ...

    def render_dump_config(self, names: list[str]) -> bytes: ...

    def reload(self) -> tuple[str | None, list[str]]: ...

    def set_status(self, status: ServerStatus) -> None: ...

    def describe_status(self) -> str: ...

    def connection_opened(self, conn: Any) -> None: ...

    def connection_closed(self, conn: Any) -> None: ...

    def clients(self) -> int:
        """Open client connections: ``connections`` but the workers' own channels."""
        ...

    def request_shutdown(self, reason: str) -> None: ...


def default_status_file(queue_path: str) -> str:
    """Where the status is kept when ``status_file`` is not set: in the queue folder."""
    return os.path.join(queue_path, STATUS_FILE)


def load_status(path: str, default: ServerStatus = ServerStatus.UP) -> ServerStatus:
    """The persisted status; ``default`` when there is none, or it is unreadable (logged)."""
    try:
        with open(path) as f:
            word = f.readline().strip().upper()
    except FileNotFoundError:
        return default
    except OSError as e:
        log.error("status_file_unreadable", path=path, error=e.strerror, status=default.value)
        return default
    try:
        return ServerStatus(word)
    except ValueError:
        log.error("status_file_unparsable", path=path, found=word[:40], status=default.value)
        return default


def save_status(path: str, status: ServerStatus) -> None:
    """Persist atomically so a restart comes back in the same status."""
    folder = os.path.dirname(path)
    if folder:
        os.makedirs(folder, exist_ok=True)
    tmp = path + "~~"
    with open(tmp, "w") as f:
        f.write(status.value + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
