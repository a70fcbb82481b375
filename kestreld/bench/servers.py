"""The servers under test (kestreld, memcached, Darner), each on a free loopback port and a
fresh folder, and what /proc says about them and the machine."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from kestreld import __version__
from kestreld.compiled import implementation
from kestreld.testing.process import Conn, KestreldProcess

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1
MiB = 1024 * 1024

# --- /proc ----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads included."""
    stat = Path(f"/proc/{pid}/stat").read_bytes()
    fields = stat[stat.rindex(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def process_tree(pid: int) -> list[int]:
    """``pid`` and every live descendant (a server's supervisor and its workers), read from
    each process's parent in /proc (not every kernel offers /proc/<pid>/task/*/children)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        parent = int(stat[stat.rindex(b")") + 2 :].split()[1])
        parents.setdefault(parent, []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += parents.get(p, [])
    return tree


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of ``pid`` and its live descendants, all their threads included."""
    total = 0.0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):  # one that just ended
            total += cpu_seconds(p)
    return total


def cpu_seconds_exact(pid: int) -> float:
    """The CPU seconds of a process's live threads to the nanosecond (their
    ``/proc/PID/task/TID/schedstat``), for calls too short for :func:`cpu_seconds`'s
    clock ticks (10 ms).  A thread that ended takes its time with it."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_bytes().split()[0])
    return total / 1e9


def pin(pid: int, cpus: frozenset[int] | None) -> None:
    """Every thread of ``pid`` (and those it starts later) on ``cpus`` only; None: anywhere.
    The one place a benchmark's placement is made, for servers and load generator alike."""
    for tid in os.listdir(f"/proc/{pid}/task") if cpus else ():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            os.sched_setaffinity(int(tid), cpus)


def memory(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since start) in bytes."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {
        key: int(value.split()[0]) * 1024
        for key, _, value in (line.partition(":") for line in lines)
        if key in ("VmRSS", "VmHWM")
    }


def rss(pid: int) -> int:
    return memory(pid).get("VmRSS", 0)


def tree_rss(pid: int) -> int:
    """VmRSS summed over ``pid`` and its descendants (pages a fork shares count in each)."""
    total = 0
    for p in process_tree(pid):
        with contextlib.suppress(OSError):
            total += rss(p)
    return total


@dataclass(slots=True)
class MachineSample:
    """Whole-machine CPU counters, to tell how busy the other tenants were."""

    busy: int
    total: int
    loadavg: str

    @classmethod
    def now(cls) -> MachineSample:
        values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return cls(busy=sum(values) - idle, total=sum(values), loadavg=loadavg())

    def busy_cores_since(self, before: MachineSample) -> float:
        """Average number of busy cores between two samples."""
        dt = self.total - before.total
        return (self.busy - before.busy) / dt * NCPU if dt > 0 else 0.0


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine_description() -> dict[str, str]:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    model = next((li.split(":", 1)[1].strip() for li in info if li.startswith("model name")), "")
    mem = next(li for li in Path("/proc/meminfo").read_text().splitlines() if "MemTotal" in li)
    return {
        "nproc": str(NCPU),
        "cpu": model or platform.processor() or "unknown",
        "memory": f"{int(mem.split()[1]) / 1024 / 1024:.1f} GiB",
        "kernel": platform.release(),
        "python": platform.python_version(),
        "loadavg": loadavg(),
        "memcached": memcached_version(),
        # the servers started inherit the environment: KESTRELD_NO_EXTENSIONS=1 runs them in Python
        "kestreld": f"{__version__} ({implementation()})",
    }


# --- the servers ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KestreldServer:
    """kestreld on a fresh queue folder, removed on stop."""

    name = "kestreld"

    def __init__(
        self, config: str = "", *, workdir: str | None = None, workers: int | None = None
    ) -> None:
        self.folder = tempfile.mkdtemp(prefix="kestreld-bench-", dir=workdir)
        self.process = KestreldProcess(Path(self.folder) / "queues", config, workers=workers)
        self.port = self.pid = 0

    def start(self, timeout: float = 60.0) -> KestreldServer:
        self.process.start(timeout=timeout)
        self.port, self.pid = self.process.port, self.process.pid
        return self

    def stop(self) -> None:
        try:
            self.process.stop(timeout=120)
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def restart(self, queue: str) -> tuple[float, float, bytes]:
        """A graceful stop, then a start on the same folder and port, timed from the spawn:
        (seconds to the first item of ``queue`` served, seconds to ``listening``, the item)."""
        self.process.stop(timeout=120)
        spawned = time.monotonic()
        self.start(timeout=120)
        listening = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=30) as sock:
            item = Conn(sock).get(queue)
        if item is None:
            raise RuntimeError(f"{queue} is empty after the restart: its items are gone")
        return time.monotonic() - spawned, listening - spawned, item


class PeerServer:
    """memcached or Darner: ``argv`` (``{port}`` filled in) on a free loopback port."""

    def __init__(self, name: str, argv: list[str], folder: str | None = None) -> None:
        self.name, self.argv, self.folder = name, argv, folder
        self.proc: subprocess.Popen | None = None
        self.port = self.pid = 0

    def start(self) -> PeerServer:
        self.port = free_port()
        argv = [a.format(port=self.port) for a in self.argv]
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.pid = self.proc.pid
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{self.name} did not listen: {' '.join(argv)}") from None
                time.sleep(0.01)

    def stop(self) -> None:
        try:
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        finally:
            if self.folder:
                shutil.rmtree(self.folder, ignore_errors=True)


def start_server(
    name: str,
    config: str = "",
    *,
    workdir: str | None = None,
    darner: str | None = None,
    workers: int | None = None,
) -> KestreldServer | PeerServer:
    """A fresh, started ``name``: "kestreld" (with ``config`` and ``workers``; None: as
    ``KESTRELD_TEST_WORKERS`` says, else 1), "memcached"
    (no UDP, its default threads: the protocol's upper bound) or "darner" (the binary
    ``darner``)."""
    if name == "kestreld":
        return KestreldServer(config, workdir=workdir, workers=workers).start()
    if name == "memcached":
        argv = [ensure_memcached(), "-l", "127.0.0.1", "-p", "{port}", "-U", "0"]
        argv += ["-m", "2048", "-c", "4096"]
        argv += ["-u", "nobody"] if os.geteuid() == 0 else []  # memcached refuses root otherwise
        return PeerServer("memcached", argv).start()
    if darner is None:
        raise ValueError("no Darner binary given")
    folder = tempfile.mkdtemp(prefix="darner-bench-", dir=workdir)
    return PeerServer("darner", [darner, "-p", "{port}", "-d", folder], folder).start()


def darner_path(given: str | None = None) -> str | None:
    """The Darner binary named by ``given`` (or ``$DARNER_BIN``), when it is an executable
    file.  Darner is an optional peer, built from its source by whoever runs the benchmark."""
    path = given if given is not None else os.environ.get("DARNER_BIN", "")
    if not path:
        return None
    found = shutil.which(path) if os.sep not in path else path
    return found if found and os.path.isfile(found) and os.access(found, os.X_OK) else None


def memcached_path() -> str | None:
    return shutil.which("memcached", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/bin"]))


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
    """The memcached binary, or an exit that says how to install it."""
    path = memcached_path()
    if path is None:
        raise SystemExit("memcached is not installed: `apt-get install memcached` (Debian)")
    return path
