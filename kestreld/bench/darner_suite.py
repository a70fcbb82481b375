"""Darner's benchmark suite (its ``bench/*.sh`` and ``db.cpp`` client), run by kestreld bench.

:func:`db` does what Darner's ``db`` does: ``C`` connections share ``S`` sets and ``G`` gets
of one queue (``db_bench``), one request in flight each, a get or a set chosen to keep the
ratio; with a bad-client rate ``B``, every ``B``-th request of a connection is cut in half
and the connection hung up (a new one takes its place).  The scenarios are Darner's
``flood.sh``, ``packing.sh``, ``mem_rss.sh`` and ``fairness.sh``, with sizes scaled by
``scale`` so that a smoke test runs in seconds.
"""

from __future__ import annotations

import multiprocessing as mp
import selectors
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kestreld.bench.report import Table
from kestreld.bench.servers import KestreldServer, PeerServer, rss
from kestreld.testing.process import Conn

QUEUE = b"db_bench"
MiB = 1024 * 1024


class _Session:
    """One connection of :func:`db`: a request, its reply, the next."""

    __slots__ = ("sock", "buf", "action", "port")

    def __init__(self, port: int, action: int = 0) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = b""
        self.action = action


def _db(port: int, sets: int, gets: int, size: int, conns: int, bad: int, out) -> None:
    set_request = b"set %s 0 0 %d\r\n%s\r\n" % (QUEUE, size, b"x" * size)
    get_request = b"get %s\r\n" % QUEUE
    left = {"sets": sets, "gets": gets}
    ratio = gets / sets if sets else 0.0
    sel = selectors.DefaultSelector()
    errors = 0

    def next_request(s: _Session) -> None:
        if left["gets"] and (not left["sets"] or left["gets"] / left["sets"] > ratio):
            kind, request = "gets", get_request
        elif left["sets"]:
            kind, request = "sets", set_request
        else:
            sel.unregister(s.sock)
            s.sock.close()
            return
        left[kind] -= 1
        s.action += 1
        if bad and s.action % bad == 1 % bad:  # hang up mid-request; a new client follows
            s.sock.sendall(request[: len(request) // 2])
            sel.unregister(s.sock)
            s.sock.close()
            start(_Session(s.port, s.action))
            return
        s.sock.sendall(request)

    def start(s: _Session) -> None:
        sel.register(s.sock, selectors.EVENT_READ, s)
        next_request(s)

    for _ in range(conns):
        start(_Session(port))
    while sel.get_map():
        for key, _ in sel.select(timeout=30):
            s: _Session = key.data
            chunk = s.sock.recv(1 << 20)
            if not chunk:
                errors += 1
                sel.unregister(s.sock)
                s.sock.close()
                continue
            s.buf += chunk
            if not _reply_complete(s.buf):
                continue
            if not s.buf.startswith((b"STORED", b"VALUE", b"END")):
                errors += 1
            s.buf = b""
            next_request(s)
    out.put(errors)


def _reply_complete(buf: bytes) -> bool:
    if buf.startswith(b"VALUE"):
        line = buf.find(b"\r\n")
        return (
            line >= 0 and len(buf) >= line + 2 + int(buf[buf.rfind(b" ", 0, line) + 1 : line]) + 7
        )
    return buf.endswith(b"\r\n")


def db(
    port: int,
    sets: int,
    gets: int,
    *,
    size: int = 64,
    conns: int = 10,
    bad: int = 0,
    procs: int = 2,
) -> float:
    """Darner's ``db -s sets -g gets -i size -c conns -b bad``: requests per second, with the
    connections (and the work) spread over ``procs`` processes.  Raises when a reply failed."""
    procs = max(1, min(procs, conns))
    ctx = mp.get_context("fork")
    out = ctx.Queue()

    def part(x: int, i: int) -> int:
        return x * (i + 1) // procs - x * i // procs

    args = [
        (port, part(sets, i), part(gets, i), size, part(conns, i), bad, out) for i in range(procs)
    ]
    workers = [ctx.Process(target=_db, args=a, daemon=True) for a in args]
    started = time.perf_counter()
    for w in workers:
        w.start()
    errors = sum(out.get(timeout=600) for _ in workers)
    elapsed = time.perf_counter() - started
    for w in workers:
        w.join()
    if errors and not bad:
        raise RuntimeError(f"db: {errors} requests failed")
    return (sets + gets) / elapsed


@dataclass(slots=True)
class SuiteFigures:
    """One server's figures in Darner's suite (requests/s, MiB)."""

    flood: dict[int, float] = field(default_factory=dict)  # connections -> req/s
    packing: dict[int, float] = field(default_factory=dict)  # items queued first -> req/s
    drained_rss: dict[int, float] = field(default_factory=dict)  # items grown and drained -> MiB
    idle_rss: float = 0.0
    backlog_rss: float = 0.0
    fairness: float = 0.0  # 64 B sets/s beside a flood of 8 MiB items
    hangups: float = 0.0
    alive: bool = False


@dataclass(slots=True)
class SuiteSizes:
    """Darner's sizes, times ``scale``."""

    scale: float = 1.0
    connections: tuple[int, ...] = (1, 10, 100, 1000, 4000)

    def n(self, x: int) -> int:
        return max(1, int(x * self.scale))

    @property
    def packing(self) -> tuple[int, ...]:
        return (0, self.n(65_536), self.n(1_048_576))

    @property
    def drained(self) -> tuple[int, ...]:
        return (self.n(131_072), self.n(524_048))


def _flood(port: int, pid: int, sizes: SuiteSizes, procs: int, f: SuiteFigures) -> None:
    """flood.sh: 64 B sets and gets at each number of connections."""
    db(port, sizes.n(100_000), sizes.n(100_000), procs=procs)  # the warm-up every script does
    db(port, 512, 0, conns=1)  # a few items, so that a get always finds one
    for c in sizes.connections:
        f.flood[c] = db(port, sizes.n(100_000), sizes.n(100_000), conns=c, procs=procs)


def _packing(port: int, pid: int, sizes: SuiteSizes, procs: int, f: SuiteFigures) -> None:
    """packing.sh: sets and gets of 1 KiB after growing the queue."""
    grown = 0
    for items in sizes.packing:
        db(port, items - grown, 0, size=1024, procs=procs)
        grown = items
        f.packing[items] = db(port, sizes.n(100_000), sizes.n(100_000), size=1024, procs=procs)


def _memory(port: int, pid: int, sizes: SuiteSizes, procs: int, f: SuiteFigures) -> None:
    """mem_rss.sh: VmRSS after growing the queue and draining it, one size after the other;
    then with a backlog."""
    time.sleep(1)
    f.idle_rss = rss(pid) / MiB
    for items in sizes.drained:
        db(port, items, 0, size=1024, procs=procs)
        db(port, 0, items, size=1024, procs=procs)
        f.drained_rss[items] = rss(pid) / MiB
    db(port, sizes.n(1_048_576), 0, size=1024, procs=procs)
    f.backlog_rss = rss(pid) / MiB


def _fairness(port: int, pid: int, sizes: SuiteSizes, procs: int, f: SuiteFigures) -> None:
    """fairness.sh: 64 B sets on 10 connections while one floods 8 MiB items; then Darner's
    bad clients (db -b 3): one request in three cut in half and its connection hung up."""
    flood = mp.get_context("fork").Process(
        target=_flood_large, args=(port, sizes.n(100_000)), daemon=True
    )
    flood.start()
    time.sleep(0.5)
    f.fairness = db(port, sizes.n(100_000), 0, procs=1)
    flood.terminate()
    flood.join()
    f.hangups = db(port, sizes.n(100_000), sizes.n(100_000), bad=3, procs=procs)
    f.alive = _alive(port)


SCENARIOS = {"flood": _flood, "packing": _packing, "memory": _memory, "fairness": _fairness}


def run_suite(
    start: Callable[[], KestreldServer | PeerServer],
    sizes: SuiteSizes,
    procs: int,
    log: Callable[[str], None],
    scenarios: Iterable[str] = SCENARIOS,
) -> SuiteFigures:
    """The scenarios, each against a fresh server from ``start()``, as Darner's scripts run
    them."""
    f = SuiteFigures()
    for name in scenarios:
        started = time.perf_counter()
        server = start()
        try:
            SCENARIOS[name](server.port, server.pid, sizes, procs, f)
        finally:
            server.stop()
        log(f"darner-suite: {name} took {time.perf_counter() - started:.0f} s")
    return f


def _flood_large(port: int, sets: int) -> None:
    """fairness.sh's background job: sets of 8 MiB items, one connection (until killed)."""
    try:
        _db(port, sets, 0, 8 * MiB, 1, 0, mp.get_context("fork").Queue())
    except OSError:
        pass


def _alive(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            conn = Conn(sock)
            conn.send(b"version\r\n")
            return conn.line().startswith(b"VERSION")
    except OSError:
        return False


def suite_table(figures: dict[str, SuiteFigures], sizes: SuiteSizes) -> Table:
    """Darner's table: a row per scenario, a column per server."""

    def row(label: str, cell: Callable[[SuiteFigures], str]) -> list[str]:
        return [label, *(cell(f) for f in figures.values())]

    def rates(values: Iterable[float]) -> str:
        return " / ".join(f"{v / 1000:.1f}k" for v in values if v) or "-"

    def mib(values: Iterable[float]) -> str:
        return " / ".join(f"{v:.0f}" for v in values)

    conns = " / ".join(f"{c:,}" for c in sizes.connections)
    packing = " / ".join(f"{i:,}" for i in sizes.packing)
    drained = " / ".join(f"{i:,}" for i in sizes.drained)
    rows = [
        row(f"flood, 64 B, {conns} connections (req/s)", lambda f: rates(f.flood.values())),
        row(
            f"packing: {sizes.n(100_000):,} sets + gets after growing the queue to {packing} "
            "items of 1 KiB (req/s)",
            lambda f: rates(f.packing.values()),
        ),
        row(
            "fairness: 64 B sets/s while one client floods 8 MiB items",
            lambda f: rates([f.fairness]),
        ),
        row(
            f"resident memory after growing to and draining {drained} items of 1 KiB (idle first)",
            lambda f: (
                f"{mib(f.drained_rss.values())} MiB (idle {f.idle_rss:.0f})"
                if f.drained_rss
                else "-"
            ),
        ),
        row(
            f"resident memory with {sizes.n(1_048_576):,} items queued",
            lambda f: f"{f.backlog_rss:.0f} MiB" if f.backlog_rss else "-",
        ),
        row(
            "1 in 3 clients hang up mid-request (req/s, server alive)",
            lambda f: (
                f"{rates([f.hangups])}, {'alive' if f.alive else 'DEAD'}" if f.hangups else "-"
            ),
        ),
    ]
    return Table(["Darner's suite", *figures], rows)
