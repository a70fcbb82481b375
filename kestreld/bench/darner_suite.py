"""Darner's benchmark suite, run by ``kestreld bench darner-suite``: its ``flood.sh``,
``packing.sh``, ``mem_rss.sh`` and ``fairness.sh``, sizes times ``scale``, with :func:`db`
doing what its ``db`` client does."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from kestreld.bench import load as bench_load
from kestreld.bench.load import Role
from kestreld.bench.report import Table
from kestreld.bench.servers import KestreldServer, PeerServer, rss
from kestreld.testing.process import Conn

QUEUE = "db_bench"
MiB = 1024 * 1024


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
    """Darner's ``db -s sets -g gets -i size -c conns -b bad``: requests per second, counted
    as ``db`` counts them (from the start, connecting included), the connections spread over
    ``procs`` processes.  Raises when a reply failed (hang-ups aside)."""
    role = Role("db", "db", conns, sets, size=size, queue=QUEUE, gets=gets, hangup=bad)
    started = time.perf_counter()
    result = bench_load.run([role], port, seconds=600, procs=procs).roles["db"]
    elapsed = time.perf_counter() - started
    if result.errors and not bad:
        raise RuntimeError(f"db: {result.errors} requests failed: {result.error_samples}")
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
    #: kestreld's longest event-loop hold meanwhile (``loop_hold_max_us``), ms; None: not known
    fairness_hold_ms: float | None = None
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
    flood = mp.get_context("fork").Process(target=_flood_large, args=(port,), daemon=True)
    flood.start()
    time.sleep(0.5)
    f.fairness = db(port, sizes.n(100_000), 0, procs=1)
    f.fairness_hold_ms = _loop_hold_ms(port)
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


def _flood_large(port: int) -> None:
    """fairness.sh's background job: sets of 8 MiB items on one connection, until killed."""
    request = b"set %s 0 0 %d\r\n%s\r\n" % (QUEUE.encode(), 8 * MiB, b"x" * (8 * MiB))
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
        conn = Conn(sock)
        while True:
            conn.send(request)
            conn.line()


def _loop_hold_ms(port: int) -> float | None:
    """The server's longest event-loop hold of the last minute (kestreld's ``stats``), ms;
    None for a server without it (Darner)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        held = Conn(sock).stats().get("loop_hold_max_us")
    return int(held) / 1000 if held is not None else None


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
            "fairness: the server's longest event-loop hold meanwhile (`loop_hold_max_us`)",
            lambda f: f"{f.fairness_hold_ms:.1f} ms" if f.fairness_hold_ms is not None else "-",
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
