"""The servers of a client, their health, and which one an operation uses.

Kestrel clusters are plain lists of independent servers: a producer puts
each item on any server, and consumers read from all of them.  This module
holds no connections; it only decides:

- writes go to a random server that is up, the others in random order
  as fail-over;
- reads visit every server that is up, starting one further along the list
  each time, so that a busy server never starves the queue on another;
- a server whose connection failed is *down* for ``down_period`` seconds,
  doubling with each consecutive failure up to ``max_down_period``, and is
  tried again once that period is over; one success makes it fully up;
- when every server is down, all of them are offered anyway, soonest
  retry first, so that a cluster that comes back is used at once.

A cluster found through ZooKeeper (:mod:`kestreld.client.discovery`) has two
lists that change while the client runs (:meth:`Cluster.set_members`):
reads visit the read set, writes go to the write set.  A server that left
both is still known by its address, so that its open items can be
confirmed or aborted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import structlog

log = structlog.get_logger("kestreld.client")

DEFAULT_PORT = 22133
#: The longest single blocking read request; longer waits are several requests.
MAX_WAIT_SLICE = 30.0
#: Back-off between polling rounds in which no server could be asked.
MIN_BACKOFF = 0.05
MAX_BACKOFF = 1.0

ServerSpec = str | tuple[str, int]


def parse_server(spec: ServerSpec) -> tuple[str, int]:
    """``"host:port"``, ``"host"`` (port 22133), ``"[::1]:22133"`` or ``(host, port)``."""
    if isinstance(spec, tuple):
        return str(spec[0]), int(spec[1])
    text = spec.strip()
    port = ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    else:
        host = text
    if not host:
        raise ValueError(f"no host in server address {spec!r}")
    try:
        return host, int(port) if port else DEFAULT_PORT
    except ValueError:
        raise ValueError(f"bad port in server address {spec!r}") from None


@dataclass(slots=True, eq=False)
class ServerState:
    """One server and what the client knows of its health."""

    host: str
    port: int
    #: Connection failures since the last success.
    failures: int = 0
    #: ``time.monotonic()`` until which the server is avoided; 0 when up.
    down_until: float = 0.0
    #: The last connection error, for operators.
    last_error: str = ""
    #: ``time.monotonic()`` of the last failure.
    failed_at: float = 0.0

    @property
    def address(self) -> str:
        """``host:port`` (IPv6 hosts in brackets): how results and errors name the server."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def is_up(self, now: float) -> bool:
        return self.down_until <= now


class Cluster:
    """Health and choice of servers; safe to share between threads."""

    def __init__(
        self,
        servers: Iterable[ServerSpec],
        *,
        down_period: float = 5.0,
        max_down_period: float = 60.0,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        discovered: bool = False,
    ) -> None:
        #: The servers reads visit (every server, unless discovered: the read set).
        self.servers: list[ServerState] = [ServerState(*parse_server(s)) for s in servers]
        if not self.servers and not discovered:
            raise ValueError("a client needs at least one server")
        addresses = [s.address for s in self.servers]
        if len(set(addresses)) != len(addresses):
            raise ValueError(f"a server is listed twice: {addresses}")
        #: The servers writes go to; None: the same as :attr:`servers`.
        self._writers: list[ServerState] | None = [] if discovered else None
        #: Every server ever in the cluster, by address (items name their server).
        self._known: dict[str, ServerState] = {s.address: s for s in self.servers}
        #: Bumped by every membership change.
        self.version = 0
        if down_period <= 0 or max_down_period < down_period:
            raise ValueError("need 0 < down_period <= max_down_period")
        self.down_period = down_period
        self.max_down_period = max_down_period
        self.clock = clock
        self._rng = rng or random.Random()
        self._cursor = self._rng.randrange(len(self.servers)) if self.servers else 0
        self._lock = threading.Lock()

    def set_members(
        self, read: Iterable[tuple[str, int]], write: Iterable[tuple[str, int]]
    ) -> None:
        """The read and write sets now (discovery): later operations use them.

        A server keeps its health across changes; one that left both sets stays
        known by address for the items it still has open.
        """
        with self._lock:

            def states(members: Iterable[tuple[str, int]]) -> list[ServerState]:
                out = []
                for host, port in sorted(set(members)):
                    state = ServerState(host, port)
                    state = self._known.setdefault(state.address, state)
                    out.append(state)
                return out

            old_read = [s.address for s in self.servers]
            old_write = [s.address for s in self._writers or []]
            self.servers = states(read)
            self._writers = states(write)
            self.version += 1
            new_read = [s.address for s in self.servers]
            new_write = [s.address for s in self._writers]
        if (old_read, old_write) != (new_read, new_write):
            log.info("cluster_members", read=new_read, write=new_write)

    def server(self, address: str) -> ServerState:
        """The server named ``host:port``; KeyError if it was never in the cluster."""
        return self._known[address]

    def writers(self) -> list[ServerState]:
        """The servers that take writes (the write set when discovered)."""
        return self.servers if self._writers is None else self._writers

    def write_order(self) -> list[ServerState]:
        """The servers to try for a write: the first is a random one that is up."""
        now = self.clock()
        with self._lock:
            writers = self.writers()
            up = [s for s in writers if s.is_up(now)]
            if not up:
                return sorted(writers, key=lambda s: s.down_until)
            self._rng.shuffle(up)
            return up

    def rotation(self) -> list[ServerState]:
        """Every server, starting one further along the list on every call."""
        with self._lock:
            servers = self.servers
            if not servers:
                return []
            start = self._cursor % len(servers)
            self._cursor = (start + 1) % len(servers)
        return servers[start:] + servers[:start]

    def available(self, servers: Sequence[ServerState]) -> list[ServerState]:
        """Those of ``servers`` that are up, in their order; all of them, soonest retry first, if none is."""
        now = self.clock()
        up = [s for s in servers if s.is_up(now)]
        return up or sorted(servers, key=lambda s: s.down_until)

    def read_order(self) -> list[ServerState]:
        """The servers to poll for a read, starting one further along the list on every call."""
        return self.available(self.rotation())

    def everyone(self) -> Sequence[ServerState]:
        """Every server, up or down, in list order (for stats and admin commands)."""
        servers = list(self.servers)
        servers.extend(s for s in self.writers() if s not in servers)
        return servers

    def admin_targets(self) -> tuple[list[ServerState], list[ServerState]]:
        """(servers to ask, servers skipped) for an operation on every server.

        A server marked down is skipped until its retry time: asking it again
        would fail again and double its back-off once per admin call.  When
        every server is down, all of them are asked, as for reads and writes.
        """
        now = self.clock()
        everyone = self.everyone()
        up = [s for s in everyone if s.is_up(now)]
        if not up:
            return list(everyone), []
        return up, [s for s in everyone if not s.is_up(now)]

    def mark_down(
        self, state: ServerState, error: BaseException | str, started: float | None = None
    ) -> None:
        """Avoid ``state`` for a while; each consecutive failure doubles the while.

        ``started`` is when the failed request began: a failure already
        reported by a request that overlapped it (several connections
        breaking in the same outage) counts once.
        """
        with self._lock:
            if started is not None and state.failed_at >= started:
                return
            now = self.clock()
            state.failures += 1
            period = min(self.max_down_period, self.down_period * 2 ** (state.failures - 1))
            state.down_until = now + period
            state.failed_at = now
            state.last_error = str(error)
        log.warning(
            "server_down",
            server=state.address,
            error=str(error),
            failures=state.failures,
            retry_in=period,
        )

    def mark_up(self, state: ServerState, started: float | None = None) -> None:
        """``state`` answered a request begun at ``started``: it is fully up again.

        A success of a request that began before the latest failure proves
        nothing and is ignored.
        """
        if not state.failures:
            return
        with self._lock:
            if not state.failures or (started is not None and state.failed_at >= started):
                return
            state.failures = 0
            state.down_until = 0.0
        log.info("server_up", server=state.address)

    def seconds_until_retry(self) -> float:
        """How long until some server may be tried again (0 when one is up)."""
        now = self.clock()
        return max(0.0, min((s.down_until for s in self.everyone()), default=now) - now)
