"""What the running server is, as the protocol and stats layers may see it.

- :class:`ServerStatus` (Kestrel 2.4): UP, READONLY or QUIESCENT, kept in the
  queue folder so a restart comes back in the same status.
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

from kestreld.journal.files import STATUS_FILE

if TYPE_CHECKING:
    from kestreld.config import ServerConfig
    from kestreld.queues.collection import QueueCollection
    from kestreld.stats.counters import ServerStats


class ServerStatus(Enum):
    UP = "UP"
    READONLY = "READONLY"  # writes refused
    QUIESCENT = "QUIESCENT"  # reads and writes refused (draining before maintenance)


class StartupError(Exception):
    """The server cannot start; the message says why (and what to do)."""


class ServerState(Protocol):
    """The server as its connections and its stats see it."""

    config: ServerConfig
    config_path: str | None
    stats: ServerStats
    queues: QueueCollection
    status: ServerStatus
    connections: set[Any]
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

    def request_shutdown(self, reason: str) -> None: ...


def load_status(folder: str) -> ServerStatus:
    """The persisted status; UP when there is none or it is unreadable."""
    try:
        with open(os.path.join(folder, STATUS_FILE)) as f:
            return ServerStatus(f.read().strip().upper())
    except (OSError, ValueError):
        return ServerStatus.UP


def save_status(folder: str, status: ServerStatus) -> None:
    """Persist atomically so a restart comes back in the same status."""
    path = os.path.join(folder, STATUS_FILE)
    tmp = path + "~~"
    with open(tmp, "w") as f:
        f.write(status.value + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
