"""One blocking client, one request at a time: server CPU per request at one connection.

    python -m kestreld.bench.pingpong [--config 'busy_poll_us = 30'] [--darner PATH]
                                      [--ops set,get,rget] [--seconds 3] [--rounds 2]

The tightest client there is: ``sendall`` a request, ``recv`` to the end of its reply, send
the next (no event loop, no other connection), so the server sees the shortest gap between
a reply and the next request.  The load generator of ``kestreld bench`` serves its
connections from an epoll loop and sends later; the two bracket what a one-connection
client does (BENCHMARKS.md, the thirteenth round).  ``get`` and ``rget`` (``get
q/close/open``) read a queue prefilled with enough items.  Server CPU is the process's user
+ system time over the round (/proc), so the client's own cost is not in it.  kestreld and
Darner (``--darner`` or ``DARNER_BIN``) alternate, each on a fresh folder.
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from kestreld.bench.servers import darner_path
from kestreld.testing.process import KestreldProcess

SIZE = 1024
PREFILL_BATCH = 100


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _connect(port: int) -> socket.socket:
    deadline = time.monotonic() + 20
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
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


def measure(port: int, pid: int, op: str, seconds: float) -> tuple[int, float]:
    """Run ``op`` for ``seconds``: (requests, server CPU µs per request)."""
    data = b"x" * SIZE
    set_request = b"set q 0 0 %d\r\n%s\r\n" % (SIZE, data)
    sock = _connect(port)
    try:
        if op in ("get", "rget"):  # prefill more than a round can read
            batch = set_request * PREFILL_BATCH
            for _ in range(int(seconds * 60_000 / PREFILL_BATCH)):
                _exchange(sock, batch, b"STORED\r\n" * PREFILL_BATCH)
        request, end = {
            "set": (set_request, b"STORED\r\n"),
            "get": (b"get q\r\n", b"END\r\n"),
            "rget": (b"get q/close/open\r\n", b"END\r\n"),
        }[op]
        for _ in range(1000):  # warm up
            _exchange(sock, request, end)
        started_cpu, started, n = _cpu_seconds(pid), time.monotonic(), 0
        while time.monotonic() - started < seconds:
            for _ in range(500):
                reply = _exchange(sock, request, end)
            if op != "set" and not reply.startswith(b"VALUE"):
                raise RuntimeError(f"{op}: the prefilled queue ran dry")
            n += 500
        return n, (_cpu_seconds(pid) - started_cpu) / n * 1e6
    finally:
        sock.close()


def run_kestreld(config: str, op: str, seconds: float) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as d:
        proc = KestreldProcess(Path(d) / "queues", config + "\n")
        proc.start()
        try:
            return measure(proc.port, proc.proc.pid, op, seconds)
        finally:
            proc.stop()


def run_darner(binary: str, op: str, seconds: float) -> tuple[int, float]:
    with tempfile.TemporaryDirectory() as d:
        port = _free_port()
        proc = subprocess.Popen(
            [binary, "-p", str(port), "-d", d],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            return measure(port, proc.pid, op, seconds)
        finally:
            proc.terminate()
            proc.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="", help="kestreld config text (TOML)")
    parser.add_argument("--darner", default=None, help="Darner binary (or DARNER_BIN)")
    parser.add_argument("--ops", default="set,get,rget")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    darner = darner_path(args.darner)
    for r in range(args.rounds):
        for op in args.ops.split(","):
            n, cost = run_kestreld(args.config, op, args.seconds)
            print(
                f"round {r + 1} {op:4} kestreld {cost:6.2f} µs/request ({n / args.seconds:,.0f}/s)"
            )
            if darner:
                n, cost = run_darner(darner, op, args.seconds)
                print(
                    f"round {r + 1} {op:4} Darner   {cost:6.2f} µs/request ({n / args.seconds:,.0f}/s)"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
