"""``scripts/bench-hotpath`` (scripts/lab/hotpath.py): every workload runs against a real in-process server."""

from __future__ import annotations

import subprocess
import sys

from lab import LAB


def test_every_hotpath_workload_runs_and_reports_a_cost(tmp_path):
    workloads = ["set", "get", "reliable", "waiting", "version"]
    out = subprocess.run(
        [sys.executable, str(LAB / "hotpath.py"), "-c", "2", "--rounds", "30",
         "--repeat", "1", "--workdir", str(tmp_path), *workloads],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert sorted(lines) == sorted(workloads), out
    for line in lines.values():
        assert " us/op " in line and float(line.split()[1]) > 0, line
