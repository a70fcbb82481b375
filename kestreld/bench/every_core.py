"""``kestreld bench workers``: one server on every core, against one worker and against
as many independent instances.

In one run, for ``set`` and ``get`` on many queues: ``workers = 1``, ``workers = N`` (one
port: a connection lands on whichever worker accepts it; one that names a queue another
worker owns, holding nothing, moves to it), the same without the hand-off (each such
request is forwarded to the owner), and N instances (N ports: the client sends each queue
to the instance it hashes to, as a client list splits queues over servers, so nothing
crosses).  Then ``set`` with each connection alternating over several queues, so that
some requests cross even with the hand-off.  Each row: throughput, server CPU per
operation (the supervisor's and every worker's), the share of the requests that crossed
and the connections moved (the box's ``stats``).  Then the price of each path: one
client's round trip and the server's CPU per request, served where it lands, forwarded,
and after a hand-off; and the one-off cost of the move, a fresh connection's first request.
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
    spread: int = 4  # the last workload: queues each connection alternates over


def setups(workers: int, *, instances: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """(name, Spec fields) of the servers compared (the instances only where a connection
    uses one queue: one that alternates over several would need a socket per instance)."""
    return [
        ("workers = 1", {}),
        (f"workers = {workers}", {"workers": workers}),
        (f"workers = {workers}, no hand-off", {"workers": workers, "handoff": False}),
        *([(f"{workers} instances", {"instances": workers})] if instances else []),
    ]


def workloads(sizes: BoxSizes) -> list[tuple[str, dict[str, Any]]]:
    """(workload, Spec fields) in the order run: set and get, a connection on one queue;
    set, a connection alternating over ``spread`` queues."""
    spread = [("put-many", {"spread": sizes.spread})] if sizes.spread > 1 else []
    return [(w, {}) for w in WORKLOADS] + spread


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
        for workload, shape in workloads(sizes):
            order = setups(sizes.workers, instances=not shape)
            for name, fields in order[::-1] if round_ % 2 else order:
                spec = dataclasses.replace(base, workload=workload, **shape, **fields)
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
                    f"moved {row.handoffs}  others {row.others_cores:.2f} cores  {row.check}"
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
               "supervisor cores", "crossed", "moved", "p50 / p99 ms", "others' cores",
               "check")  # fmt: skip


def workload_name(row: Row) -> str:
    """The table's name for a row's workload: "set", "get", or "set, 4 queues a conn"."""
    return row.unit + (f", {row.spread} queues a conn" if row.spread > 1 else "")


def box_table(runs: list[tuple[str, Row]]) -> Table:
    """One line per (workload, setup): medians with their range over the runs; *moved* is
    the connections handed to their queue's owner in a run."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for name, row in runs:
        groups.setdefault((workload_name(row), name), []).append(row)
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
                f"{statistics.median(r.handoffs for r in rows):.0f}"
                if rows[0].workers > 1
                else "-",
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


#: The probe's three paths of a request for a queue: the worker it landed on owns it, or
#: another does and the request is forwarded (``worker_handoff = false``), or another does
#: and the connection moved there with its first such request.
PATHS = ("local", "forwarded", "handed off")


def hop_costs(
    workers: int,
    rounds: int,
    *,
    size: int = 1024,
    firsts: int = 600,
    workdir: str | None = None,
) -> dict[str, Any]:
    """One blocking client of two boxes of ``workers``, one with ``worker_handoff = false``:
    ``rounds`` set + get round trips on each path of ``PATHS``, in two alternating sittings
    each.  Per path: the median round trip (µs), the server's CPU per request (µs, the
    supervisor's and every worker's), the landing worker's part of it, the requests made;
    and a fresh connection's first set (``firsts`` connections per path, each connected,
    asked ``stats`` for its worker, then timed on one ``set``): its median round trip and
    the server's CPU per connection.  And where 20 connections opened together landed
    ("landed": connections per worker), as a client's pool (or the load generator) opens
    them."""
    forwarding = KestreldServer("worker_handoff = false\n", workdir=workdir, workers=workers)
    moving = KestreldServer(workdir=workdir, workers=workers)
    box = {"local": forwarding, "forwarded": forwarding, "handed off": moving}
    latencies: dict[str, list[float]] = {path: [] for path in PATHS}
    cpu = dict.fromkeys(PATHS, 0.0)
    landing_cpu = dict.fromkeys(PATHS, 0.0)
    first_latencies: dict[str, list[float]] = {path: [] for path in PATHS}
    first_cpu = dict.fromkeys(PATHS, 0.0)
    landed_on = [0] * workers
    item = b"x" * size
    try:
        forwarding.start()
        moving.start()
        pool = [socket.create_connection(("127.0.0.1", moving.port), timeout=30) for _ in range(20)]
        for sock in pool:
            with sock:
                landed_on[int(Conn(sock).stats()["worker"])] += 1
        for sitting in range(2 * len(PATHS)):
            path = PATHS[sitting % len(PATHS)]
            server = box[path]
            with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                conn = Conn(sock)
                landed = int(conn.stats()["worker"])
                landing = server.process.worker_pids()[landed]
                queue = queue_owned(landed, workers, by_it=path == "local")
                # the forward's channel opens or the connection moves, caches warm
                for _ in range(min(200, rounds)):
                    conn.set(queue, item)
                    conn.get(queue)
                before, landing_before = tree_cpu_seconds(server.pid), cpu_seconds(landing)
                times = latencies[path]
                for _ in range(rounds // 2):
                    t0 = time.perf_counter()
                    if conn.set(queue, item) != b"STORED":
                        raise RuntimeError(f"hop: a set to {queue} was not stored")
                    t1 = time.perf_counter()
                    if conn.get(queue) != item:
                        raise RuntimeError(f"hop: a get of {queue} did not return the item")
                    times += [t1 - t0, time.perf_counter() - t1]
                cpu[path] += tree_cpu_seconds(server.pid) - before
                landing_cpu[path] += cpu_seconds(landing) - landing_before
        for sitting in range(2 * len(PATHS)):
            path = PATHS[sitting % len(PATHS)]
            server = box[path]
            before = tree_cpu_seconds(server.pid)
            for _ in range(firsts // 2):
                with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    conn = Conn(sock)
                    landed = int(conn.stats()["worker"])
                    queue = queue_owned(landed, workers, by_it=path == "local")
                    t0 = time.perf_counter()
                    if conn.set(queue, item) != b"STORED":
                        raise RuntimeError(f"hop: a first set to {queue} was not stored")
                    first_latencies[path].append(time.perf_counter() - t0)
            first_cpu[path] += tree_cpu_seconds(server.pid) - before
    finally:
        forwarding.stop()
        moving.stop()
    return {"landed": landed_on} | {
        path: {
            "round_trip_us": 1e6 * statistics.median(latencies[path]),
            "server_us": 1e6 * cpu[path] / len(latencies[path]),
            "landing_us": 1e6 * landing_cpu[path] / len(latencies[path]),
            "requests": len(latencies[path]),
            "first_us": 1e6 * statistics.median(first_latencies[path]),
            "first_server_us": 1e6 * first_cpu[path] / len(first_latencies[path]),
            "firsts": len(first_latencies[path]),
        }
        for path in PATHS
    }


def hop_table(hops: dict[str, Any], workers: int) -> Table:
    """The probe: a column per path; the first-set lines count a connection's whole life
    (connect, ``stats``, the set, close), so a path's extra over "local" is its one-off cost."""

    def line(label: str, key: str, fmt: str) -> list[str]:
        return [label, *(format(hops[path][key], fmt) for path in PATHS)]

    landed = " / ".join(map(str, hops["landed"]))
    return Table(
        (
            f"one client, workers = {workers}",
            "served where it lands",
            "forwarded",
            "handed off",
        ),  # fmt: skip
        [
            line("round trip, median µs (set, get)", "round_trip_us", ".0f"),
            line("server CPU µs per request", "server_us", ".1f"),
            line("of which the worker it landed on", "landing_us", ".1f"),
            line("a new connection's first set, median µs", "first_us", ".0f"),
            line("server CPU µs per new connection", "first_server_us", ".0f"),
            ["20 connections opened together, per worker", landed, "", ""],
        ],
    )


def figures(runs: list[tuple[str, Row]], hops: dict[str, Any]) -> dict[str, Any]:
    return {
        "runs": [{"setup": name} | dataclasses.asdict(row) for name, row in runs],
        "hop": hops,
    }
