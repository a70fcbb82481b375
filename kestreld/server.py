"""The composition root: lock the folder, load the queues, listen, run periodic work,
handle signals (SIGTERM/SIGINT stop gracefully, SIGHUP reloads the config) and shut down."""

from __future__ import annotations

import asyncio
import dataclasses
import fcntl
import gc
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import structlog

from kestreld import __version__
from kestreld.compiled import implementation, profile_guided, report_implementation
from kestreld.config import ConfigError, ServerConfig, dump_lines, load_config
from kestreld.config.model import alias_dump_lines
from kestreld.frontends.listener import listen
from kestreld.frontends.memcache.auth import LOCKED, LOCKED_UNKNOWN
from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.journal import handles
from kestreld.journal.files import LOCK_FILE
from kestreld.journal.handles import DescriptorBudget, descriptor_budget, raise_open_file_limit
from kestreld.journal.periodic_sync import sync_filesystem
from kestreld.log import configure_logging, set_log_level
from kestreld.loop.busy_poll import DEFAULT_LIMIT_US, BusyPoll
from kestreld.loop.hold import HoldProbe
from kestreld.queues import heap
from kestreld.queues.collection import Kestrel2JournalsFound, QueueCollection
from kestreld.session.gate import Gate
from kestreld.session.open_ids import OpenIds
from kestreld.session.trace import SessionTrace
from kestreld.state import (
    ServerStatus,
    StartupError,
    default_status_file,
    load_status,
    save_status,
)
from kestreld.stats import ServerStats, StatLinesCache, render_dump_stats, render_stats
from kestreld.status import StatusBoard

if TYPE_CHECKING:
    from kestreld.security import Authenticator, ServerTls, TlsFiles
    from kestreld.workers.role import WorkerRole
    from kestreld.workers.routing import Router

log = structlog.get_logger("kestreld.server")


#: Settings read once at start-up: a reload names them instead of applying them.
RESTART_KEYS = (
    "listen_address",
    "port",
    "text_port",
    "thrift_port",
    "queue_path",
    "workers",
    "metrics_port",
    "metrics_address",
    "log_format",
    "checkpoint_interval",
    "busy_poll_us",
    "expiration_timer_frequency",
    "default_status",
    "status_file",
    "zookeeper",
    "tls_verify_client",
    "tls_handshake_timeout",
    "admin_tls_cert_file",
    "admin_tls_key_file",
)
#: The answer, in the clear, to a plaintext client on the TLS port (then it is closed).
TLS_REQUIRED = b"SERVER_ERROR this port requires TLS\r\n"

#: Security files: their contents reload live; switching one on or off needs a restart.
SECURITY_FILE_KEYS = ("tls_cert_file", "auth_file")

#: How long a graceful stop waits to leave the server sets before closing the listeners.
LEAVE_TIMEOUT = 5.0

__all__ = ["RESTART_KEYS", "Server", "StartupError", "build_server_config", "run_server"]


class Server:
    def __init__(
        self,
        config: ServerConfig,
        config_path: str | None = None,
        overrides: dict[str, Any] | None = None,
        role: WorkerRole | None = None,
    ) -> None:
        self.config = config
        #: With ``workers = N``: which worker this is (kestreld/workers/); None: the only one.
        self.role = role
        #: The memcache command table (a worker's routes requests to their queue's owner).
        self.commands = COMMANDS
        self.memcache_connection: type[MemcacheConnection] = MemcacheConnection
        #: Where a worker's requests run (kestreld/workers/routing.py); None: here.
        self.router: Router | None = None
        self.config_path = config_path
        self.overrides = overrides or {}
        self.stats = ServerStats()
        self.stat_lines = StatLinesCache()  # each queue's stats lines, redone when it changed
        self.connections: set[MemcacheConnection] = set()
        #: Polls for a lone client's next request (busy_poll_us; None: the build's default).
        poll_us = config.busy_poll_us
        self.busy_poll = BusyPoll(DEFAULT_LIMIT_US if poll_us is None else poll_us)
        self.loop_hold = HoldProbe()  # how late the loop serves a timer (loop_hold_* stats)
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="kestreld-io")
        self.queues = QueueCollection(
            config, self.executor, role.ownership.owns if role is not None else None
        )
        #: How the open-file limit is shared (set at start, once the limit is raised).
        self.descriptors: DescriptorBudget | None = None
        #: The status requests are checked against (the announced one after its grace period).
        self.status = ServerStatus.UP
        #: Why writes / fetches are refused now and who observes latencies, kept current
        #: here and read by every request of every session (kestreld/session/gate.py).
        self.gate = Gate()
        self.status_board = StatusBoard(ServerStatus.UP, config.status_change_grace_period)
        self._status_timer: asyncio.TimerHandle | None = None
        #: This server's members of the ZooKeeper server sets ([zookeeper]), else None.
        self.membership: Any = None
        self.zookeeper_connected = False
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self._server: asyncio.base_events.Server | None = None
        #: Every listener by front end ("memcache", "text", "thrift").
        self.listeners: dict[str, asyncio.base_events.Server] = {}
        #: Reads held under server-wide ids (thrift's get with auto_abort_msec).
        self.open_ids = OpenIds()
        self._lock_fd = -1
        self._tasks: list[asyncio.Task] = []
        self._stopping: asyncio.Event | None = None
        self._stopped = False
        self.metrics = None
        #: TLS of the memcache listener (tls_cert_file), None without.
        self.tls: ServerTls | None = None
        #: The users of auth_file; None: clients need not authenticate (Kestrel's way).
        self.authenticator: Authenticator | None = None
        #: Kestrel's session trace (enable_session_trace); None when off.
        self.session_trace: SessionTrace | None = (
            SessionTrace() if config.enable_session_trace else None
        )

    # --- start-up -----------------------------------------------------------------------

    def _lock_folder(self) -> None:
        if self.role is None:  # a worker's supervisor holds the lock
            self._lock_fd = lock_queue_folder(self.config.queue_path)

    def _share_descriptors(self) -> None:
        """Raise the soft open-file limit to the hard one, and share it: the journals keep
        their descriptors within their part (idle ones are closed), and connections past
        theirs are refused with the protocol's error instead of failing to be accepted."""
        was, soft = raise_open_file_limit()  # a worker's was raised (and logged) by the supervisor
        budget = self.descriptors = descriptor_budget(soft, self.role.count if self.role else 1)
        self.queues.handles.resize(budget.journals)
        if self.role is None:
            handles.log_open_file_limit(was, soft, budget, self.config.max_connections)
        self.config = self._capped(self.config)

    def _capped(self, config: ServerConfig) -> ServerConfig:
        """``config`` with max_connections within the connections' share of descriptors."""
        budget = self.descriptors
        if budget is None or config.max_connections <= budget.connections:
            return config
        return dataclasses.replace(config, max_connections=budget.connections)

    def _load_security(self) -> None:
        """TLS context and auth file from the config (raises StartupError naming the file)."""
        config = self.config
        tls = _tls_files(config)
        if tls is None and config.auth_file is None:
            return  # neither: their modules are never loaded (0.1 MiB of an idle server)
        from kestreld.security.auth_file import AuthFileError, load_auth_file
        from kestreld.security.authenticator import Authenticator
        from kestreld.security.tls import ServerTls, TlsError

        try:
            if tls is not None:
                self.tls = ServerTls(tls, config.tls_handshake_timeout / 1000)
            if config.auth_file is not None:
                self.authenticator = Authenticator(load_auth_file(config.auth_file))
        except (TlsError, AuthFileError) as e:
            raise StartupError(str(e)) from None

    async def start(self) -> None:
        """Lock the folder, rebuild the queues, listen.  Raises StartupError."""
        self.loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        self._share_descriptors()
        self._load_security()
        self._lock_folder()
        try:
            status = load_status(self.status_path, ServerStatus(self.config.default_status))
            self.status_board = StatusBoard(status, self.config.status_change_grace_period)
            self._enforce(status)
            started = time.monotonic()
            try:
                self.queues.load()
            except Kestrel2JournalsFound as e:
                raise StartupError(str(e)) from None
            except OSError as e:
                # An unreadable journal file: refuse rather than start without its items.
                where = e.filename or self.config.queue_path
                raise StartupError(f"cannot read {where}: {e.strerror}") from None
            log.info(
                "queues_loaded",
                count=len(self.queues.queues),
                seconds=round(time.monotonic() - started, 3),
            )
            if self.role is not None:  # routes set before the first client is accepted
                self.router = await self.role.attach(self)
                self.commands = self.router.table()
                self.memcache_connection = self.router.connection_class
            await self._listen()
        except BaseException:
            self._unlock()
            raise
        self._tasks = [
            self.loop.create_task(
                self._every(self.config.checkpoint_interval, self.queues.checkpoint)
            ),
            self.loop.create_task(self._every(1000, self._idle_sweep)),
            self.loop.create_task(self.loop_hold.run()),
        ]
        if self.config.expiration_timer_frequency:
            self._tasks.append(
                self.loop.create_task(
                    self._every(self.config.expiration_timer_frequency, self.queues.sweep)
                )
            )
        serves_box = self.role is None or self.role.serves_box
        await self._start_metrics()  # every worker's counts; worker 0's serves the box's
        if self.config.zookeeper is not None and serves_box:
            try:
                self._join_server_sets()
            except StartupError:
                for listener in self.listeners.values():
                    listener.close()
                self._unlock()
                raise
        addresses = {}
        for kind, listener in self.listeners.items():
            sock = listener.sockets[0].getsockname()
            addresses[kind] = f"{sock[0]}:{sock[1]}"
        log.info(
            "listening" if self.role is None else "worker_listening",
            address=next(iter(addresses.values())),  # memcache's, when it is on
            **addresses,
            config=os.path.abspath(self.config_path) if self.config_path else None,
            queue_path=os.path.abspath(self.config.queue_path),
            status=self.status.value,
            version=__version__,
            implementation=implementation(),
            profile_guided=profile_guided(),
            tls=self.tls is not None,
            auth=self.authenticator is not None,
        )
        # What start-up freed (compiled config and modules, the journals' replay: large for
        # a restart with a backlog) is given back now, once; what stays is frozen, so the
        # cycle collector's full passes skip it (7 ms of the event loop each, 2 frozen).
        heap.release()
        gc.freeze()
        if self.role is not None:
            self.role.announce_ready()

    def _connection(self) -> asyncio.Protocol:
        """A new memcache connection: locked until it authenticates with an auth file, and
        TLS between its socket and the memcache protocol when the port is TLS's
        (kestreld/security/tls_stream.py)."""
        if self.authenticator is None:
            conn = self.memcache_connection(self, self.commands, UNKNOWN)
        else:  # nothing runs until it authenticates (kestreld/frontends/memcache/auth.py)
            conn = self.memcache_connection(self, LOCKED, LOCKED_UNKNOWN)
        return self._secured(conn)

    def _secured(self, conn: asyncio.Protocol) -> asyncio.Protocol:
        """``conn`` behind TLS when the listeners are TLS's, else ``conn`` itself."""
        if self.tls is None:
            return conn
        from kestreld.security.tls_stream import TlsStream

        return TlsStream(self.tls, conn, TLS_REQUIRED)

    async def _listen(self) -> None:
        """Open every configured front end's port (raises StartupError).

        ``text_port`` and ``thrift_port``: 0 is off.  ``port`` (memcache): 0 is
        off when another front end is on; alone, 0 asks the system for a free
        port (the test harness's way to start a server).  TLS, when configured,
        is on every listener.
        """
        config = self.config
        wanted: list[tuple[str, int, Callable[[], Any]]] = []
        # Kestrel's text and thrift front ends are imported only when configured: the thrift
        # one (thriftpy2 and its parsed IDL) is about 5 MiB of a server's idle memory.
        if config.text_port:
            from kestreld.frontends.text.connection import TextConnection

            text = TextConnection if self.role is None else self.role.front_ends["text"]
            wanted.append(("text", config.text_port, lambda: self._secured(text(self))))
        if config.thrift_port:
            from kestreld.frontends.thrift.connection import ThriftConnection

            thrift = ThriftConnection if self.role is None else self.role.front_ends["thrift"]
            wanted.append(("thrift", config.thrift_port, lambda: self._secured(thrift(self))))
        if config.port or not wanted:
            wanted.insert(0, ("memcache", config.port, self._connection))
        for kind, port, factory in wanted:
            # With workers, the supervisor's socket, shared by every worker.
            sock = self.role.sockets[kind] if self.role is not None else None
            try:
                address = config.listen_address
                self.listeners[kind] = await listen(self.loop, factory, address, port, sock)
            except OSError as e:
                for listener in self.listeners.values():
                    listener.close()
                raise StartupError(
                    f"cannot listen on {config.listen_address}:{port} ({kind}): {e.strerror}"
                ) from None
        self._server = next(iter(self.listeners.values()))

    async def _start_metrics(self) -> None:
        if self.config.metrics_port is None:
            return
        from kestreld.admin.http import AdminServer

        self.metrics = AdminServer(self)
        await self.metrics.start()

    def _join_server_sets(self) -> None:
        """Start following the status in the ZooKeeper server sets (in the background)."""
        try:
            from kestreld.cluster.membership import membership_of_server
        except ImportError as e:
            from kestreld.extras import install_command

            raise StartupError(
                f"[zookeeper] needs the kazoo library ({e}): {install_command('zookeeper')}"
            ) from None
        loop = self.loop

        def connected(value: bool) -> None:  # from a kazoo thread
            loop.call_soon_threadsafe(setattr, self, "zookeeper_connected", value)

        ports = {kind: lsn.sockets[0].getsockname()[1] for kind, lsn in self.listeners.items()}
        zk, address = self.config.zookeeper, self.config.listen_address
        assert zk is not None
        try:
            self.membership = membership_of_server(zk, address, ports, connected)
        except ValueError as e:
            raise StartupError(f"zookeeper.advertise_address: {e}") from None
        announced = self.status_board.announced
        self.membership.want(announced.in_read_set, announced.in_write_set)
        self.membership.start()

    @property
    def status_path(self) -> str:
        return self.config.status_file or default_status_file(self.config.queue_path)

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.sockets[0].getsockname()[1]

    # --- periodic work ------------------------------------------------------------------

    async def _every(self, period_ms: int, fn) -> None:
        period = max(period_ms, 10) / 1000
        while True:
            await asyncio.sleep(period)
            try:
                result = fn()
                if asyncio.iscoroutine(result):
                    await result
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("periodic_task_failed", task=getattr(fn, "__name__", str(fn)))

    def _idle_sweep(self) -> None:
        timeout = self.config.client_timeout
        if not timeout:
            return
        now = time.monotonic()
        for conn in list(self.connections):
            if conn.idle_for(now) * 1000 >= timeout:
                log.info("idle_connection_closed", peer=conn.peer)
                conn.close()

    # --- commands -----------------------------------------------------------------------

    def render_stats(self) -> bytes:
        extra: list[tuple[str, object]] = [("status", self.status.value)]
        pending = self.status_board.pending
        if pending is not None:
            extra.append(("status_pending", pending.value))
        if self.membership is not None:
            extra.append(("zookeeper_connected", int(self.zookeeper_connected)))
        extra.extend(self.busy_poll.stats() + self.loop_hold.stats())
        if self.role is not None:
            extra.extend(self.role.stats())
        return render_stats(
            self.stats, self.queues, self.clients(), __version__, extra, self.stat_lines
        )

    def render_dump_stats(self, names: list[str]) -> bytes:
        return render_dump_stats(self.queues, names)

    def render_dump_config(self, names: list[str]) -> bytes:
        aliases = self.config.aliases
        if not names:
            names = sorted(
                [q for q in self.queues.queues if q not in aliases]
                + [r.full_name for r in self.queues.readers() if r.name]
                + list(aliases)
            )
        lines = []
        for name in names:
            if name in aliases:
                lines.append(f"alias '{name}' {{")
                lines.extend("  " + line for line in alias_dump_lines(aliases[name]))
            else:
                lines.append(f"queue '{name}' {{")
                lines.extend("  " + line for line in dump_lines(self.config.queue(name)))
            lines.append("}")
        lines.append("END\r\n")
        return "\r\n".join(lines).encode()

    def reload(self) -> tuple[str | None, list[str]]:
        """Re-read the config file: (error or None, keys that need a restart to apply).

        Queue settings and most server settings apply at once (``log_level``
        too); the keys of :data:`RESTART_KEYS` keep their running values and are
        named, in the reply and the log.
        """
        if self.config_path is None:
            log.warning("config_reload_skipped", reason="no config file (started without --config)")
            return "no config file to reload (started without --config)", []
        try:
            fresh = load_config(self.config_path)
        except ConfigError as e:
            log.error("config_reload_failed", source=self.config_path, error=str(e))
            return f"config not reloaded: {e}", []
        fresh = self._capped(dataclasses.replace(fresh, **self.overrides))
        needs_restart = []
        for key in RESTART_KEYS:
            if getattr(fresh, key) != getattr(self.config, key):
                needs_restart.append(key)
                fresh = dataclasses.replace(fresh, **{key: getattr(self.config, key)})
        fresh, error = self._reload_security(fresh, needs_restart)
        if error is not None:
            log.error("config_reload_failed", source=self.config_path, error=error)
            return f"config not reloaded: {error}", []
        if fresh.log_level != self.config.log_level:
            set_log_level(fresh.log_level)
        if fresh.enable_session_trace != (self.session_trace is not None):
            self.session_trace = SessionTrace() if fresh.enable_session_trace else None
        self.config = fresh
        self.queues.reconfigure(fresh)
        self._judge_refusals()  # the connection limits may have changed
        if needs_restart:
            log.warning("config_reload_needs_restart", keys=",".join(needs_restart))
        log.info("config_reloaded", source=self.config_path, needs_restart=",".join(needs_restart))
        return None, needs_restart

    def _reload_security(
        self, fresh: ServerConfig, needs_restart: list[str]
    ) -> tuple[ServerConfig, str | None]:
        """Read the TLS files and the auth file again (renewed certificates, changed users).

        All or nothing: on an error nothing changes and the error is returned.
        Turning TLS or authentication on or off needs a restart (named, as the
        restart keys are).
        """
        old = self.config
        for key, group in (
            ("tls_cert_file", ("tls_cert_file", "tls_key_file", "tls_ca_file")),
            ("auth_file", ("auth_file",)),
        ):
            if (getattr(fresh, key) is None) != (getattr(old, key) is None):
                needs_restart.append(key)
                fresh = dataclasses.replace(fresh, **{k: getattr(old, k) for k in group})
        auth = None
        if fresh.auth_file is not None:
            from kestreld.security import AuthFileError, load_auth_file

            try:
                auth = load_auth_file(fresh.auth_file)
            except AuthFileError as e:
                return fresh, str(e)
        tls = _tls_files(fresh)
        if self.tls is not None and tls is not None:
            error = self.tls.reload(tls)
            if error is not None:
                return fresh, error
        admin_tls = self.metrics.tls if self.metrics is not None else None
        if admin_tls is not None:  # renewed admin certificate files (their paths need a restart)
            error = admin_tls.reload()
            if error is not None:
                return fresh, f"admin port: {error}"
        if self.authenticator is not None and auth is not None:
            self.authenticator.replace(auth)
        return fresh, None

    def reload_on_signal(self) -> None:
        """SIGHUP: reload the config (the daemon convention), never stop."""
        log.info("reload_requested", reason="SIGHUP")
        self.reload()

    def set_status(self, status: ServerStatus) -> None:
        """Announce ``status`` (file, server sets) at once; enforce it after the grace period
        when it is stricter than the status in force."""
        board = self.status_board
        old = board.announced
        board.set_grace_period(self.config.status_change_grace_period)
        if not board.change(status, self.loop.time()):
            return
        try:
            if self.role is None or self.role.serves_box:  # every worker hears it; one saves
                save_status(self.status_path, status)
        except OSError as e:  # as Kestrel: the change applies, a restart will not remember it
            log.error("status_not_saved", path=self.status_path, error=e.strerror or str(e))
        if self.membership is not None:
            self.membership.want(status.in_read_set, status.in_write_set)
        self._enforce(board.enforced)
        if self._status_timer is not None:
            self._status_timer.cancel()
            self._status_timer = None
        left = board.seconds_left(self.loop.time())
        if left is not None:
            self._status_timer = self.loop.call_later(left, self._enforce_pending_status)
        log.info(
            "status_changed",
            old=old.value,
            new=status.value,
            enforced=board.enforced.value,
            grace_seconds=left,
        )

    def _enforce_pending_status(self) -> None:
        self._status_timer = None
        if self.status_board.expire(self.loop.time()):
            self._enforce(self.status_board.enforced)
            log.info("status_enforced", status=self.status.value)

    def _enforce(self, status: ServerStatus) -> None:
        self.status = status
        self._judge_refusals()

    def _judge_refusals(self) -> None:
        """Why writes and fetches are refused now: READONLY and QUIESCENT refuse writes
        (WRITEAVOID only leaves the write server set), QUIESCENT refuses fetches, and so do
        more connections than ``connection_limit_refuse_writes`` / ``_reads``."""
        status = self.status
        count = self.clients()
        config = self.config
        limit = config.connection_limit_refuse_writes
        writes = reads = None
        if status.refuses_writes:
            writes = f"server is {status.value}"
        elif limit is not None and count > limit:
            writes = "too many connections for writes"
        limit = config.connection_limit_refuse_reads
        if status.refuses_reads:
            reads = f"server is {status.value}"
        elif limit is not None and count > limit:
            reads = "too many connections for reads"
        self.gate.refuse(writes, reads)

    @property
    def writes_refused(self) -> str | None:
        """Why writes are refused now (None: they are taken); see :meth:`_judge_refusals`."""
        return self.gate.writes_refused

    @property
    def reads_refused(self) -> str | None:
        return self.gate.reads_refused

    @property
    def latency_observer(self) -> Callable[..., None] | None:
        """Called with (kind, seconds) for "set", "get_hit" and "get_timeout" (metrics)."""
        return self.gate.latency_observer

    @latency_observer.setter
    def latency_observer(self, observer: Callable[..., None] | None) -> None:
        self.gate.observe(observer)

    def connection_opened(self, conn: Any) -> None:
        """A connection was accepted (front ends call this, and :meth:`connection_closed`)."""
        self.connections.add(conn)
        self._judge_refusals()

    def clients(self) -> int:
        """Client connections: a worker's channel connections are the box's own."""
        return len(self.connections) - (self.role.channel_count.open if self.role else 0)

    def connection_closed(self, conn: Any) -> None:
        self.connections.discard(conn)
        self._judge_refusals()
        if self.router is not None:
            self.router.connection_closed(conn)

    def describe_status(self) -> str:
        """The ``status`` reply: the status in force, and a pending one with its seconds left."""
        board = self.status_board
        pending = board.pending
        if pending is None:
            return self.status.value
        left = board.seconds_left(self.loop.time()) or 0.0
        return f"{self.status.value} (pending {pending.value} in {left:.1f}s)"

    def request_shutdown(self, reason: str) -> None:
        log.info("shutdown_requested", reason=reason)
        if self._stopping is not None:
            self._stopping.set()

    # --- shutdown -------------------------------------------------------------------------

    async def wait_stopped(self) -> None:
        assert self._stopping is not None
        await self._stopping.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop accepting, give open reads back, sync journals, write checkpoints."""
        if self._stopped:
            return
        self._stopped = True
        if self._status_timer is not None:
            self._status_timer.cancel()
        if self.membership is not None:
            # Out of both server sets before the listeners close: clients stop choosing
            # this server instead of finding it refusing connections.
            left = await asyncio.to_thread(self.membership.leave, LEAVE_TIMEOUT)
            log.info("server_sets_left" if left else "server_sets_not_left")
        for listener in self.listeners.values():
            listener.close()
        for task in self._tasks:
            task.cancel()
        if self.metrics is not None:
            await self.metrics.stop()
        # Every connection takes no new request, answers a wait in progress and
        # sends every reply it promised before it closes (one close path): the
        # journals are synced so pending STORED and confirm replies resolve.  A
        # dropped STORED would make its producer retry an item already stored.
        for conn in list(self.connections):
            conn.close()
        if self.router is not None:
            self.router.stopping()  # waits forwarded to other workers end now
        journals = [q.journal for q in self.queues.queues.values() if q.journal is not None]
        # Every journal's buffer is written, then one sync of the file system covers them
        # all (and the files of idle queues whose descriptors were closed): one fsync per
        # queue cost seconds with thousands of queues.
        written = [(journal, journal.write_now()) for journal in journals]
        error = None
        if journals:
            try:
                await asyncio.to_thread(sync_filesystem, self.config.queue_path)
            except OSError as e:
                error = e.strerror or str(e)
        for journal, batches in written:
            journal.synced(batches, error)
        deadline = time.monotonic() + 2.0
        while any(j.syncing for j in journals) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # background fsyncs resolve their batches
        deadline = time.monotonic() + 2.0
        while any(not c.finished() for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.005)  # replies drain; clients that do not read are cut
        for conn in list(self.connections):
            conn.close_now()
        if self.role is not None:  # after the replies other workers owed our clients
            self.role.close()
        self.open_ids.close()  # reads held under thrift ids go back before the journals close
        await asyncio.sleep(0)
        self.queues.close()
        if self.authenticator is not None:
            self.authenticator.close()
        self.executor.shutdown(wait=True)
        if self.membership is not None:
            await asyncio.to_thread(self.membership.close)
        self._unlock()
        log.info("stopped")

    def _unlock(self) -> None:
        if self._lock_fd >= 0:
            try:
                os.close(self._lock_fd)
            except OSError:
                pass
            self._lock_fd = -1


def lock_queue_folder(folder: str) -> int:
    """Create and lock the queue folder: the descriptor holding the lock (StartupError
    when another kestreld holds it)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise StartupError(f"cannot create queue folder {folder}: {e.strerror}") from None
    path = os.path.join(folder, LOCK_FILE)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise StartupError(f"cannot open {path}: {e.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise StartupError(
            f"queue folder {os.path.abspath(folder)} is in use by another kestreld"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _tls_files(config: ServerConfig) -> TlsFiles | None:
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    from kestreld.security import TlsFiles

    return TlsFiles(
        config.tls_cert_file, config.tls_key_file, config.tls_ca_file, config.tls_verify_client
    )


def build_server_config(config_path: str | None, overrides: dict[str, Any]) -> ServerConfig:
    config = load_config(config_path)
    return dataclasses.replace(config, **overrides) if overrides else config


async def _main(
    config: ServerConfig,
    config_path: str | None,
    overrides: dict[str, Any],
    role: WorkerRole | None = None,
) -> int:
    server = Server(config, config_path, overrides, role)
    # Handlers first: a SIGTERM right after "listening" (or during start-up) must
    # still shut down gracefully, not kill the process with writes unsynced.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.request_shutdown, sig.name)
    loop.add_signal_handler(signal.SIGHUP, server.reload_on_signal)
    try:
        await server.start()
    except StartupError as e:
        log.error("startup_failed", error=str(e))
        return 1
    await server.wait_stopped()
    return 0


def run_server(config_path: str | None, overrides: dict[str, Any]) -> int:
    """Run until SIGTERM/SIGINT or ``shutdown``; the exit code of the process."""
    try:
        config = build_server_config(config_path, overrides)
    except ConfigError as e:
        configure_logging(overrides.get("log_format", "console"), "info")
        log.error("bad_config", error=str(e))
        print(f"kestreld: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_format, config.log_level)
    report_implementation(log)
    if config.workers > 1:
        from kestreld.workers.supervisor import run_supervisor

        return run_supervisor(config, config_path, overrides)
    return serve(config, config_path, overrides)


def serve(
    config: ServerConfig,
    config_path: str | None,
    overrides: dict[str, Any],
    role: WorkerRole | None = None,
) -> int:
    """Run a server (the box's only one, or worker ``role``) on a new event loop."""
    heap.configure()
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        code = asyncio.run(_main(config, config_path, overrides, role))
    else:
        code = uvloop.run(_main(config, config_path, overrides, role))
    # Stopped, all on disk: frozen, every queue's objects are left to the process's end
    # instead of the exit's cycle collector (seconds of a graceful stop at 10,000 queues).
    gc.freeze()
    return code
