"""The servers under test (kestreld, memcached, Darner) and what /proc says about them.

Every server listens on a free loopback port, in a fresh state, and are
stopped by pid when the caller is done with them.  CPU figures come from
``/proc/<pid>/stat`` (utime + stime of the whole thread group), context switches
from each thread's ``/proc/<pid>/task/<tid>/status``, memory from ``/proc/<pid>/status``;
the machine's own load from ``/proc/stat`` and ``/proc/loadavg``.
"""

from __future__ import annotations

import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kestreld import __version__
from kestreld.compiled import implementation
from kestreld.testing.process import KestreldProcess

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1


# --- /proc --------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads included."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        stat = f.read()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def _threads(pid: int) -> list[int]:
    """The thread ids of process ``pid`` now."""
    return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, involuntary) context switches of a process, all its threads summed.

    A voluntary switch is the thread going to sleep (``epoll_wait`` with nothing to read, a
    lock); an involuntary one is the scheduler taking the CPU from a thread that could run
    (a woken client preempting it).  Per operation they tell how a server spends the time
    between requests: the fourteenth round of the performance notes
    (``git show 67f5cad:BENCHMARKS.md``).  Threads that ended are not
    counted (none of the three servers ends threads while it serves).
    """
    voluntary = involuntary = 0
    for tid in _threads(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"voluntary_ctxt_switches:"):
                        voluntary += int(line.split()[1])
                    elif line.startswith(b"nonvoluntary_ctxt_switches:"):
                        involuntary += int(line.split()[1])
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return voluntary, involuntary


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Run every thread of process ``pid`` on ``cpus`` only (threads it starts later inherit
    it from theirs): a benchmark's placement, not something a server does to itself."""
    for tid in _threads(pid):
        try:
            os.sched_setaffinity(tid, cpus)
        except ProcessLookupError:
            continue  # the thread ended meanwhile


def memory(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since start) in bytes."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0]) * 1024
    return out


def rss(pid: int) -> int:
    return memory(pid).get("VmRSS", 0)


class RssSampler(threading.Thread):
    """The peak VmRSS of process ``pid`` (0: none yet; it may change), every ``period`` s."""

    def __init__(self, pid: int = 0, period: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.pid, self.period, self.peak = pid, period, 0
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(self.period):
            try:
                self.peak = max(self.peak, rss(self.pid) if self.pid else 0)
            except OSError:
                pass

    def take(self) -> int:
        """The peak since the last take."""
        peak, self.peak = self.peak, 0
        return peak

    def stop(self) -> int:
        self.stopped.set()
        self.join(2)
        return self.peak


@dataclass(slots=True)
class MachineSample:
    """Whole-machine CPU counters, to tell how busy the other tenants were."""

    busy: int
    total: int
    loadavg: str

    @classmethod
    def now(cls) -> MachineSample:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        return cls(busy=sum(values) - idle, total=sum(values), loadavg=load)

    def busy_cores_since(self, before: MachineSample) -> float:
        """Average number of busy cores between two samples."""
        dt = self.total - before.total
        return (self.busy - before.busy) / dt * NCPU if dt > 0 else 0.0


def machine_description() -> dict[str, str]:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    return {
        "nproc": str(NCPU),
        "cpu": model,
        "memory": f"{mem_kib / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": load,
        "memcached": memcached_version(),
        # the servers started inherit the environment: KESTRELD_NO_EXTENSIONS=1 runs them in Python
        "kestreld": f"{__version__} ({implementation()})",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port}") from None
            time.sleep(0.01)


# --- memcached -------------------------------------------------------------------------------


def memcached_path() -> str | None:
    return shutil.which("memcached") or (
        "/usr/bin/memcached" if os.access("/usr/bin/memcached", os.X_OK) else None
    )


def memcached_version() -> str:
    path = memcached_path()
    if path is None:
        return "not installed"
    try:
        return subprocess.run(
            [path, "-V"], capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def ensure_memcached() -> str:
    """The memcached binary; installs Debian's package when missing and running as root."""
    path = memcached_path()
    if path:
        return path
    if os.geteuid() != 0:
        raise SystemExit(
            "memcached is not installed and this is not root: run `sudo apt-get install -y memcached`"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "--no-install-recommends", "memcached"]
    print("bench: installing memcached: " + " ".join(install), file=sys.stderr)
    if subprocess.run(install, env=env).returncode != 0:
        print("bench: apt-get update, then install again", file=sys.stderr)
        subprocess.run(["apt-get", "update"], env=env, check=True)
        subprocess.run(install, env=env, check=True)
    path = memcached_path()
    if path is None:
        raise SystemExit("memcached still not found after apt-get install")
    return path


# --- the servers ---------------------------------------------------------------------------


class _PeerProcess:
    """An external server process on a loopback port: started, its pid, stopped (SIGTERM)."""

    name = ""
    proc: subprocess.Popen | None = None
    port = 0

    def _spawn(self, cmd: list[str], **popen) -> None:
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, **popen
        )
        try:
            wait_for_port(self.port)
        except RuntimeError:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class MemcachedServer(_PeerProcess):
    """A private memcached on a loopback port (no UDP), the protocol's upper bound."""

    name = "memcached"

    def __init__(self, *, threads: int | None = None, memory_mib: int = 2048) -> None:
        self.threads = threads
        self.memory_mib = memory_mib
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> MemcachedServer:
        binary = ensure_memcached()
        self.port = free_port()
        cmd = [binary, "-l", "127.0.0.1", "-p", str(self.port), "-U", "0"]
        cmd += ["-m", str(self.memory_mib), "-c", "4096"]
        if self.threads:
            cmd += ["-t", str(self.threads)]
        if os.geteuid() == 0:
            cmd += ["-u", "nobody"]  # memcached refuses to run as root otherwise
        self._spawn(cmd)
        return self


# --- Darner ----------------------------------------------------------------------------------------


def darner_path(given: str | None = None) -> str | None:
    """The Darner binary named by ``given`` (or ``$DARNER_BIN``), when it is an executable file.

    Darner (C++, boost asio + leveldb) speaks Kestrel's memcache protocol; it is
    an optional peer, built from its public source by whoever runs the benchmark.
    """
    path = given if given is not None else os.environ.get("DARNER_BIN", "")
    if not path:
        return None
    found = shutil.which(path) if os.sep not in path else path
    return found if found and os.path.isfile(found) and os.access(found, os.X_OK) else None


class DarnerServer(_PeerProcess):
    """Darner on a fresh data folder (``darner -p PORT -d DATA_DIR``), removed on stop."""

    name = "darner"

    def __init__(self, binary: str, *, workdir: str | None = None) -> None:
        self.binary = binary
        self.folder = tempfile.mkdtemp(prefix="darner-bench-", dir=workdir)
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> DarnerServer:
        self.port = free_port()
        self._spawn(
            [self.binary, "-p", str(self.port), "-d", self.folder], stderr=subprocess.DEVNULL
        )
        return self

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)


class KestreldServer:
    """kestreld on a fresh queue folder (removed on stop unless ``keep``)."""

    name = "kestreld"

    def __init__(
        self, config: str = "", *, workdir: str | None = None, folder: str | None = None
    ) -> None:
        self.own_folder = folder is None
        self.folder = folder or tempfile.mkdtemp(prefix="kestreld-bench-", dir=workdir)
        self.config = config
        self.process = KestreldProcess(Path(self.folder) / "queues", self.config)
        self.port = 0

    def start(self, timeout: float = 60.0) -> KestreldServer:
        self.process.start(timeout=timeout)
        self.port = self.process.port
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, *, keep: bool = False) -> None:
        try:
            self.process.stop(timeout=120)
        finally:
            if self.own_folder and not keep:
                shutil.rmtree(self.folder, ignore_errors=True)

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.process.log_lines[-n:])
