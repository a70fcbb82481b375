"""One kestreld per core, measured as a Kestrel cluster is used.

    .venv/bin/python scripts/lab/instances.py --max 2 --markdown

One kestreld process uses one core.  A box with N cores runs N instances,
each its own port and queue folder; clients spread their connections over
every port, exactly as a client list spreads them over a cluster.  This
command runs the same workloads against 1, 2, ... N instances (connections
per instance kept constant, so the load grows with the instances) and
reports the aggregate throughput, the throughput per instance (per core),
the server CPU per operation, and how much of the machine the load
generator and everything else took meanwhile: on a box smaller than
``instances + load generator`` cores, they compete, and the table says so.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time

from kestreld.bench.report import Table
from kestreld.bench.servers import machine_description
from kestreld.bench.workloads import Row, Spec, measure

#: workload name -> (spec for one instance, scaled by the number of instances)
WORKLOADS = ("set", "get", "reliable")
COLUMNS = (
    "workload",
    "instances",
    "ops/s",
    "ops/s per instance",
    "scaling",
    "server cores",
    "server us/op",
    "load-gen cores",
    "others' cores",
    "p99 ms",
    "check",
)


def spec_for(workload: str, instances: int, args: argparse.Namespace) -> Spec:
    """The workload with ``per-instance`` connections on each instance."""
    per = args.connections
    common = dict(
        size=args.size,
        depth=args.depth,
        seconds=args.seconds,
        procs=args.procs,
        instances=instances,
        items=args.items * instances,
    )
    if workload == "set":
        return Spec("put-many", connections=per * instances, **common)
    if workload == "get":
        return Spec("get-drain", connections=per * instances, **common)
    if workload == "reliable":
        # producers keep every instance supplied; consumers run the open/close loop
        return Spec(
            "flood",
            reliable=True,
            producers=max(1, per // 4) * instances,
            connections=per * instances,
            **common,
        )
    raise ValueError(workload)


def cells(row: Row, base: Row | None) -> list[str]:
    scaling = f"{row.rate / base.rate:.2f}x" if base is not None and base.rate else "1.00x"
    return [
        row.key.split("-")[0],
        str(row.instances),
        f"{row.rate:,.0f}",
        f"{row.rate / row.instances:,.0f}",
        scaling,
        f"{row.server_cores:.2f}",
        f"{row.server_us:.1f}",
        f"{row.client_cores:.2f}",
        f"{row.others_cores:.2f}",
        f"{row.p99_ms:.2f}",
        row.check,
    ]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="scripts/lab/instances.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--max",
        type=int,
        default=os.cpu_count() or 1,
        help="instances up to this many (default: the number of cores)",
    )
    p.add_argument(
        "--only",
        default=",".join(WORKLOADS),
        help=f"workloads, comma-separated (default: {','.join(WORKLOADS)})",
    )
    p.add_argument(
        "-c", "--connections", type=int, default=8, help="connections per instance (default: 8)"
    )
    p.add_argument("--size", type=int, default=1024, help="item bytes (default: 1024)")
    p.add_argument("-d", "--depth", type=int, default=1, help="requests in flight per connection")
    p.add_argument(
        "-n", "--items", type=int, default=200_000, help="upper bound on items per instance"
    )
    p.add_argument("--seconds", type=float, default=5.0, help="time bound per row (default: 5)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes (default: 2)")
    p.add_argument("--repeat", type=int, default=1, help="run the whole series N times")
    p.add_argument("--workdir", default=None, help="where queue folders are created")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    return p


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    workloads = [w.strip() for w in args.only.split(",") if w.strip()]
    machine = machine_description()
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    command = "scripts/lab/instances.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    rows: list[list[str]] = []
    failed = False
    for round_ in range(args.repeat):
        for workload in workloads:
            base = None
            for n in range(1, args.max + 1):
                spec = spec_for(workload, n, args)
                log(f"[{round_ + 1}/{args.repeat}] {spec.describe()}")
                row = measure(spec, "kestreld", workdir=args.workdir)
                assert row is not None
                base = base or row
                rows.append(cells(row, base))
                failed |= bool(row.errors) or "FAILED" in row.check
    machine["loadavg at end"] = machine_description()["loadavg"]
    if args.markdown:
        print(f"Run {started}: `{command}`\n\nMachine:")
        print("\n".join(f"- {k}: {v}" for k, v in machine.items()))
        print()
    else:
        print(f"machine: {machine}")
    print(Table(COLUMNS, rows).render(args.markdown))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
