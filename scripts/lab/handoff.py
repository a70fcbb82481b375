"""``workers = 2``: what a request costs served where it landed, forwarded, or after a hand-off.

    python scripts/lab/handoff.py [--seconds 3] [--connections 100] [--rounds 2]

Round trips: one blocking client, a 64-byte ``set`` then a ``get`` of it, on a connection
worker 0 accepted: to a queue of worker 0 (local), to a queue of worker 1 with
``worker_handoff = false`` (forwarded), and with ``worker_handoff = true`` (the first
request moves the connection to worker 1; the rest are local there).  Median µs per
request (set and get each counted).

First request: the median of a fresh connection's first request for worker 1's queue:
the hand-off itself, or the first forward (which opens the connection's channel).

Throughput: ``--connections`` connections, each with its own queue (so half the queues
are the other worker's), each sending a set, then a get, one request at a time, from one
client process (an epoll loop); requests per second and the box's CPU (supervisor and
workers, user + system, /proc) per request, hand-off off and on, alternating per round.
"""

from __future__ import annotations

import argparse
import selectors
import socket
import statistics
import tempfile
import time
from pathlib import Path

from kestreld.bench.servers import cpu_seconds
from kestreld.testing.process import KestreldProcess
from kestreld.workers.ownership import owner_of

SIZE = 64
DATA = b"x" * SIZE


def _owned_by(index: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if owner_of(f"{prefix}{i}", 2) == index)


def _exchange(sock: socket.socket, request: bytes, end: bytes) -> bytes:
    sock.sendall(request)
    reply = b""
    while not reply.endswith(end):
        part = sock.recv(65536)
        if not part:
            raise ConnectionError("the server closed the connection")
        reply += part
    return reply


def _worker_of(sock: socket.socket) -> int:
    reply = _exchange(sock, b"stats\r\n", b"END\r\n")
    for line in reply.split(b"\r\n"):
        if line.startswith(b"STAT worker "):
            return int(line.split()[2])
    raise RuntimeError("no worker line in stats")


def _on_worker(box: KestreldProcess, index: int) -> socket.socket:
    for _ in range(100):
        socks = [box.connect() for _ in range(8)]
        found = None
        for sock in socks:
            if found is None and _worker_of(sock) == index:
                found = sock
            else:
                sock.close()
        if found is not None:
            return found
    raise RuntimeError(f"no connection landed on worker {index}")


def _box(folder: Path, handoff: bool) -> KestreldProcess:
    config = f"worker_handoff = {'true' if handoff else 'false'}\n"
    return KestreldProcess(folder / "queues", config, args=["--workers", "2"]).start()


def round_trip(box: KestreldProcess, queue: str, seconds: float) -> float:
    """Median µs of a set or a get, one at a time, on a connection worker 0 accepted."""
    sock = _on_worker(box, 0)
    set_request = b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), SIZE, DATA)
    get_request = b"get %s\r\n" % queue.encode()
    samples: list[float] = []
    try:
        for _ in range(500):  # warm up (and the hand-off, when it happens)
            _exchange(sock, set_request, b"STORED\r\n")
            _exchange(sock, get_request, b"END\r\n")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for request, end in ((set_request, b"STORED\r\n"), (get_request, b"END\r\n")):
                started = time.perf_counter()
                _exchange(sock, request, end)
                samples.append(time.perf_counter() - started)
    finally:
        sock.close()
    return statistics.median(samples) * 1e6


def _counts(box: KestreldProcess) -> dict[str, int]:
    sock = box.connect()
    try:
        reply = _exchange(sock, b"stats\r\n", b"END\r\n")
    finally:
        sock.close()
    wanted = ("worker_requests_local", "worker_requests_crossed", "handoffs")
    counts = {}
    for line in reply.split(b"\r\n"):
        words = line.decode().split()
        if len(words) == 3 and words[1] in wanted:
            counts[words[1]] = int(words[2])
    return counts


def first_request(box: KestreldProcess, queue: str, count: int = 40) -> float:
    """Median µs of the first request for ``queue`` on a fresh connection worker 0
    accepted: the hand-off itself (or the first forward, its channel connection opened)."""
    samples = []
    request = b"get %s\r\n" % queue.encode()
    for _ in range(count):
        sock = _on_worker(box, 0)
        started = time.perf_counter()
        _exchange(sock, request, b"END\r\n")
        samples.append(time.perf_counter() - started)
        sock.close()
    return statistics.median(samples) * 1e6


def throughput(
    box: KestreldProcess, connections: int, seconds: float
) -> tuple[float, float, float]:
    """(requests a second, box CPU µs per request, the share of requests that crossed to
    another worker) at ``connections`` connections."""
    before = _counts(box)
    selector = selectors.DefaultSelector()
    socks = []
    for i in range(connections):
        sock = box.connect()
        sock.setblocking(False)
        name = b"load%d" % i
        state = {
            "requests": (
                b"set %s 0 0 %d\r\n%s\r\n" % (name, SIZE, DATA),
                b"get %s\r\n" % name,
            ),
            "ends": (b"STORED\r\n", b"END\r\n"),
            "turn": 0,
            "buf": b"",
        }
        socks.append(sock)
        selector.register(sock, selectors.EVENT_READ, state)
    pids = [box.pid, *box.worker_pids().values()]
    done = 0

    def send(sock: socket.socket, state: dict) -> None:
        sock.send(state["requests"][state["turn"]])

    for key in list(selector.get_map().values()):
        send(key.fileobj, key.data)  # type: ignore[arg-type]
    warm_until = time.monotonic() + 1.0
    started = cpu = 0.0
    measuring = False
    while True:
        now = time.monotonic()
        if not measuring and now >= warm_until:
            measuring, started, done = True, now, 0
            cpu = sum(cpu_seconds(pid) for pid in pids)
        if measuring and now - started >= seconds:
            break
        for key, _ in selector.select(1.0):
            sock, state = key.fileobj, key.data
            state["buf"] += sock.recv(65536)  # type: ignore[union-attr]
            end = state["ends"][state["turn"]]
            if state["buf"].endswith(end):
                state["buf"] = b""
                state["turn"] ^= 1
                done += 1
                send(sock, state)  # type: ignore[arg-type]
    elapsed = time.monotonic() - started
    used = sum(cpu_seconds(pid) for pid in pids) - cpu
    for sock in socks:
        sock.close()
    after = _counts(box)
    crossed = after["worker_requests_crossed"] - before["worker_requests_crossed"]
    local = after["worker_requests_local"] - before["worker_requests_local"]
    return done / elapsed, used / done * 1e6, crossed / max(1, crossed + local)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    here, there = _owned_by(0, "rt"), _owned_by(1, "rt")
    trips: dict[str, list[float]] = {"local": [], "forwarded": [], "handed": []}
    firsts: dict[str, list[float]] = {"forwarded": [], "handed": []}
    load: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
    for r in range(args.rounds):
        for handoff in (False, True) if r % 2 == 0 else (True, False):
            with tempfile.TemporaryDirectory() as folder:
                box = _box(Path(folder), handoff)
                try:
                    first = first_request(box, there)
                    firsts["handed" if handoff else "forwarded"].append(first)
                    if handoff:
                        trips["handed"].append(round_trip(box, there, args.seconds))
                    else:
                        trips["local"].append(round_trip(box, here, args.seconds))
                        trips["forwarded"].append(round_trip(box, there, args.seconds))
                    load[handoff].append(throughput(box, args.connections, args.seconds))
                finally:
                    box.stop()
            print(f"round {r + 1} handoff={handoff}: done", flush=True)
    for name, values in trips.items():
        print(f"round trip {name:9}: {statistics.median(values):6.1f} µs  {values}")
    for name, values in firsts.items():
        print(f"first request {name:9}: {statistics.median(values):6.1f} µs  {values}")
    for handoff, rows in load.items():
        rate = statistics.median(r for r, _, _ in rows)
        cost = statistics.median(c for _, c, _ in rows)
        crossed = statistics.median(x for _, _, x in rows)
        print(
            f"{args.connections} connections, handoff={'on ' if handoff else 'off'}: "
            f"{rate:8.0f} requests/s, {cost:5.1f} µs box CPU/request, "
            f"{crossed:.2f} crossed  {[tuple(round(v, 2) for v in row) for row in rows]}"
        )


if __name__ == "__main__":
    main()
