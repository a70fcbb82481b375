"""Darner's fairness test: small sets per second while another client floods 8 MiB items.

    python scripts/lab/fairness.py [--seconds 5] [--large 8388608] [--small 64]
                                   [--queue db_bench] [--flood-queue db_bench]
                                   [--flood-gets] [--config 'sync_journal = 0'] [--rounds 1]
                                   [--db PATH/TO/darner/db] [--sets 30000]

As Darner's ``bench/fairness.sh``: one connection sets ``--large`` items in a loop (no gets:
the queue grows, past memory into the read-behind), while another sets ``--small`` items one
at a time and counts them.  Both use Darner's queue ``db_bench`` unless told otherwise
(``--flood-queue A --flood-gets``: the flood on a queue of its own, each large set followed
by a get of it).  Each client is a process of its own (no shared interpreter lock), with a
blocking socket: the small client is as quick as Python's ``sendall``/``recv`` allow, so the
server's pace shows.  A third process sends ``version`` every millisecond: no queue, no
journal, so its worst round trip is the longest the server's event loop was held (plus
this machine's scheduling).

``--db PATH``: Darner's own client instead, exactly as ``fairness.sh`` runs it: ``db -s N
-g 0 -i 8388608`` (10 connections) floods ``db_bench`` while ``db -s --sets -g 0`` (10
connections, 64 B) is timed; prints its requests per second and latency percentiles.

Prints small sets/s, large sets/s, the small client's latency percentiles, the probe's
worst round trip, and the server's own figure: ``loop_hold_max_us``, the longest its event
loop was held in the last minute, and the share of instants it was held over 1 ms
(kestreld/loop/hold.py).  ``--config 'max_memory_size = 1MB'`` with ``--flood-gets`` makes
each large item go through the read-behind (read back from its journal).
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kestreld.testing.process import KestreldProcess


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _expect_stored(sock: socket.socket) -> None:
    reply = sock.recv(64)
    while not reply.endswith(b"\r\n"):
        more = sock.recv(64)
        if not more:
            raise SystemExit("server closed the connection")
        reply += more
    if reply != b"STORED\r\n":
        raise SystemExit(f"unexpected reply {reply!r}")


def flood(port: int, queue: str, size: int, gets: bool, stop_at: float, counter) -> None:
    """Set ``size``-byte items until ``stop_at`` (monotonic); with ``gets``, get each back."""
    sock = _connect(port)
    request = b"set %s 0 0 %d\r\n" % (queue.encode(), size) + b"x" * size + b"\r\n"
    get = b"get %s\r\n" % queue.encode()
    reply = bytearray(size + 64)
    n = 0
    while time.monotonic() < stop_at:
        sock.sendall(request)
        _expect_stored(sock)
        if gets:
            sock.sendall(get)
            view = memoryview(reply)
            got = 0
            while got < 5 or bytes(reply[got - 5 : got]) != b"END\r\n":
                got += sock.recv_into(view[got:])
        n += 1
    counter.value = n
    sock.close()


def small(port: int, queue: str, size: int, start_at: float, stop_at: float, out) -> None:
    """Set ``size``-byte items one at a time from ``start_at`` to ``stop_at``; latencies out."""
    sock = _connect(port)
    request = b"set %s 0 0 %d\r\n" % (queue.encode(), size) + b"s" * size + b"\r\n"
    while time.monotonic() < start_at:
        sock.sendall(request)
        _expect_stored(sock)
    latencies = []
    clock = time.perf_counter
    now = clock()
    end = stop_at - time.monotonic() + now
    while now < end:
        sock.sendall(request)
        _expect_stored(sock)
        after = clock()
        latencies.append(after - now)
        now = after
    out.put(latencies)
    sock.close()


def probe(port: int, start_at: float, stop_at: float, out) -> None:
    """``version`` every millisecond from ``start_at`` to ``stop_at``: the worst round trip."""
    sock = _connect(port)
    worst = 0.0
    while time.monotonic() < start_at:
        time.sleep(0.01)
    clock = time.perf_counter
    while time.monotonic() < stop_at:
        began = clock()
        sock.sendall(b"version\r\n")
        reply = sock.recv(64)
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(64)
        worst = max(worst, clock() - began)
        time.sleep(0.001)
    out.put(worst)
    sock.close()


def db_round(args: argparse.Namespace) -> str:
    """fairness.sh with Darner's ``db``: the small client's summary lines."""
    with tempfile.TemporaryDirectory(prefix="kestreld-fairness-") as tmp:
        server = KestreldProcess(Path(tmp) / "queues", args.config or "")
        server.start()
        try:
            port = str(server.port)
            subprocess.run([args.db, "-p", port, "-s", "10000", "-g", "10000"], check=True,
                           stdout=subprocess.DEVNULL)  # fairness.sh's warm-up  # fmt: skip
            flood = subprocess.Popen(
                [args.db, "-p", port, "-s", "1000000", "-g", "0", "-i", str(args.large)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                time.sleep(0.5)
                out = subprocess.run(
                    [args.db, "-p", port, "-s", str(args.sets), "-g", "0", "-i", str(args.small)],
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout
            finally:
                flood.kill()
                flood.wait()
        finally:
            server.stop()
    keep = ("Requests per second", "50%", "99%", "100%")
    return "  ".join(
        " ".join(line.split()) for line in out.splitlines() if line.strip().startswith(keep)
    )


def one_round(args: argparse.Namespace) -> tuple[float, float, list[float], float]:
    with tempfile.TemporaryDirectory(prefix="kestreld-fairness-") as tmp:
        server = KestreldProcess(Path(tmp) / "queues", args.config or "")
        server.start()
        try:
            counter = multiprocessing.Value("q", 0)
            out: multiprocessing.Queue = multiprocessing.Queue()
            begin = time.monotonic()
            start_at = begin + 1.0  # the flood is under way before counting starts
            stop_at = start_at + args.seconds
            flooder = multiprocessing.Process(
                target=flood,
                args=(server.port, args.flood_queue, args.large, args.flood_gets, stop_at, counter),
            )
            probed: multiprocessing.Queue = multiprocessing.Queue()
            prober = multiprocessing.Process(
                target=probe, args=(server.port, start_at, stop_at, probed)
            )
            smaller = multiprocessing.Process(
                target=small, args=(server.port, args.queue, args.small, start_at, stop_at, out)
            )
            flooder.start()
            smaller.start()
            prober.start()
            latencies = out.get()
            worst = probed.get()
            smaller.join()
            flooder.join()
            prober.join()
            large_rate = counter.value / (stop_at - begin)
            held = _loop_holds(server.port)
        finally:
            server.stop()
    return len(latencies) / args.seconds, large_rate, latencies, worst, held


def _loop_holds(port: int) -> str:
    """The server's longest loop hold of the last minute, and its share of instants held
    over 1 ms."""
    sock = _connect(port)
    sock.sendall(b"stats\r\n")
    raw = b""
    while not raw.endswith(b"END\r\n"):
        raw += sock.recv(65536)
    sock.close()
    stats = dict(line.split(" ", 2)[1:] for line in raw.decode().split("\r\n")[:-2])
    probes = max(1, int(stats["loop_hold_probes"]))
    over = int(stats["loop_hold_over_1ms"]) / probes
    return f"loop held max {int(stats['loop_hold_max_us']) / 1000:.1f} ms, over 1 ms {over:.1%}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--large", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--small", type=int, default=64)
    parser.add_argument("--queue", default="db_bench")
    parser.add_argument("--flood-queue", default="db_bench")
    parser.add_argument("--flood-gets", action="store_true", help="get each large item back")
    parser.add_argument("--config", default="")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--db", help="Darner's client (bench/db.cpp), run as fairness.sh does")
    parser.add_argument("--sets", type=int, default=30000, help="with --db: small sets timed")
    args = parser.parse_args()
    if args.db:
        for i in range(args.rounds):
            print(f"round {i + 1}: db: {db_round(args)}", flush=True)
        sys.exit(0)
    for i in range(args.rounds):
        rate, large_rate, lat, worst, held = one_round(args)
        lat.sort()
        pct = [lat[int(len(lat) * q)] * 1e3 for q in (0.5, 0.99, 0.999)] if lat else [0, 0, 0]
        print(
            f"round {i + 1}: small {args.small} B sets/s {rate:,.0f}  "
            f"large {args.large} B sets/s {large_rate:,.1f}  "
            f"small latency ms p50 {pct[0]:.3f} p99 {pct[1]:.3f} p99.9 {pct[2]:.3f} "
            f"max {max(lat, default=0) * 1e3:.3f} mean {statistics.fmean(lat or [0]) * 1e3:.3f}  "
            f"version probe worst ms {worst * 1e3:.3f}  {held}",
            flush=True,
        )
    sys.exit(0)


if __name__ == "__main__":
    main()
