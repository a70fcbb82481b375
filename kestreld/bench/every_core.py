"""``kestreld bench workers``: one server on every core, against one worker and against
as many independent instances.

In one run, for ``set`` and ``get`` on many queues: ``workers = 1``, ``workers = N`` (one
port: a connection lands on whichever worker accepts it, and a request for a queue another
worker owns crosses to it), and N instances (N ports: the client sends each queue to the
instance it hashes to, as a client list splits queues over servers, so nothing crosses).
Each row: throughput, server CPU per operation (the supervisor's and every worker's), and
the share of the requests that crossed (the box's ``stats``).  Then the price of one
crossing: one client's round trip and the server's CPU per request, for a queue the
landing worker owns and for one it does not.
"""

from __future__ import annotations

import dataclasses
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kestreld.bench.report import Table
from kestreld.bench.servers import KestreldServer, cpu_seconds, tree_cpu_seconds
from kestreld.bench.workloads import Row, Spec, measure
from kestreld.testing.process import Conn
from kestreld.workers.ownership import owner_of

#: The workloads measured: set (put-many) and get (get-drain).
WORKLOADS = ("put-many", "get-drain")


@dataclass(slots=True)
class BoxSizes:
    """What every row runs: ``workers`` (N), connections, queues, item size and bounds."""

    workers: int = 2
    connections: int = 100
    queues: int = 100
    size: int = 1024
    depth: int = 1
    # The items bound outlasts the time bound: a connection that ran out of its share (its
    # queue's items) early would leave the rest of the run to the slower, crossing ones.
    items: int = 300_000
    seconds: float = 3.0
    procs: int = 2


def setups(workers: int) -> list[tuple[str, dict[str, int]]]:
    """(name, Spec fields) of the three servers compared."""
    return [
        ("workers = 1", {}),
        (f"workers = {workers}", {"workers": workers}),
        (f"{workers} instances", {"instances": workers}),
    ]


def run_box(
    sizes: BoxSizes,
    *,
    repeat: int = 1,
    workdir: str | None = None,
    server_cpus: frozenset[int] | None = None,
    client_cpus: frozenset[int] | None = None,
    log: Callable[[str], None] = print,
) -> list[tuple[str, Row]]:
    """Every workload on every setup, ``repeat`` times (the setups' order reversed every
    other round, so that each sees the machine's load alike): (setup, row) per run."""
    runs: list[tuple[str, Row]] = []
    base = Spec(
        "put-many",
        size=sizes.size,
        connections=sizes.connections,
        depth=sizes.depth,
        items=sizes.items,
        seconds=sizes.seconds,
        procs=sizes.procs,
        queues=sizes.queues,
    )
    for round_ in range(repeat):
        for workload in WORKLOADS:
            order = setups(sizes.workers)
            for name, fields in order[::-1] if round_ % 2 else order:
                spec = dataclasses.replace(base, workload=workload, **fields)
                log(f"[{round_ + 1}/{repeat}] {name}: {spec.describe()}")
                row = measure(
                    spec,
                    "kestreld",
                    workdir=workdir,
                    server_cpus=server_cpus,
                    client_cpus=client_cpus,
                )
                assert row is not None
                log(
                    f"    {row.rate:,.0f} {row.unit}s/s  server {row.server_us:.1f} us/"
                    f"{row.unit} ({row.server_cores:.2f} cores)  crossed {row.crossed:.0%}  "
                    f"others {row.others_cores:.2f} cores  {row.check}"
                    + (f"  ERRORS {row.errors}: {row.error_samples}" if row.errors else "")
                )
                runs.append((name, row))
    return runs


def _spread(values: list[float], fmt: Callable[[float], str]) -> str:
    """The median, and the range in brackets over several runs."""
    text = fmt(statistics.median(values))
    return text + (f" ({fmt(min(values))}–{fmt(max(values))})" if len(values) > 1 else "")


def _verdict(checks: list[str]) -> str:
    """The runs' exactly-once checks in a word, or each one that is not "exactly once"."""
    if all(c.startswith("exactly once") for c in checks):
        return "exactly once"
    return "; ".join(sorted(set(checks)))


BOX_COLUMNS = ("workload", "server", "ops/s", "vs workers = 1", "server µs/op", "server cores",
               "supervisor cores", "crossed", "p50 / p99 ms", "others' cores",
               "check")  # fmt: skip


def box_table(runs: list[tuple[str, Row]]) -> Table:
    """One line per (workload, setup): medians with their range over the runs."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for name, row in runs:
        groups.setdefault((row.unit, name), []).append(row)
    one = {unit: statistics.median(r.rate for r in rows)
           for (unit, name), rows in groups.items() if name == "workers = 1"}  # fmt: skip
    lines = []
    for (unit, name), rows in groups.items():
        rate = statistics.median(r.rate for r in rows)
        lines.append(
            [
                unit,
                name,
                _spread([r.rate for r in rows], lambda x: f"{x:,.0f}"),
                f"{rate / one[unit]:.2f}×" if one.get(unit) else "-",
                _spread([r.server_us for r in rows], lambda x: f"{x:.1f}"),
                f"{statistics.median(r.server_cores for r in rows):.2f}",
                f"{statistics.median(r.supervisor_cpu / r.seconds for r in rows):.3f}"
                if rows[0].workers > 1
                else "-",
                _spread([100 * r.crossed for r in rows], lambda x: f"{x:.0f} %"),
                f"{statistics.median(r.p50_ms for r in rows):.2f} / "
                f"{statistics.median(r.p99_ms for r in rows):.2f}",
                f"{statistics.median(r.others_cores for r in rows):.2f}",
                _verdict([r.check for r in rows]),
            ]
        )
    return Table(BOX_COLUMNS, lines)


# --- the price of a crossing ----------------------------------------------------------------------


def queue_owned(landed: int, workers: int, *, by_it: bool) -> str:
    """A queue name the worker ``landed`` owns (``by_it``), or one another worker owns."""
    for i in range(10_000):
        name = f"hop{i}"
        if (owner_of(name, workers) == landed) == by_it:
            return name
    raise RuntimeError("no queue name found")  # crc32 over 10,000 names: never


def hop_costs(
    workers: int, rounds: int, *, size: int = 1024, workdir: str | None = None
) -> dict[str, Any]:
    """One blocking client of a box of ``workers``: ``rounds`` set + get round trips on a
    queue its worker owns ("local") and on one another owns ("crossed"), in two
    alternating sittings each.  Per side: the median round trip (µs), the server's CPU per
    request (µs, the supervisor's and every worker's), the landing worker's part of it, and
    the requests made; and where 20 connections opened together landed ("landed":
    connections per worker), as a client's pool (or the load generator) opens them."""
    server = KestreldServer(workdir=workdir, workers=workers).start()
    latencies: dict[str, list[float]] = {"local": [], "crossed": []}
    cpu = {"local": 0.0, "crossed": 0.0}
    landing_cpu = {"local": 0.0, "crossed": 0.0}
    landed_on = [0] * workers
    try:
        pool = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(20)]
        for sock in pool:
            with sock:
                landed_on[int(Conn(sock).stats()["worker"])] += 1
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = Conn(sock)
            landed = int(conn.stats()["worker"])
            landing = server.process.worker_pids()[landed]
            queues = {
                "local": queue_owned(landed, workers, by_it=True),
                "crossed": queue_owned(landed, workers, by_it=False),
            }
            item = b"x" * size
            for sitting in range(4):
                side = ("local", "crossed")[sitting % 2]
                queue = queues[side]
                for _ in range(min(200, rounds)):  # the crossing's channel opens, caches warm
                    conn.set(queue, item)
                    conn.get(queue)
                before, landing_before = tree_cpu_seconds(server.pid), cpu_seconds(landing)
                times = latencies[side]
                for _ in range(rounds // 2):
                    t0 = time.perf_counter()
                    if conn.set(queue, item) != b"STORED":
                        raise RuntimeError(f"hop: a set to {queue} was not stored")
                    t1 = time.perf_counter()
                    if conn.get(queue) != item:
                        raise RuntimeError(f"hop: a get of {queue} did not return the item")
                    times += [t1 - t0, time.perf_counter() - t1]
                cpu[side] += tree_cpu_seconds(server.pid) - before
                landing_cpu[side] += cpu_seconds(landing) - landing_before
    finally:
        server.stop()
    return {"landed": landed_on} | {
        side: {
            "round_trip_us": 1e6 * statistics.median(latencies[side]),
            "server_us": 1e6 * cpu[side] / len(latencies[side]),
            "landing_us": 1e6 * landing_cpu[side] / len(latencies[side]),
            "requests": len(latencies[side]),
        }
        for side in latencies
    }


def hop_table(hops: dict[str, Any], workers: int) -> Table:
    local, crossed = hops["local"], hops["crossed"]
    landed = " / ".join(map(str, hops["landed"]))
    return Table(
        (
            f"one client, workers = {workers}",
            "served where it lands",
            "crosses to its owner",
            "the hop",
        ),  # fmt: skip
        [
            [
                "round trip, median µs (set, get)",
                f"{local['round_trip_us']:.0f}",
                f"{crossed['round_trip_us']:.0f}",
                f"{crossed['round_trip_us'] - local['round_trip_us']:+.0f}",
            ],
            [
                "server CPU µs per request",
                f"{local['server_us']:.1f}",
                f"{crossed['server_us']:.1f}",
                f"{crossed['server_us'] - local['server_us']:+.1f}",
            ],
            [
                "of which the worker it landed on",
                f"{local['landing_us']:.1f}",
                f"{crossed['landing_us']:.1f}",
                f"{crossed['landing_us'] - local['landing_us']:+.1f}",
            ],
            ["20 connections opened together, per worker", landed, "", ""],
        ],
    )


def figures(runs: list[tuple[str, Row]], hops: dict[str, Any]) -> dict[str, Any]:
    return {
        "runs": [{"setup": name} | dataclasses.asdict(row) for name, row in runs],
        "hop": hops,
    }
