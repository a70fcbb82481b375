"""The supervisor of ``workers = N``: one process that holds what the box has once.

It locks the queue folder, binds each front end's listening socket once, makes the
private folder (0700) of the workers' channels, and forks the N workers before any event
loop exists; every worker accepts on the same sockets (the kernel's one accept queue:
a worker that dies loses no connection waiting there, which ``SO_REUSEPORT``'s
per-socket queues would).  Then it only watches:

- a worker that dies is forked again at once (its queues come back from their journals
  as after a crash); one that dies before it serves (damaged files, say) is retried with
  a growing delay while the others serve, and each try is logged;
- SIGTERM or SIGINT: every worker stops gracefully; the supervisor exits once all did;
- SIGHUP is passed to every worker (each reloads its config);
- each worker asks the kernel to kill it when the supervisor dies (PR_SET_PDEATHSIG), so
  a kill -9 of the supervisor leaves no worker holding the port or the folder.
"""

from __future__ import annotations

import ctypes
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import structlog

from kestreld import __version__
from kestreld.compiled import implementation
from kestreld.config import ServerConfig
from kestreld.journal.handles import descriptor_budget, log_open_file_limit, raise_open_file_limit
from kestreld.security import AuthFileError, TlsError, TlsFiles, build_context, load_auth_file
from kestreld.security.tls import ServerTls
from kestreld.state import ServerStatus, StartupError, default_status_file, load_status

log = structlog.get_logger("kestreld.supervisor")

#: The longest wait between two tries of a worker that cannot start.
MAX_RETRY_DELAY = 30.0
#: How long a graceful stop may take before the workers left are killed.
STOP_TIMEOUT = 60.0
_PR_SET_PDEATHSIG = 1
#: The channels' folder: kestreld-workers-<supervisor pid>-<random>.
CHANNELS_PREFIX = "kestreld-workers-"


@dataclass(slots=True)
class Child:
    """One worker slot: the process in it now, and how its starts went."""

    index: int
    pid: int = 0
    ready_fd: int = -1
    ready: bool = False  # it said it serves, since it was last forked
    served: bool = False  # it served at least once
    failures: int = 0  # starts in a row that died before serving
    start_at: float = 0.0  # when to fork it (again)


class Supervisor:
    def __init__(
        self, config: ServerConfig, config_path: str | None, overrides: dict[str, Any]
    ) -> None:
        self.config = config
        self.config_path = config_path
        self.overrides = overrides
        self.count = config.workers
        self.children = [Child(i) for i in range(self.count)]
        self.sockets: dict[str, socket.socket] = {}
        self.folder = ""
        self.lock_fd = -1
        self.stopping = False
        self.stop_signal = 0  # SIGTERM or SIGINT received
        self.hup = False  # SIGHUP received
        self.stop_deadline = 0.0
        self.announced = False
        self.exit_code = 0
        self._wake_r, self._wake_w = socket.socketpair()

    # --- start-up -----------------------------------------------------------------------

    def _prepare(self) -> None:
        """Lock the folder, bind the listening sockets, make the channels' folder."""
        from kestreld.server import lock_queue_folder

        config = self.config
        # The security files are read once here too: a bad one stops the box, naming it,
        # rather than every worker failing to start and being retried.
        try:
            if config.tls_cert_file is not None and config.tls_key_file is not None:
                build_context(
                    TlsFiles(
                        config.tls_cert_file,
                        config.tls_key_file,
                        config.tls_ca_file,
                        config.tls_verify_client,
                    )
                )
            if config.auth_file is not None:
                load_auth_file(config.auth_file)
        except (TlsError, AuthFileError) as e:
            raise StartupError(str(e)) from None
        if config.admin_tls_cert_file is not None and config.admin_tls_key_file is not None:
            # Worker 0's: read here too, so bad files stop the box as they stop a lone server.
            try:
                ServerTls(TlsFiles(config.admin_tls_cert_file, config.admin_tls_key_file))
            except TlsError as e:
                raise StartupError(f"admin port: {e}") from None
        self.lock_fd = lock_queue_folder(config.queue_path)
        # Once for the box: the workers inherit the raised limit (each process has its own).
        was, soft = raise_open_file_limit()
        budget = descriptor_budget(soft, self.count)
        log_open_file_limit(was, soft, budget, config.max_connections, workers=self.count)
        # As one server: memcache's port 0 is off when another front end is on.
        if config.port or not (config.text_port or config.thrift_port):
            self.sockets["memcache"] = _bind(config.listen_address, config.port, "(memcache)")
        if config.text_port:
            self.sockets["text"] = _bind(config.listen_address, config.text_port, "(text)")
        if config.thrift_port:
            self.sockets["thrift"] = _bind(config.listen_address, config.thrift_port, "(thrift)")
        if config.metrics_port is not None:
            # Worker 0's admin port, bound here once: a taken port stops the box's start as
            # it stops a lone server's, and it stays bound while worker 0 restarts.
            address = config.metrics_address or config.listen_address
            self.sockets["admin"] = _bind(address, config.metrics_port, "for metrics")
        runtime = os.environ.get("XDG_RUNTIME_DIR")
        if not runtime or not os.path.isdir(runtime):
            runtime = tempfile.gettempdir()
        _remove_stale_folders(runtime)
        prefix = f"{CHANNELS_PREFIX}{os.getpid()}-"
        self.folder = tempfile.mkdtemp(prefix=prefix, dir=runtime)  # mode 0700

    def run(self) -> int:
        try:
            self._prepare()
        except StartupError as e:
            log.error("startup_failed", error=str(e))
            self._cleanup()
            return 1
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_stop)
        signal.signal(signal.SIGHUP, self._on_hup)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the loop (the wakeup fd)
        try:
            self._watch()
        finally:
            self._cleanup()
        log.info("stopped", workers=self.count)
        return self.exit_code

    # --- signals ----------------------------------------------------------------------------

    # Handlers only note the signal: the watch loop acts on it.  (A handler that logged
    # could run while the loop is inside the logger's lock, and wait on it for ever.)

    def _on_stop(self, signum: int, frame: Any) -> None:
        self.stop_signal = signum

    def _on_hup(self, signum: int, frame: Any) -> None:
        self.hup = True

    def _handle_signals(self) -> None:
        if self.stop_signal and not self.stopping:
            self.stopping = True
            self.stop_deadline = time.monotonic() + STOP_TIMEOUT
            reason = signal.Signals(self.stop_signal).name
            log.info("shutdown_requested", reason=reason, workers=self.count)
            self._signal_all(signal.SIGTERM)
        if self.hup:
            self.hup = False
            log.info("reload_requested", reason="SIGHUP", workers=self.count)
            self._signal_all(signal.SIGHUP)

    def _signal_all(self, sig: int) -> None:
        for child in self.children:
            if child.pid:
                try:
                    os.kill(child.pid, sig)
                except ProcessLookupError:
                    pass

    # --- the watch loop ---------------------------------------------------------------------

    def _watch(self) -> None:
        for child in self.children:
            self._fork(child)
        while True:
            self._handle_signals()
            self._reap()
            if self.stopping:
                if not any(c.pid for c in self.children):
                    return
                if time.monotonic() > self.stop_deadline:
                    log.error("workers_killed", reason="graceful stop took too long")
                    self._signal_all(signal.SIGKILL)
                    self.exit_code = 1
            else:
                now = time.monotonic()
                for child in self.children:
                    if not child.pid and child.start_at <= now:
                        self._fork(child)
            self._wait()

    def _wait(self) -> None:
        """Sleep until a signal, a worker's ready byte, or the next restart is due."""
        timeout = 0.5
        if not self.stopping:
            due = [c.start_at for c in self.children if not c.pid]
            if due:
                timeout = max(0.0, min(timeout, min(due) - time.monotonic()))
        fds = [self._wake_r.fileno()] + [c.ready_fd for c in self.children if c.ready_fd >= 0]
        try:
            readable, _, _ = select.select(fds, [], [], timeout)
        except InterruptedError:
            return
        if self._wake_r.fileno() in readable:
            try:
                while self._wake_r.recv(512):
                    pass
            except BlockingIOError:
                pass
        for child in self.children:
            if child.ready_fd >= 0 and child.ready_fd in readable:
                self._read_ready(child)

    def _read_ready(self, child: Child) -> None:
        try:
            said = os.read(child.ready_fd, 1)
        except OSError:
            said = b""
        os.close(child.ready_fd)
        child.ready_fd = -1
        if said != b"R":
            return  # it died before serving: _reap says so
        child.ready = child.served = True
        child.failures = 0
        log.info("worker_ready", worker=child.index, pid=child.pid)
        self._announce()

    def _announce(self) -> None:
        """``listening`` once every worker served or failed once (one that cannot start is
        retried while the others serve)."""
        if self.announced or not all(c.ready or c.failures for c in self.children):
            return
        self.announced = True
        addresses = {}
        for kind, listener in self.sockets.items():
            sock = listener.getsockname()
            addresses[kind] = f"{sock[0]}:{sock[1]}"
        log.info(
            "listening",
            address=next(iter(addresses.values())),  # memcache's, when it is on
            **addresses,
            workers=self.count,
            workers_serving=sum(c.ready for c in self.children),
            config=os.path.abspath(self.config_path) if self.config_path else None,
            queue_path=os.path.abspath(self.config.queue_path),
            status=self._status().value,  # as a lone server's event says it
            version=__version__,
            implementation=implementation(),
            pid=os.getpid(),
        )

    def _status(self) -> ServerStatus:
        """The box's status, as its workers read it at start (the one status file)."""
        config = self.config
        path = config.status_file or default_status_file(config.queue_path)
        return load_status(path, ServerStatus(config.default_status))

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = next((c for c in self.children if c.pid == pid), None)
            if child is None:
                continue
            self._ended(child, status)

    def _ended(self, child: Child, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        if child.ready_fd >= 0:
            os.close(child.ready_fd)
            child.ready_fd = -1
        was_ready = child.ready
        child.pid = 0
        child.ready = False
        if self.stopping:
            log.info("worker_stopped", worker=child.index, exit_code=code)
            if code != 0:
                self.exit_code = 1
            return
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        if was_ready:
            child.start_at = time.monotonic()  # at once: its clients are waiting
            log.error("worker_died", worker=child.index, how=how, restart_in=0.0)
        else:
            child.failures += 1
            delay = min(MAX_RETRY_DELAY, 0.25 * 2 ** (child.failures - 1))
            child.start_at = time.monotonic() + delay
            log.error(
                "worker_failed_to_start",
                worker=child.index,
                how=how,
                failures=child.failures,
                retry_in=delay,
            )
            self._announce()

    # --- a worker's life --------------------------------------------------------------------

    def _fork(self, child: Child) -> None:
        from kestreld.workers.role import WorkerRole

        ready_r, ready_w = os.pipe()
        parent = os.getpid()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                os.close(ready_r)
                self._become_worker(parent)
                # Every event of this process names its worker (the box logs to one stream).
                structlog.contextvars.bind_contextvars(worker=child.index)
                role = WorkerRole(child.index, self.count, self.sockets, self.folder, ready_w)
                code = run_worker(self.config, self.config_path, self.overrides, role)
            except BaseException:
                log.exception("worker_crashed", worker=child.index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        os.close(ready_w)
        child.pid = pid
        child.ready_fd = ready_r
        log.info("worker_started", worker=child.index, pid=pid)

    def _become_worker(self, parent: int) -> None:
        """In the forked worker: the supervisor's signal handling and descriptors undone,
        and death with the supervisor."""
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        self._wake_r.close()
        self._wake_w.close()
        for other in self.children:
            if other.ready_fd >= 0:
                os.close(other.ready_fd)
                other.ready_fd = -1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # it died before prctl took effect
            os._exit(1)

    def _cleanup(self) -> None:
        for sock in self.sockets.values():
            sock.close()
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self.lock_fd >= 0:
            os.close(self.lock_fd)
            self.lock_fd = -1


def _remove_stale_folders(parent: str) -> None:
    """The channels' folders of supervisors that died without cleaning up (kill -9)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        if not name.startswith(CHANNELS_PREFIX):
            continue
        pid = name[len(CHANNELS_PREFIX) :].partition("-")[0]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # its supervisor still runs
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # another user's
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def _bind(address: str, port: int, what: str = "(memcache)") -> socket.socket:
    """A listening socket the workers accept on (raises StartupError naming ``what``)."""
    try:
        family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.create_server((address, port), family=family, backlog=4096)
    except OSError as e:
        raise StartupError(f"cannot listen on {address}:{port} {what}: {e.strerror or e}") from None
    sock.setblocking(False)
    return sock


def run_worker(
    config: ServerConfig, config_path: str | None, overrides: dict[str, Any], role: Any
) -> int:
    """Run worker ``role`` until it is stopped; the exit code of its process."""
    from kestreld.server import serve

    return serve(config, config_path, overrides, role)


def run_supervisor(config: ServerConfig, config_path: str | None, overrides: dict[str, Any]) -> int:
    """Run the box: the supervisor and its ``config.workers`` workers."""
    return Supervisor(config, config_path, overrides).run()
