"""py-spy on the server during a measured run, and a summary of where its time went.

    .venv/bin/python scripts/lab/profiling.py [--out DIR] [-c 100] [--seconds 8]

Runs put-many and get-drain (1 KiB, 100 connections) of ``kestreld bench``
against kestreld with ``py-spy record -f raw`` attached, and prints the top
functions (self and inclusive).  Throughput of a profiled run is not a
benchmark figure.

``py-spy record -f raw`` writes collapsed stacks (``frame;frame;... count``,
root first).  Self time is the leaf frame's share of the samples, total time
the share of samples whose stack holds the function.  Idle samples (the loop
waiting in epoll) are not recorded, so shares are of the busy time.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from kestreld.bench.cli import size_arg
from kestreld.bench.workloads import Spec, measure


def py_spy() -> str:
    local = Path(sys.executable).parent / "py-spy"  # the virtualenv's, when PATH lacks it
    found = str(local) if local.exists() else shutil.which("py-spy")
    if not found:
        raise SystemExit("py-spy is not installed: .venv/bin/python -m pip install py-spy")
    return found


class Profiler:
    """``py-spy record`` attached to a pid until ``stop()`` (SIGINT makes it write the file)."""

    def __init__(
        self, pid: int, output: str | os.PathLike, *, rate: int = 250, native: bool = False
    ) -> None:
        self.pid = pid
        self.output = Path(output)
        self.rate = rate
        self.native = native
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            py_spy(),
            "record",
            "--pid",
            str(self.pid),
            "--rate",
            str(self.rate),
            "--format",
            "raw",
            "--output",
            str(self.output),
        ]
        # --native needs the target paused while its stack is read; otherwise don't pause it.
        cmd.append("--native" if self.native else "--nonblocking")
        self.log = open(self.output.with_suffix(".log"), "wb")  # noqa: SIM115
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.log.close()


_LINE = re.compile(r"^(.*) (\d+)$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _function(frame: str) -> str:
    """``data_received (kestreld/frontends/memcache/connection.py:159)`` -> ``data_received (connection.py)``."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m['func']} ({os.path.basename(m['file'])})"


def summarize(raw: str | os.PathLike, top: int = 20) -> str:
    if not Path(raw).exists():
        log = Path(raw).with_suffix(".log")
        why = log.read_text(errors="replace").strip() if log.exists() else "no log"
        return f"{raw}: py-spy wrote no profile: {why}"
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for line in Path(raw).read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        stack, n = m[1], int(m[2])
        frames = [_function(f) for f in stack.split(";") if f]
        if not frames:
            continue
        # py-spy puts "process ..." / "thread ..." pseudo-frames first with some options.
        frames = [f for f in frames if not f.startswith(("process ", "thread "))] or frames
        samples += n
        own[frames[-1]] += n
        for f in set(frames):
            total[f] += n
    if not samples:
        return f"{raw}: no samples (is py-spy allowed to ptrace the server?)"
    lines = [f"{samples} samples of busy time in {raw}", "", "self %   function"]
    lines += [f"{n / samples:6.1%}  {f}" for f, n in own.most_common(top)]
    lines += ["", "total %  function (inclusive)"]
    lines += [f"{n / samples:6.1%}  {f}" for f, n in total.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="scripts/lab/profiling.py", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--out", default=None, help="folder for the raw profiles (default: a temp folder)"
    )
    p.add_argument("-c", "--connections", type=int, default=100, help="connections (default: 100)")
    p.add_argument("--size", type=size_arg, default=1024, help="item size (default: 1KiB)")
    p.add_argument("--seconds", type=float, default=8, help="seconds per workload (default: 8)")
    p.add_argument("--native", action="store_true", help="py-spy --native")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second (default: 250)")
    p.add_argument("--top", type=int, default=25, help="functions to list (default: 25)")
    p.add_argument("--procs", type=int, default=2, help="load generator processes")
    args = p.parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="kestreld-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    base = Spec(
        "put-many",
        size=args.size,
        connections=args.connections,
        seconds=args.seconds,
        items=10_000_000,
        procs=args.procs,
    )
    for spec in (
        base,
        dataclasses.replace(base, workload="get-drain", items=int(40_000 * args.seconds)),
    ):
        raw = out / f"{spec.key}.txt"
        print(f"profiling {spec.describe()} -> {raw}", file=sys.stderr, flush=True)
        row = measure(
            spec,
            "kestreld",
            profiler_factory=lambda pid, raw=raw: Profiler(
                pid, raw, rate=args.rate, native=args.native
            ),
        )
        assert row is not None
        print(
            f"== {spec.describe()}: {row.rate:,.0f} {row.unit}s/s under py-spy, "
            f"server {row.server_us:.1f} us/{row.unit}"
        )
        print(summarize(raw, args.top))
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
