"""``kestreld bench queues N``: what N queues cost once they sit idle.

N queues get 10 items of 100 B each; then, the server idle: its RSS, its open descriptors,
its CPU while idle, a ``stats`` (its size, and its time and the server's CPU after every
queue changed, and the CPU while they sit idle), a graceful stop, and a restart on the same
folder until the first item is served.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from kestreld.bench.report import Table
from kestreld.bench.servers import KestreldServer, cpu_seconds, cpu_seconds_exact, rss
from kestreld.testing.process import Conn

MiB = 1024 * 1024

#: ``stats`` calls averaged, each after every queue changed (and as many while idle).
STATS_CALLS = 4


def run_queues(
    n: int,
    *,
    items: int = 10,
    size: int = 100,
    idle_seconds: float = 5.0,
    workdir: str | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, float]:
    """The figures of one run (seconds, bytes, percent of one core)."""
    server = KestreldServer(workdir=workdir).start()
    out: dict[str, float] = {"queues": n}
    try:
        set_one = b"set q%%d 0 0 %d\r\n%s\r\n" % (size, b"x" * size)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            conn = Conn(sock)
            _set_every_queue(conn, set_one, n, items)
            log(f"queues: {n:,} queues of {items} items")
            time.sleep(1)
            before = cpu_seconds(server.pid)
            time.sleep(idle_seconds)
            out["idle_cpu_pct"] = 100 * (cpu_seconds(server.pid) - before) / idle_seconds
            out["rss"] = rss(server.pid)
            out["descriptors"] = len(os.listdir(f"/proc/{server.pid}/fd"))
            out["stats_bytes"], _, _ = _stats(conn, server.pid)
            changed = []
            for _ in range(STATS_CALLS):
                _set_every_queue(conn, set_one, n, 1)
                time.sleep(1.5)  # the checkpoint round that follows the sets is over
                changed.append(_stats(conn, server.pid))
            idle = [_stats(conn, server.pid) for _ in range(STATS_CALLS)]
            out["stats_seconds"] = sum(seconds for _, seconds, _ in changed) / STATS_CALLS
            out["stats_cpu"] = sum(cpu for _, _, cpu in changed) / STATS_CALLS
            out["stats_cpu_idle"] = sum(cpu for _, _, cpu in idle) / STATS_CALLS
        started = time.perf_counter()
        server.process.stop(timeout=120)
        out["stop_seconds"] = time.perf_counter() - started
        out["restart_seconds"], _, _ = server.restart("q0")
    finally:
        server.stop()
    return out


def _set_every_queue(conn: Conn, set_one: bytes, n: int, items: int) -> None:
    """``items`` sets to each of the queues q0 ... q<n-1>, 100 queues' sets a round trip."""
    for first in range(0, n, 100):
        queues = range(first, min(n, first + 100))
        conn.send(b"".join(set_one % q for q in queues for _ in range(items)))
        for q in queues:
            for _ in range(items):
                if (reply := conn.line()) != b"STORED":
                    raise RuntimeError(f"queues: a set to q{q} failed: {reply[:80]!r}")


def _stats(conn: Conn, pid: int) -> tuple[int, float, float]:
    """One ``stats``: its size (bytes), its time until the last byte arrived (seconds), and
    the server's CPU over that time (seconds, to the nanosecond: /proc/PID/task/*/schedstat;
    utime + stime, in 10 ms ticks, would round a 30 ms call by a third).  The reply
    is read as bytes, not split into lines: the time is the server's and the transfer's."""
    assert not conn.buf, "a reply before the stats is still unread"
    cpu = cpu_seconds_exact(pid)
    started = time.perf_counter()
    conn.sock.sendall(b"stats\r\n")
    size, tail = 0, b""
    while not tail.endswith(b"\r\nEND\r\n"):  # no stat line is "END": the reply's end
        chunk = conn.sock.recv(1 << 20)
        if not chunk:
            raise RuntimeError("queues: the server closed the connection during a stats")
        size += len(chunk)
        tail = (tail + chunk[-7:])[-7:]
    return size, time.perf_counter() - started, cpu_seconds_exact(pid) - cpu


def queues_table(runs: list[dict[str, float]]) -> Table:
    header = ("queues", "RSS", "open descriptors", "CPU while idle", "`stats`",
              "`stats` server CPU", "graceful stop", "restart to first item")  # fmt: skip
    rows = [
        [
            f"{f['queues']:,.0f}",
            f"{f['rss'] / MiB:.0f} MiB",
            f"{f['descriptors']:,.0f}",
            f"{f['idle_cpu_pct']:.1f} %",
            f"{f['stats_seconds'] * 1000:.0f} ms ({f['stats_bytes'] / 1e6:.1f} MB)",
            f"{f['stats_cpu'] * 1000:.0f} ms (idle {f['stats_cpu_idle'] * 1000:.0f})",
            f"{f['stop_seconds']:.2f} s",
            f"{f['restart_seconds']:.2f} s",
        ]
        for f in runs
    ]
    return Table(header, rows)
