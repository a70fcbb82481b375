"""``kestreld bench`` (``scripts/bench``): its options, each defined once (``OPTIONS``), the
commands that take them (``COMMANDS``), and what every command ends with (:func:`publish`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import resource
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from kestreld.bench import report
from kestreld.bench.backlog import backlog_table, run_backlog
from kestreld.bench.darner_suite import SCENARIOS, SuiteSizes, run_suite, suite_table
from kestreld.bench.every_core import BoxSizes, box_table, hop_costs, hop_table, run_box
from kestreld.bench.every_core import figures as box_figures
from kestreld.bench.many_queues import queues_table, run_queues
from kestreld.bench.report import Table
from kestreld.bench.servers import (
    darner_path,
    ensure_memcached,
    loadavg,
    machine_description,
    start_server,
)
from kestreld.bench.workloads import Row, Spec, measure, median_rows
from kestreld.config.model import ConfigError, parse_size


def size_arg(text: str) -> int:
    """``64``, ``1KiB``, ``16MiB``, ``1GiB``: bytes, as the config reads sizes."""
    try:
        return parse_size("size", text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 64, 1KiB, 1GiB)") from None


def cpu_list(text: str) -> frozenset[int]:
    """``0``, ``0,1``, ``0-3,6``: CPUs this process may run on, as taskset -c reads them."""
    cpus: set[int] = set()
    for part in text.split(","):
        first, dash, last = part.partition("-")
        last = last if dash else first
        if not (first.isdigit() and last.isdigit() and int(first) <= int(last)):
            raise argparse.ArgumentTypeError(f"not a CPU list: {text!r} (e.g. 0, 0,1 or 0-3)")
        cpus.update(range(int(first), int(last) + 1))
    if not cpus or not cpus <= os.sched_getaffinity(0):
        mine = ",".join(map(str, sorted(os.sched_getaffinity(0))))
        raise argparse.ArgumentTypeError(f"not CPUs this process may run on ({mine}): {text!r}")
    return frozenset(cpus)


def int_list(text: str) -> list[int]:
    try:
        return [int(n) for n in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of numbers: {text!r}") from None


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- the options, each defined once, and the commands that take them -----------------------------

#: name (the attribute it sets) -> (flags, argparse's keywords).
OPTIONS: dict[str, tuple[str, dict[str, Any]]] = {
    # a workload
    "connections": ("-c --connections", dict(type=int, help="connections")),
    "consumers": ("-c --consumers", dict(type=int, dest="connections", metavar="CONSUMERS",
                  help="consumers")),
    "producers": ("-p --producers", dict(type=int, help="producer connections")),
    "readers": ("-r --readers", dict(type=int, help="fanout readers")),
    "size": ("--size", dict(type=size_arg, help="item size, e.g. 64 or 1KiB")),
    "items": ("-n --items", dict(type=int, help="upper bound on items")),
    "depth": ("-d --depth", dict(type=int, help="requests in flight per connection")),
    "reliable": ("--reliable", dict(action="store_true",
                 help="reliable reads: get q/close/open per item (memcached: get)")),
    "wait_ms": ("--wait-ms", dict(type=int, help="consumers' get q/t=<ms>")),
    "sync_journal": ("--sync-journal", dict(type=int, help="kestreld's sync_journal; "
                     "0: STORED and confirms only after fsync (group commit)")),
    "abort_rate": ("--abort-rate", dict(type=float, help="the share of reads given back")),
    "drop_rate": ("--drop-rate", dict(type=float, help="the share of reads hung up on")),
    "rate": ("--rate", dict(type=float, help="items/s per producer; 0: flat out")),
    # where it runs and for how long
    "server": ("--server", dict(choices=("kestreld", "memcached", "both"), help="the server(s)")),
    "instances": ("--instances", dict(type=int, help="kestreld instances, each its own port "
                  "and folder; connection i of a role goes to instance i %% N")),
    "seconds": ("--seconds", dict(type=float, help="time bound: no new batch after it")),
    "procs": ("--procs", dict(type=int, help="load generator processes")),
    "server_cpus": ("--server-cpus", dict(type=cpu_list, metavar="LIST", help="the servers' CPUs")),
    "client_cpus": ("--client-cpus", dict(type=cpu_list, metavar="LIST", help="the clients' CPUs")),
    "workdir": ("--workdir", dict(help="where queue folders are created (default: $TMPDIR)")),
    "darner": ("--darner", dict(metavar="PATH", help="a Darner binary to measure beside "
               "kestreld (default: $DARNER_BIN; without one, the others are measured)")),
    # compare
    "quick": ("--quick", dict(action="store_true", help="a small matrix (1 KiB; 1, 100 conns)")),
    "only": ("--only", dict(metavar="REGEX", help="only rows whose key matches (e.g. 'c100')")),
    "list": ("--list", dict(action="store_true", help="list the rows instead of running them")),
    "repeat": ("--repeat", dict(type=int, help="run each row N times, alternating which "
               "server goes first; report medians")),
    "backlog": ("--backlog", dict(type=size_arg, metavar="SIZE", help="also the backlog test")),
    # backlog
    "total": ("--size", dict(type=size_arg, help="bytes to queue")),
    "item_size": ("--item-size", dict(type=size_arg, help="item size")),
    "max_memory": ("--max-memory", dict(type=size_arg, help="kestreld's max_memory_size")),
    "drain_seconds": ("--drain-seconds", dict(type=float, help="time bound of the drain")),
    # darner-suite
    "scale": ("--scale", dict(type=float, help="Darner's item counts times this")),
    "flood_connections": ("--connections", dict(type=int_list, help="the flood's connections")),
    "scenarios": ("--scenarios", dict(metavar="LIST", help="which of Darner's scenarios")),
    # workers
    "workers": ("--workers", dict(type=int, help="N: workers = 1, workers = N and N instances")),
    "queues": ("--queues", dict(type=int, help="queues; connection i uses queue i mod this")),
    "hops": ("--hops", dict(type=int, help="round trips of the one-client probe, per path "
             "(local, forwarded, handed off)")),
    "spread": ("--spread", dict(type=int, help="the last workload's queues per connection "
               "(1: leave it out)")),
    # queues
    "counts": ("counts", dict(type=int, nargs="+", metavar="N", help="numbers of queues")),
    "idle_seconds": ("--idle-seconds", dict(type=float, help="the idle CPU's window")),
    # what every command prints and writes
    "markdown": ("--markdown", dict(action="store_true", help="print Markdown tables")),
    "markdown_file": ("--markdown-file", dict(metavar="FILE", help="also write it as Markdown")),
    "json": ("--json", dict(metavar="FILE", help="also write the figures as JSON")),
}  # fmt: skip

OUTPUT = dict(markdown=False, markdown_file=None, json=None)
RUN = dict(seconds=5.0, procs=2, server_cpus=None, client_cpus=None, workdir=None, **OUTPUT)
WORKLOAD = dict(size="1KiB", depth=1, server="kestreld", instances=1, **RUN)

#: command -> (what it does, what else its --help says, {option: default}).
COMMANDS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "put-many": ("C connections store N items into one queue (Kestrel's put-many)",
                 "memcached: sets of distinct keys.",
                 dict(connections=10, items=100_000, sync_journal=None, **WORKLOAD)),
    "get-drain": ("C connections drain a queue prefilled with N items",
                  "Each item must arrive exactly once. memcached: gets of the prefilled keys.",
                  dict(connections=10, reliable=False, items=100_000, **WORKLOAD)),
    "flood": ("P producers and C consumers at once (Kestrel's flood)",
              "Each item must arrive exactly once. memcached: set k + get k per item.",
              dict(producers=1, consumers=1, reliable=False, wait_ms=100, sync_journal=None,
                   items=100_000, **WORKLOAD)),
    "leaky-reader": ("C reliable readers that give back (/abort) or drop some items",
                     "Each item must still be confirmed exactly once. kestreld only.",
                     dict(producers=1, consumers=10, abort_rate=0.02, drop_rate=0.01,
                          wait_ms=100, items=20_000, **WORKLOAD)),
    "fanout": ("P producers into a fanout queue read by R readers",
               "Each reader must get every item exactly once. memcached: set k + R x get k.",
               dict(producers=10, readers=3, wait_ms=100, items=100_000, **WORKLOAD)
               | dict(depth=16)),
    "many-clients": ("C readers wait in get q/t=1000 while producers trickle at --rate",
                     "Kestrel's many-clients. Each item must reach exactly one reader. "
                     "kestreld only.",
                     dict(consumers=1000, producers=1, rate=1000.0, items=10_000, **WORKLOAD)),
    "compare": ("the whole matrix against kestreld, memcached (and Darner), with the targets",
                "Each row against a fresh server of each kind, one after the other.",
                dict(quick=False, only=None, list=False, repeat=1, backlog=0, darner=None,
                     **RUN)),
    "backlog": ("RSS with a large backlog, restart to first item, drain rate",
                "kestreld at --max-memory with --size queued, restarted, then drained.",
                dict(total="1GiB", item_size="1KiB", max_memory="16MiB", drain_seconds=180.0,
                     procs=2, workdir=None, **OUTPUT)),
    "darner-suite": ("Darner's own suite: flood, packing, memory, fairness, hang-ups",
                     "Darner's bench/*.sh with a client doing what its db does, against "
                     "kestreld and, with --darner (or $DARNER_BIN), Darner.",
                     dict(darner=None, scale=1.0, flood_connections="1,10,100,1000,4000",
                          scenarios="flood,packing,memory,fairness", procs=2, workdir=None,
                          **OUTPUT)),
    "workers": ("workers = 1, workers = N (with and without the hand-off) and N instances: "
                "set and get on many queues",
                "One run, side by side: throughput, server CPU per operation (supervisor and "
                "workers), the share of requests that crossed to another worker and the "
                "connections moved; set with each connection alternating over --spread "
                "queues; then one client's round trip to a queue of its own worker, one "
                "forwarded and one after the hand-off, and a new connection's first set.",
                dict(workers=2, connections=100, queues=100, size="1KiB", depth=1,
                     items=300_000, hops=5000, spread=4, repeat=1,
                     **RUN | dict(seconds=3.0))),
    "queues": ("what N idle queues cost: RSS, descriptors, idle CPU, stats, stop, restart",
               "N queues get 10 items of 100 B each, then sit idle; one row per N.",
               dict(counts=None, idle_seconds=5.0, workdir=None, **OUTPUT)),
}  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kestreld bench",
        description="Load tests for kestreld, side by side with memcached and Darner "
        "(BENCHMARKS.md says how to read them).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  kestreld bench put-many -c 100 --size 1KiB --server both\n"
        "  kestreld bench flood --reliable -p 50 -c 50\n"
        "  kestreld bench compare --quick --markdown-file compare.md\n"
        "  kestreld bench backlog --size 1GiB --max-memory 16MiB\n"
        "  kestreld bench darner-suite --darner ~/darner/build/darner\n"
        "  kestreld bench queues 1000 10000\n"
        "  kestreld bench workers --workers 2 --repeat 3",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for command, (summary, description, defaults) in COMMANDS.items():
        p = sub.add_parser(command, help=summary, description=f"{summary}. {description}")
        for name, default in defaults.items():
            flag_text, keywords = OPTIONS[name]
            flags = flag_text.split()
            keywords = dict(keywords, default=default)
            if default not in (None, False):  # 0 and 0.0 too: no default worth saying
                keywords["help"] += " (default: %(default)s)"
            if flags[0].startswith("-"):
                keywords.setdefault("dest", name)
            p.add_argument(*flags, **keywords)
    return parser


# --- the commands ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    """A command's tables, its figures (--json), its checks' verdict, its machine lines."""

    tables: list[Table]
    figures: dict[str, Any]
    ok: bool = True
    machine: dict[str, str] = field(default_factory=dict)


SPEC_FIELDS = {f.name for f in dataclasses.fields(Spec)} - {"workload"}


def checks_passed(rows: list[Row]) -> bool:
    return not any(r.errors or "FAILED" in r.check for r in rows)


def run_rows(
    specs: list[Spec], servers: list[str], args: argparse.Namespace, darner: str | None = None
) -> list[Row]:
    """Every spec against every server; repeated runs follow each other, alternating which
    server goes first, so that both see the same load from the rest of the machine."""
    rows: list[Row] = []
    repeat = getattr(args, "repeat", 1)
    for i, spec in enumerate(specs, 1):
        for server in [s for r in range(repeat) for s in (servers[::-1] if r % 2 else servers)]:
            log(f"[{i}/{len(specs)}] {spec.key} on {server}: {spec.describe()}")
            row = measure(
                spec,
                server,
                workdir=args.workdir,
                darner=darner,
                server_cpus=args.server_cpus,
                client_cpus=args.client_cpus,
            )
            if row is None:
                log(f"    (no {server} analog)")
                continue
            rows.append(row)
            log(
                f"    {row.rate:,.0f} {row.unit}s/s  p99 {row.p99_ms:.2f} ms  server "
                f"{row.server_us:.1f} us/{row.unit} ({row.server_cores:.2f} cores)  client "
                f"{row.client_cores:.2f} cores  others {row.others_cores:.2f}  RSS "
                f"{row.rss_mib:.1f} MiB  {row.check}"
                + (f"  ERRORS {row.errors}: {row.error_samples}" if row.errors else "")
            )
    return rows


def cmd_workload(args: argparse.Namespace) -> Outcome:
    spec = Spec(args.command, **{k: v for k, v in vars(args).items() if k in SPEC_FIELDS})
    servers = ["kestreld", "memcached"] if args.server == "both" else [args.server]
    rows = run_rows([spec], servers, args)
    table = report.compare_table(rows) if len(servers) > 1 else report.rows_table(rows)
    return Outcome([table], {"rows": [dataclasses.asdict(r) for r in rows]}, checks_passed(rows))


def compare_matrix(quick: bool, seconds: float, procs: int) -> list[Spec]:
    """The rows of ``compare``; the targets read some of them (report.evaluate)."""
    base = Spec("put-many", seconds=seconds, procs=procs)

    def row(**changes: Any) -> Spec:
        changes.setdefault("items", 20_000 if quick else 100_000)
        return dataclasses.replace(base, **changes)

    specs = []
    for workload in ("put-many", "get-drain"):
        for size in (1024,) if quick else (64, 1024):
            items = 20_000 if quick else 200_000 if size < 1024 else 100_000
            for c in (1, 100) if quick else (1, 10, 100, 1000):
                specs.append(row(workload=workload, size=size, connections=c, items=items))
            specs.append(row(workload=workload, size=size, connections=1, depth=100, items=items))
    specs += [row(workload="get-drain", reliable=True, connections=c) for c in (1, 100)]
    items = int(1000 * seconds)  # many-clients: a producer at 1,000 items/s for the whole run
    specs += [
        row(workload="flood", reliable=True, producers=1, connections=1),
        row(workload="flood", reliable=True, producers=50, connections=50),
        row(workload="flood", producers=1, connections=1),
        row(workload="fanout", producers=10, readers=3, depth=16),
        row(workload="leaky-reader", producers=1, connections=10, items=4_000 if quick else 20_000),
        row(workload="many-clients", connections=100 if quick else 1000, rate=1000, items=items),
    ]
    specs += [
        row(workload="put-many", sync_journal=0, connections=c)
        for c in ((1, 100) if quick else (1, 10, 100))
    ]
    return specs


def cmd_compare(args: argparse.Namespace) -> Outcome:
    specs = compare_matrix(args.quick, args.seconds, args.procs)
    specs = [s for s in specs if not args.only or re.search(args.only, s.key)]
    if args.list:
        return Outcome([Table(("row", "workload"), [[s.key, s.describe()] for s in specs])], {})
    ensure_memcached()
    darner = darner_path(args.darner)
    wanted = args.darner if args.darner is not None else os.environ.get("DARNER_BIN", "")
    if wanted and not darner:
        log(f"compare: no Darner binary at {wanted!r}: measured without Darner")
    servers = ["kestreld", "darner", "memcached"] if darner else ["kestreld", "memcached"]
    log(f"compare: {len(specs)} workloads x {len(servers)} servers")
    runs = run_rows(specs, servers, args, darner)
    rows = median_rows(runs)
    backlog = None
    if args.backlog:
        backlog = run_backlog(size=args.backlog, workdir=args.workdir, procs=args.procs, log=log)
    targets = report.evaluate(rows, backlog)
    tables = [report.compare_table(rows)]
    tables += [report.darner_table(rows)] if darner else []
    tables += [backlog_table(backlog)] if backlog else []
    figures = {
        "rows": [dataclasses.asdict(r) for r in rows],
        "runs": [dataclasses.asdict(r) for r in runs],
        "backlog": backlog,
        "targets": [dict(zip(report.TARGET_COLUMNS, t.cells(), strict=True)) for t in targets],
    }
    tables.append(report.targets_table(targets))
    return Outcome(tables, figures, checks_passed(rows), {"darner": darner or "not measured"})


def cmd_backlog(args: argparse.Namespace) -> Outcome:
    b = run_backlog(
        size=args.total,
        item_size=args.item_size,
        max_memory=args.max_memory,
        drain_seconds=args.drain_seconds,
        workdir=args.workdir,
        procs=args.procs,
        log=log,
    )
    targets = [t for t in report.evaluate([], b) if t.value is not None]
    tables = [backlog_table(b), report.targets_table(targets)]
    return Outcome(tables, {"backlog": b}, "FAILED" not in b["check"])


def cmd_darner_suite(args: argparse.Namespace) -> Outcome:
    scenarios = args.scenarios.split(",")
    if unknown := set(scenarios) - set(SCENARIOS):
        raise SystemExit(
            f"darner-suite: no scenario {', '.join(sorted(unknown))} ({', '.join(SCENARIOS)})"
        )
    sizes = SuiteSizes(args.scale, tuple(args.flood_connections))
    darner = darner_path(args.darner)
    if args.darner and not darner:
        log(f"darner-suite: no Darner binary at {args.darner!r}: kestreld only")
    figures = {}
    for name in ["kestreld", "Darner"] if darner else ["kestreld"]:
        log(f"darner-suite: {name}")
        start = partial(start_server, name.lower(), workdir=args.workdir, darner=darner)
        figures[name] = run_suite(start, sizes, args.procs, log, scenarios)
    ok = all(f.alive or not f.hangups for f in figures.values())
    return Outcome(
        [suite_table(figures, sizes)], {n: dataclasses.asdict(f) for n, f in figures.items()}, ok
    )


def cmd_workers(args: argparse.Namespace) -> Outcome:
    if args.workers < 2:
        raise SystemExit("workers: --workers must be at least 2 (it is compared with 1)")
    sizes = BoxSizes(args.workers, args.connections, args.queues, args.size, args.depth,
                     args.items, args.seconds, args.procs, args.spread)  # fmt: skip
    runs = run_box(
        sizes,
        repeat=args.repeat,
        workdir=args.workdir,
        server_cpus=args.server_cpus,
        client_cpus=args.client_cpus,
        log=log,
    )
    log(f"workers: one client, local, forwarded and handed off, workers = {args.workers}")
    hops = hop_costs(args.workers, args.hops, size=args.size, workdir=args.workdir)
    tables = [box_table(runs), hop_table(hops, args.workers)]
    return Outcome(tables, box_figures(runs, hops), checks_passed([r for _, r in runs]))


def cmd_queues(args: argparse.Namespace) -> Outcome:
    runs = [
        run_queues(n, idle_seconds=args.idle_seconds, workdir=args.workdir, log=log)
        for n in args.counts
    ]
    return Outcome([queues_table(runs)], {"queues": runs})


# --- what every command ends with -----------------------------------------------------------------


def publish(args: argparse.Namespace, outcome: Outcome, run: dict[str, Any]) -> None:
    """The run (command, start, machine) and the tables on stdout, as Markdown with
    --markdown; the same in Markdown with --markdown-file; the figures with --json."""
    head = [f"Run {run['started']}: `{run['command']}`", "", "Machine:"]
    head += [f"- {k}: {v}" for k, v in run["machine"].items()]

    def text(markdown: bool) -> str:
        return "\n\n".join(["\n".join(head), *(t.render(markdown) for t in outcome.tables)]) + "\n"

    print(text(args.markdown), end="")
    if args.markdown_file:
        Path(args.markdown_file).write_text(text(True))
        log(f"wrote {args.markdown_file}")
    if args.json:
        figures = run | outcome.figures
        Path(args.json).write_text(json.dumps(figures, indent=2, default=str) + "\n")
        log(f"wrote {args.json}")


RUNNERS: dict[str, Callable[[argparse.Namespace], Outcome]] = {
    "compare": cmd_compare,
    "backlog": cmd_backlog,
    "darner-suite": cmd_darner_suite,
    "queues": cmd_queues,
    "workers": cmd_workers,
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    # Thousands of connections or queues: the soft limit up to the hard one (servers inherit it).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    machine = machine_description()
    outcome = RUNNERS.get(args.command, cmd_workload)(args)
    for who in ("server", "client"):  # --server-cpus, --client-cpus
        if cpus := getattr(args, f"{who}_cpus", None):
            machine[f"{who} CPUs"] = ",".join(map(str, sorted(cpus)))
    machine |= outcome.machine | {"loadavg at end": loadavg()}
    run = {"command": f"kestreld bench {shlex.join(argv)}", "started": started, "machine": machine}
    publish(args, outcome, run)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
