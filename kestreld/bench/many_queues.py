"""``kestreld bench queues N``: what N queues cost once they sit idle (issue 55's second table).

N queues get 10 items of 100 B each; then, the server idle: its RSS, its open descriptors,
its CPU while idle, the time and size of a ``stats``, a graceful stop, and a restart on the
same folder until the first item is served.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable

from kestreld.bench.servers import KestreldServer, cpu_seconds, rss

MiB = 1024 * 1024


def _exchange(sock: socket.socket, request: bytes, end: bytes, replies: int = 1) -> bytes:
    sock.sendall(request)
    chunks: list[bytes] = []
    seen, tail = 0, b""  # counted per chunk: a 6 MB stats reply is not rescanned per recv
    while seen < replies:
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise OSError("the server closed the connection")
        chunks.append(chunk)
        seen += (tail + chunk).count(end) - tail.count(end)
        tail = chunk[-len(end) :]
    return b"".join(chunks)


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
            for first in range(0, n, 100):  # 100 queues' sets a round trip
                queues = range(first, min(n, first + 100))
                request = b"".join(set_one % q for q in queues for _ in range(items))
                replies = _exchange(sock, request, b"\r\n", len(queues) * items)
                if replies.count(b"STORED\r\n") != len(queues) * items:
                    failed = next(r for r in replies.split(b"\r\n") if r != b"STORED")
                    raise RuntimeError(f"queues: a set failed at q{first}: {failed[:80]!r}")
            log(f"queues: {n:,} queues of {items} items")
            time.sleep(1)
            pid = server.pid
            before = cpu_seconds(pid)
            time.sleep(idle_seconds)
            out["idle_cpu_pct"] = 100 * (cpu_seconds(pid) - before) / idle_seconds
            out["rss"] = rss(pid)
            out["descriptors"] = len(os.listdir(f"/proc/{pid}/fd"))
            started = time.perf_counter()
            stats = _exchange(sock, b"stats\r\n", b"END\r\n")
            out["stats_seconds"] = time.perf_counter() - started
            out["stats_bytes"] = len(stats)
        started = time.perf_counter()
        server.process.stop(timeout=120)
        out["stop_seconds"] = time.perf_counter() - started
        started = time.perf_counter()
        server.start(timeout=120)
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            reply = _exchange(sock, b"get q0\r\n", b"END\r\n")
        out["restart_seconds"] = time.perf_counter() - started
        if not reply.startswith(b"VALUE"):
            raise RuntimeError(f"queues: no item after the restart: {reply[:60]!r}")
    finally:
        server.stop()
    return out


QUEUES_HEADER = (
    "queues",
    "RSS",
    "open descriptors",
    "CPU while idle",
    "`stats`",
    "graceful stop",
    "restart to first item",
)


def queues_row(f: dict[str, float]) -> list[str]:
    return [
        f"{f['queues']:,.0f}",
        f"{f['rss'] / MiB:.0f} MiB",
        f"{f['descriptors']:,.0f}",
        f"{f['idle_cpu_pct']:.1f} %",
        f"{f['stats_seconds'] * 1000:.0f} ms ({f['stats_bytes'] / 1e6:.1f} MB)",
        f"{f['stop_seconds']:.2f} s",
        f"{f['restart_seconds']:.2f} s",
    ]
