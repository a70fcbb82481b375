"""``kestreld bench`` (``scripts/bench``): load tests for kestreld, side by side with memcached.

Every command starts its own server(s) on a free loopback port, in a fresh
queue folder, and stops them when done.  Run ``kestreld bench <command> --help``.
The instruments of the performance work (hot path, profiles, instances per
core, ping-pong) are in the repository's ``scripts/lab/``, not in the package.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import sys
import time
from pathlib import Path

from kestreld.bench import report
from kestreld.bench.backlog import backlog_lines, run_backlog
from kestreld.bench.servers import machine_description
from kestreld.bench.workloads import (
    Row,
    Spec,
    describe_placement,
    measure,
    median_rows,
    with_changes,
)

KiB, MiB, GiB = 1024, 1024**2, 1024**3
_UNITS = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KiB,
    "kib": KiB,
    "m": MiB,
    "mb": MiB,
    "mib": MiB,
    "g": GiB,
    "gb": GiB,
    "gib": GiB,
}


def size_arg(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    if not m or m[2].lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64, 1KiB, 16MiB, 1GiB)")
    return int(m[1]) * _UNITS[m[2].lower()]


def cpu_list(text: str) -> frozenset[int]:
    """``0``, ``0,1``, ``0-3,6``: a set of CPU numbers (as taskset -c reads them)."""
    cpus: set[int] = set()
    try:
        for part in text.split(","):
            first, _, last = part.strip().partition("-")
            lo = int(first)
            hi = int(last) if last else lo
            if lo < 0 or hi < lo:
                raise ValueError
            cpus.update(range(lo, hi + 1))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (e.g. 0, 0,1 or 0-3)") from None
    available = os.sched_getaffinity(0)
    if not cpus <= available:
        raise argparse.ArgumentTypeError(
            f"CPU {min(cpus - available)} is not one this process may run on "
            f"({','.join(map(str, sorted(available)))})"
        )
    return frozenset(cpus)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- arguments ----------------------------------------------------------------------------------------


def common(p: argparse.ArgumentParser, *, servers: bool = True) -> None:
    g = p.add_argument_group("run")
    if servers:
        g.add_argument(
            "--server",
            choices=("kestreld", "memcached", "both"),
            default="kestreld",
            help="which server(s) to run the workload against (default: kestreld)",
        )
    g.add_argument(
        "--seconds",
        type=float,
        default=5.0,
        help="time bound of the measured run: no new batch after it (default: 5)",
    )
    g.add_argument(
        "--procs",
        type=int,
        default=2,
        help="load generator processes, at least one per role (default: 2)",
    )
    g.add_argument(
        "--workdir",
        default=None,
        help="where queue folders are created (default: the system temp folder)",
    )
    g.add_argument(
        "--memcached-threads",
        type=int,
        default=None,
        help="memcached -t (default: memcached's own default, 4)",
    )
    g.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    g.add_argument("--markdown", action="store_true", help="print Markdown tables")
    g.add_argument(
        "--server-cpus",
        type=cpu_list,
        metavar="LIST",
        help="run the servers on these CPUs only, every thread (e.g. 1; default: where the "
        "scheduler puts them)",
    )
    g.add_argument(
        "--client-cpus",
        type=cpu_list,
        metavar="LIST",
        help="run the load generator's processes on these CPUs only (e.g. 0)",
    )
    if servers:
        g.add_argument(
            "--instances",
            type=int,
            default=1,
            help="kestreld instances (each its own port and folder); connection i of each "
            "role goes to instance i %% N, as a client list spreads them (default: 1)",
        )


def item_args(p: argparse.ArgumentParser, *, items: int, size: int = 1024, depth: int = 1) -> None:
    g = p.add_argument_group("workload")
    g.add_argument(
        "--size", type=size_arg, default=size, help=f"item size, e.g. 64 or 1KiB (default: {size})"
    )
    g.add_argument(
        "-n", "--items", type=int, default=items, help=f"upper bound on items (default: {items:,})"
    )
    g.add_argument(
        "-d",
        "--depth",
        type=int,
        default=depth,
        help=f"requests in flight per connection (pipelining; default: {depth})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kestreld bench",
        description="Load tests for kestreld (in the spirit of Kestrel's), side by side with memcached. "
        "Each figure comes with the server's CPU per operation (from /proc/<pid>/stat), its RSS, "
        "the load generator's own CPU and the CPU the rest of the machine used meanwhile.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  kestreld bench put-many -c 100 --size 1KiB --server both\n"
        "  kestreld bench flood --reliable -p 50 -c 50\n"
        "  kestreld bench compare --markdown-file BENCHMARKS-table.md\n"
        "  kestreld bench backlog --size 1GiB --max-memory 16MiB\n"
        "  kestreld bench darner-suite --darner ~/darner/build/darner\n"
        "  kestreld bench queues 1000 10000",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    add_workload_parsers(sub)
    add_compare_parser(sub)
    add_backlog_parser(sub)
    p = sub.add_parser(
        "darner-suite",
        help="Darner's own suite: flood, packing, memory, fairness, hang-ups",
        description="Darner's bench/*.sh scenarios with a client doing what its db does, "
        "against kestreld and, with --darner (or $DARNER_BIN), Darner; prints the table.",
    )
    p.add_argument("--darner", metavar="PATH", help="a Darner binary to run beside kestreld")
    p.add_argument(
        "--scale", type=float, default=1.0, help="Darner's item counts times this (default: 1)"
    )
    p.add_argument(
        "--connections",
        default="1,10,100,1000,4000",
        help="the flood's connection counts (default: 1,10,100,1000,4000)",
    )
    p.add_argument(
        "--scenarios",
        default="flood,packing,memory,fairness",
        help="which of Darner's scenarios (default: flood,packing,memory,fairness)",
    )
    p.add_argument("--procs", type=int, default=2, help="client processes (default: 2)")
    p.add_argument("--workdir", default=None, help="where queue folders are created")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p = sub.add_parser(
        "queues",
        help="what N idle queues cost: RSS, descriptors, idle CPU, stats, stop, restart",
        description="N queues get 10 items of 100 B each, then sit idle; one row per N.",
    )
    p.add_argument("counts", type=int, nargs="+", metavar="N", help="numbers of queues")
    p.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU window (default: 5)")
    p.add_argument("--workdir", default=None, help="where queue folders are created")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    return parser


DEFAULT = "%s (default: %%(default)s)"


def add_workload_parsers(sub: argparse._SubParsersAction) -> None:
    """One command per workload: put-many, get-drain, flood, leaky-reader, fanout, many-clients."""
    p = sub.add_parser(
        "put-many",
        help="C connections store N items (set-only)",
        description="C connections each store their share of N items into one queue "
        "(memcached: distinct keys). Kestrel's put-many.",
    )
    p.add_argument("-c", "--connections", type=int, default=10, help=DEFAULT % "connections")
    p.add_argument(
        "--sync-journal",
        type=int,
        help="kestreld sync_journal; 0 = STORED only after fsync (group commit)",
    )
    item_args(p, items=100_000)
    common(p)

    p = sub.add_parser(
        "get-drain",
        help="C connections drain a prefilled queue",
        description="The queue is prefilled with N items (not measured); C connections "
        "then get until it is empty (memcached: get the prefilled keys). Each id must "
        "arrive exactly once; what a time-bounded run leaves is drained and counted after.",
    )
    p.add_argument("-c", "--connections", type=int, default=10, help=DEFAULT % "connections")
    p.add_argument(
        "--reliable",
        action="store_true",
        help="reliable reads: get q/open, then get q/close/open per item (memcached: get)",
    )
    item_args(p, items=100_000)
    common(p)

    p = sub.add_parser(
        "flood",
        help="producers and consumers at once (Kestrel's flood)",
        description="P producers and C consumers run at once; consumers use get q/t=ms, "
        "or with --reliable the open/close loop get q/close/open/t=ms. Checks every item "
        "arrives exactly once. memcached: set k + get k per item.",
    )
    p.add_argument("-p", "--producers", type=int, default=1, help=DEFAULT % "producer connections")
    p.add_argument("-c", "--consumers", type=int, default=1, help=DEFAULT % "consumer connections")
    p.add_argument("--reliable", action="store_true", help="consumers use get q/close/open")
    p.add_argument("--wait-ms", type=int, default=100, help=DEFAULT % "consumers' /t=")
    p.add_argument(
        "--sync-journal",
        type=int,
        help="kestreld sync_journal; 0 = STORED and confirms only after fsync (group commit)",
    )
    item_args(p, items=100_000)
    common(p)

    p = sub.add_parser(
        "leaky-reader",
        help="reliable readers that give back or drop some items",
        description="P producers, C reliable readers (get q/close/open). Each open item "
        "is given back with /abort at --abort-rate, or its connection is dropped at "
        "--drop-rate; every item must still be confirmed exactly once. kestreld only.",
    )
    p.add_argument("-p", "--producers", type=int, default=1, help=DEFAULT % "producer connections")
    p.add_argument("-c", "--consumers", type=int, default=10, help=DEFAULT % "reader connections")
    p.add_argument(
        "--abort-rate", type=float, default=0.02, help="fraction aborted (default: 0.02)"
    )
    p.add_argument("--drop-rate", type=float, default=0.01, help="fraction dropped (default: 0.01)")
    p.add_argument("--wait-ms", type=int, default=100, help=DEFAULT % "readers' /t=")
    item_args(p, items=20_000)
    common(p)

    p = sub.add_parser(
        "fanout",
        help="producers into a fanout queue read by R readers",
        description="Queue 'fan' (fanout_only) with readers fan+r1..rR; P producers store N "
        "items, each reader must get every one exactly once. memcached: set k + R x get k.",
    )
    p.add_argument("-p", "--producers", type=int, default=10, help=DEFAULT % "producer connections")
    p.add_argument("-r", "--readers", type=int, default=3, help="fanout readers (default: 3)")
    p.add_argument("--wait-ms", type=int, default=100, help=DEFAULT % "readers' /t=")
    item_args(p, items=100_000, depth=16)
    common(p)

    p = sub.add_parser(
        "many-clients",
        help="many blocked readers, a trickling producer",
        description="C connections wait in get q/t=1000 while P producers trickle items at "
        "--rate items/s each (Kestrel's many-clients). Every item must reach exactly one "
        "reader. kestreld only.",
    )
    p.add_argument(
        "-c", "--consumers", type=int, default=1000, help=DEFAULT % "waiting connections"
    )
    p.add_argument("-p", "--producers", type=int, default=1, help=DEFAULT % "producer connections")
    p.add_argument(
        "--rate",
        type=float,
        default=1000,
        help="items/s per producer; 0 = flat out (default: 1000)",
    )
    item_args(p, items=10_000)
    common(p)


def add_compare_parser(sub: argparse._SubParsersAction) -> None:
    """``compare``: the whole matrix against kestreld, memcached (and Darner)."""
    p = sub.add_parser(
        "compare",
        help="the whole matrix against kestreld and memcached, with the targets",
        description="Runs every workload of the matrix against a fresh kestreld and a fresh "
        "memcached (and a fresh Darner with --darner), one after the other, and prints the "
        "side-by-side table, the kestreld/memcached (and kestreld/Darner) ratios and the targets.",
    )
    p.add_argument(
        "--quick", action="store_true", help="a small matrix (1 KiB; 1 and 100 conns), 1.5 s rows"
    )
    p.add_argument("--only", metavar="REGEX", help="only rows whose key matches (e.g. 'c100')")
    p.add_argument("--list", action="store_true", help="list the rows' keys and exit")
    p.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run each row N times (alternating which server goes first); report medians",
    )
    p.add_argument(
        "--backlog",
        type=size_arg,
        default=0,
        metavar="SIZE",
        help="also run the backlog/restart test with SIZE queued (e.g. 1GiB)",
    )
    p.add_argument(
        "--markdown-file", metavar="FILE", help="write the tables and machine as Markdown"
    )
    p.add_argument(
        "--darner",
        metavar="PATH",
        default=None,
        help="also run Darner (C++ peer speaking Kestrel's protocol) in the same rounds, on the "
        "set, get and flood rows (default: $DARNER_BIN; without a binary, the run goes on without it)",
    )
    common(p, servers=False)


def add_backlog_parser(sub: argparse._SubParsersAction) -> None:
    """``backlog``: a large backlog, a restart and the drain."""
    p = sub.add_parser(
        "backlog",
        help="RSS with a large backlog, restart to first item, drain rate",
        description="Queues SIZE bytes at max_memory_size MAX, restarts kestreld on it "
        "and times spawn -> first item served, then drains it on one pipelined "
        "connection. Prints RSS at each stage.",
    )
    p.add_argument("--size", type=size_arg, default=GiB, help="bytes to queue (default: 1GiB)")
    p.add_argument("--item-size", type=size_arg, default=KiB, help="item size (default: 1KiB)")
    p.add_argument(
        "--max-memory", type=size_arg, default=16 * MiB, help="max_memory_size (default: 16MiB)"
    )
    p.add_argument(
        "--drain-seconds", type=float, default=180, help="time bound of the drain (default: 180)"
    )
    p.add_argument("--workdir", default=None, help="where the queue folder is created")
    p.add_argument("--procs", type=int, default=2, help="load generator processes while loading")
    p.add_argument("--json", metavar="FILE", help="also write the figures as JSON")


# --- running -------------------------------------------------------------------------------------------


def spec_from(args: argparse.Namespace) -> Spec:
    spec = Spec(
        args.command,
        size=args.size,
        items=args.items,
        depth=args.depth,
        seconds=args.seconds,
        procs=args.procs,
        instances=args.instances,
    )
    if args.command in ("put-many", "get-drain"):
        spec.connections = args.connections
    else:
        spec.producers = args.producers
    if args.command in ("put-many", "flood"):
        spec.sync_journal = args.sync_journal
    if args.command in ("flood", "leaky-reader", "many-clients"):
        spec.connections = args.consumers
    if args.command in ("flood", "get-drain"):
        spec.reliable = args.reliable
    if args.command == "leaky-reader":
        spec.abort_rate, spec.drop_rate = args.abort_rate, args.drop_rate
    if args.command == "fanout":
        spec.readers = args.readers
    if args.command == "many-clients":
        spec.rate = args.rate
    if hasattr(args, "wait_ms"):
        spec.wait_ms = args.wait_ms
    return spec


def run_rows(
    specs: list[Spec], servers: list[str], args: argparse.Namespace, repeat: int = 1
) -> list[Row]:
    """Every spec against every server; repeated runs follow each other, alternating which
    server goes first, so that both see the same load from the rest of the machine."""
    rows: list[Row] = []
    for i, spec in enumerate(specs, 1):
        order = [s for r in range(repeat) for s in (servers if r % 2 == 0 else servers[::-1])]
        for server in order:
            log(f"[{i}/{len(specs)}] {spec.key} on {server}: {spec.describe()}")
            row = measure(
                spec,
                server,
                workdir=args.workdir,
                memcached_threads=args.memcached_threads,
                darner=getattr(args, "darner_bin", None),
                server_cpus=args.server_cpus,
                client_cpus=args.client_cpus,
            )
            if row is None:
                log(f"    (no {server} analog)")
                continue
            rows.append(row)
            log(
                f"    {row.rate:,.0f} {row.unit}s/s  p99 {row.p99_ms:.2f} ms  server {row.server_us:.1f} us/{row.unit} "
                f"({row.server_cores:.2f} cores)  client {row.client_cores:.2f} cores  others {row.others_cores:.2f}  "
                f"RSS {row.rss_mib:.1f} MiB  {row.check}"
                + (f"  ({row.placement})" if row.placement else "")
                + (f"  ERRORS {row.errors}: {row.error_samples}" if row.errors else "")
            )
    return rows


def compare_matrix(quick: bool, seconds: float, procs: int) -> list[Spec]:
    base = Spec("put-many", seconds=seconds, procs=procs)
    specs: list[Spec] = []
    sizes = (1024,) if quick else (64, 1024)
    conns = (1, 100) if quick else (1, 10, 100, 1000)

    def items(size: int) -> int:
        return 20_000 if quick else (200_000 if size < 1024 else 100_000)

    for workload in ("put-many", "get-drain"):
        for size in sizes:
            for c in conns:
                specs.append(
                    with_changes(
                        base, workload=workload, size=size, connections=c, items=items(size)
                    )
                )
            specs.append(
                with_changes(
                    base, workload=workload, size=size, connections=1, depth=100, items=items(size)
                )
            )
    n = items(1024)
    for c in (1, 100):  # reliable reads of a prefilled queue: one get q/close/open per item
        specs.append(
            with_changes(base, workload="get-drain", reliable=True, connections=c, items=n)
        )
    specs.append(
        with_changes(base, workload="flood", reliable=True, producers=1, connections=1, items=n)
    )
    specs.append(
        with_changes(base, workload="flood", reliable=True, producers=50, connections=50, items=n)
    )
    specs.append(with_changes(base, workload="flood", producers=1, connections=1, items=n))
    specs.append(with_changes(base, workload="fanout", producers=10, readers=3, depth=16, items=n))
    specs.append(
        with_changes(base, workload="leaky-reader", producers=1, connections=10, items=n // 5)
    )
    specs.append(
        with_changes(
            base,
            workload="many-clients",
            producers=1,
            connections=1000 if not quick else 100,
            rate=1000,
            items=int(1000 * seconds),
        )
    )
    for c in (1, 100) if quick else (1, 10, 100):
        specs.append(
            with_changes(base, workload="put-many", sync_journal=0, connections=c, items=n)
        )
    return specs


def write_json(path: str, payload: dict) -> None:
    Path(path).write_text(json.dumps(payload, indent=2, default=str) + "\n")
    log(f"wrote {path}")


def cmd_workload(args: argparse.Namespace) -> int:
    spec = spec_from(args)
    servers = ["kestreld", "memcached"] if args.server == "both" else [args.server]
    machine = machine_description() if "memcached" in servers else None
    rows = run_rows([spec], servers, args)
    print(
        report.compare_table(rows, args.markdown)
        if len(servers) > 1
        else report.rows_table(rows, args.markdown)
    )
    if args.json:
        write_json(
            args.json,
            {"machine": machine or machine_description(), "rows": [r.to_json() for r in rows]},
        )
    return 1 if any(r.errors or "FAILED" in r.check for r in rows) else 0


def cmd_compare(args: argparse.Namespace) -> int:
    specs = compare_matrix(args.quick, args.seconds, args.procs)
    if args.only:
        specs = [s for s in specs if re.search(args.only, s.key)]
    if args.list:
        for s in specs:
            print(f"{s.key:32} {s.describe()}")
        return 0
    from kestreld.bench.servers import darner_path, ensure_memcached

    ensure_memcached()
    servers = ["kestreld", "memcached"]
    args.darner_bin = darner_path(args.darner)
    wanted = args.darner if args.darner is not None else os.environ.get("DARNER_BIN", "")
    if args.darner_bin:
        servers.insert(1, "darner")
    elif wanted:
        log(f"compare: no Darner binary at {wanted!r}: measured without Darner")
    machine = machine_description()
    machine["darner"] = args.darner_bin or "not measured"
    placement = describe_placement(args.server_cpus, args.client_cpus)
    if placement:
        machine["placement"] = placement
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    log(f"compare: {len(specs)} workloads x {len(servers)} servers; machine {machine}")
    runs = run_rows(specs, servers, args, repeat=args.repeat)
    rows = median_rows(runs)
    backlog = None
    if args.backlog:
        backlog = run_backlog(size=args.backlog, workdir=args.workdir, procs=args.procs, log=log)
    machine["loadavg at end"] = machine_description()["loadavg"]
    machine["loadavg"] = machine.pop("loadavg")
    targets = report.evaluate(rows, backlog)
    command = "kestreld bench " + " ".join(shlex.quote(a) for a in args.argv)

    def tables(markdown: bool) -> list[str]:
        out = [report.compare_table(rows, markdown)]
        if report.has_darner(rows):
            out.append(report.darner_table(rows, markdown))
        if backlog:
            out.append(report.table(("backlog", "figure"), backlog_lines(backlog), markdown))
        return [*out, report.targets_table(targets, markdown)]

    print()
    if placement:
        print(f"Placement: {placement}\n")
    print("\n\n".join(tables(args.markdown)))
    if args.markdown_file:
        head = [f"Run {started}: `{command}`", "", "Machine:", *report.machine_lines(machine)]
        Path(args.markdown_file).write_text("\n\n".join(["\n".join(head), *tables(True)]) + "\n")
        log(f"wrote {args.markdown_file}")
    if args.json:
        write_json(
            args.json,
            {
                "command": command,
                "started": started,
                "machine": machine,
                "rows": [r.to_json() for r in rows],
                "runs": [r.to_json() for r in runs],
                "backlog": backlog,
                "targets": [
                    dict(zip(report.TARGET_COLUMNS, t.cells(), strict=True)) for t in targets
                ],
            },
        )
    return 1 if any(r.errors or "FAILED" in r.check for r in rows) else 0


def cmd_backlog(args: argparse.Namespace) -> int:
    machine = machine_description()
    b = run_backlog(
        size=args.size,
        item_size=args.item_size,
        max_memory=args.max_memory,
        drain_seconds=args.drain_seconds,
        workdir=args.workdir,
        procs=args.procs,
        log=log,
    )
    machine["loadavg at end"] = machine_description()["loadavg"]
    print(f"machine: {machine}")
    print(report.table(("backlog", "figure"), backlog_lines(b)))
    targets = [t for t in report.evaluate([], b) if t.value is not None]
    print()
    print(report.targets_table(targets))
    if args.json:
        write_json(args.json, {"machine": machine, "backlog": b})
    return 1 if "FAILED" in b["check"] else 0


def raise_open_file_limit() -> None:
    """Thousands of connections or queues: the soft limit up to the hard one (the servers
    started from here inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def cmd_darner_suite(args: argparse.Namespace) -> int:
    from kestreld.bench.darner_suite import SuiteSizes, run_suite, suite_rows
    from kestreld.bench.servers import DarnerServer, KestreldServer, darner_path

    raise_open_file_limit()
    sizes = SuiteSizes(args.scale, tuple(int(c) for c in args.connections.split(",")))
    starts = {"kestreld": lambda: KestreldServer(workdir=args.workdir)}
    darner = darner_path(args.darner)
    if darner:
        starts["Darner"] = lambda: DarnerServer(darner, workdir=args.workdir)
    elif args.darner:
        log(f"darner-suite: no Darner binary at {args.darner!r}: kestreld only")
    figures = {}
    for name, start in starts.items():
        log(f"darner-suite: {name}")
        figures[name] = run_suite(start, sizes, args.procs, log, args.scenarios.split(","))
    header, *rows = suite_rows(figures, sizes)
    print(f"machine: {machine_description()}")
    print(report.table(header, rows, args.markdown))
    return 0 if all(f.alive or not f.hangups for f in figures.values()) else 1


def cmd_queues(args: argparse.Namespace) -> int:
    from kestreld.bench.many_queues import QUEUES_HEADER, queues_row, run_queues

    raise_open_file_limit()
    rows = [
        queues_row(run_queues(n, idle_seconds=args.idle_seconds, workdir=args.workdir, log=log))
        for n in args.counts
    ]
    print(f"machine: {machine_description()}")
    print(report.table(QUEUES_HEADER, rows, args.markdown))
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # for the report's command line
    if args.command == "compare":
        return cmd_compare(args)
    if args.command == "backlog":
        return cmd_backlog(args)
    if args.command == "darner-suite":
        return cmd_darner_suite(args)
    if args.command == "queues":
        return cmd_queues(args)
    return cmd_workload(args)


if __name__ == "__main__":
    sys.exit(main())
