"""One blocking client, one request at a time: server CPU per request at one connection.

    python scripts/lab/pingpong.py [--config 'busy_poll_us = 0'] [--darner PATH]
                                      [--ops set,get,rget] [--seconds 3] [--rounds 2]
                                      [--client python|c]

The tightest client in Python: ``sendall`` a request, ``recv`` to the end of its reply, send
the next (no event loop, no other connection), so the server sees as short a gap between
a reply and the next request as Python allows.  The load generator of ``kestreld bench`` serves its
connections from an epoll loop and sends later; the two bracket what a one-connection
client does (the thirteenth round of the performance notes, ``git show 67f5cad:BENCHMARKS.md``).  ``get`` and ``rget`` (``get
q/close/open``) read a queue prefilled with enough items.  Server CPU is the process's user
+ system time over the round (/proc), so the client's own cost is not in it.  kestreld and
Darner (``--darner`` or ``DARNER_BIN``) alternate, each on a fresh folder, the one that
goes first changing from round to round; the last lines give each server's median and,
with Darner, kestreld / Darner round by round (median, mean, rounds at or under 1×).
``--client c`` runs the same loop from a small C program
(scripts/lab/tight_client.py, compiled with the machine's ``cc`` for the run): no
interpreter between a reply and the next request.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tight_client import TightClient, build

from kestreld.bench.servers import (
    KestreldServer,
    PeerServer,
    cpu_seconds,
    darner_path,
    start_server,
)

SIZE = 1024
PREFILL_BATCH = 100


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)  # started: listening
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _exchange(sock: socket.socket, request: bytes, end: bytes) -> bytes:
    sock.sendall(request)
    reply = b""
    while not reply.endswith(end):
        part = sock.recv(65536)
        if not part:
            raise ConnectionError("the server closed the connection")
        reply += part
    return reply


def _prefill(seconds: float) -> int:
    """Items stored before a get or rget round: more than a round can read (at 60,000 a
    second, the C client's 0.3 s round of the tests ran dry now and then)."""
    return int(seconds * 120_000 / PREFILL_BATCH) * PREFILL_BATCH


def measure(port: int, pid: int, op: str, seconds: float) -> tuple[int, float]:
    """Run ``op`` for ``seconds``: (requests, server CPU µs per request)."""
    data = b"x" * SIZE
    set_request = b"set q 0 0 %d\r\n%s\r\n" % (SIZE, data)
    sock = _connect(port)
    try:
        if op in ("get", "rget"):
            batch = set_request * PREFILL_BATCH
            for _ in range(_prefill(seconds) // PREFILL_BATCH):
                _exchange(sock, batch, b"STORED\r\n" * PREFILL_BATCH)
        request, end = {
            "set": (set_request, b"STORED\r\n"),
            "get": (b"get q\r\n", b"END\r\n"),
            "rget": (b"get q/close/open\r\n", b"END\r\n"),
        }[op]
        for _ in range(1000):  # warm up
            _exchange(sock, request, end)
        started_cpu, started, n = cpu_seconds(pid), time.monotonic(), 0
        while time.monotonic() - started < seconds:
            for _ in range(500):
                reply = _exchange(sock, request, end)
            if op != "set" and not reply.startswith(b"VALUE"):
                raise RuntimeError(f"{op}: the prefilled queue ran dry")
            n += 500
        return n, (cpu_seconds(pid) - started_cpu) / n * 1e6
    finally:
        sock.close()


def measure_compiled(
    program: Path, port: int, pid: int, op: str, seconds: float
) -> tuple[int, float]:
    """:func:`measure` with the C client ``program`` (scripts/lab/tight_client.py)."""
    client = TightClient(program, port, op, seconds, _prefill(seconds) if op != "set" else 0)
    try:
        client.start()  # connected, prefilled, warmed up
        started_cpu = cpu_seconds(pid)
        n = client.run()
        return n, (cpu_seconds(pid) - started_cpu) / n * 1e6
    finally:
        client.stop()


def run(
    server: KestreldServer | PeerServer, op: str, seconds: float, program: Path | None = None
) -> tuple[int, float]:
    """``op`` against a fresh, started ``server`` (with the C client ``program``, if given):
    (requests, server CPU µs per request); stops it."""
    try:
        if program is not None:
            return measure_compiled(program, server.port, server.pid, op, seconds)
        return measure(server.port, server.pid, op, seconds)
    finally:
        server.stop()


def summarize(costs: dict[tuple[str, str], list[float]], names: list[str]) -> list[str]:
    """One line per op: each server's median µs per request over the rounds and, with a
    peer, kestreld / peer per round (median, mean, and the rounds at or under 1)."""
    lines = []
    ops = list(dict.fromkeys(op for op, _ in costs))
    for op in ops:
        parts = [f"{name} {statistics.median(costs[op, name]):.2f}" for name in names]
        line = f"median {op:4} " + ", ".join(parts) + " µs/request"
        for peer in names[1:]:
            ratios = [k / p for k, p in zip(costs[op, names[0]], costs[op, peer], strict=True)]
            under = sum(r <= 1 for r in ratios)
            line += (
                f"; {names[0]} / {peer} per round: median {statistics.median(ratios):.3f}x,"
                f" mean {statistics.fmean(ratios):.3f}x, at or under 1x in {under} of {len(ratios)}"
            )
        lines.append(line)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="", help="kestreld config text (TOML)")
    parser.add_argument("--darner", default=None, help="Darner binary (or DARNER_BIN)")
    parser.add_argument("--ops", default="set,get,rget")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--client",
        choices=("python", "c"),
        default="python",
        help="the loop in Python (default) or in C, compiled with cc for the run",
    )
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="kestreld-pingpong-") as scratch:
        try:
            program = build(Path(scratch)) if args.client == "c" else None
        except RuntimeError as e:
            print(f"pingpong: {e}", file=sys.stderr)
            return 2
        return _rounds(args, program)


def _rounds(args: argparse.Namespace, program: Path | None) -> int:
    darner = darner_path(args.darner)
    servers = [("kestreld", lambda: start_server("kestreld", args.config + "\n"))]
    if darner:
        servers.append(("Darner", lambda: start_server("darner", darner=darner)))
    names = [name for name, _ in servers]
    costs: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for op in args.ops.split(","):
            # Who goes first alternates from round to round: neither server always runs
            # on the machine the other has just warmed (or left busy).
            for name, server in servers if r % 2 == 0 else servers[::-1]:
                n, cost = run(server(), op, args.seconds, program)
                costs.setdefault((op, name), []).append(cost)
                rate = n / args.seconds
                print(f"round {r + 1} {op:4} {name:8} {cost:6.2f} µs/request ({rate:,.0f}/s)")
    for line in summarize(costs, names):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
