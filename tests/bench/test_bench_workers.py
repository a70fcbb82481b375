"""kestreld bench workers: workers = 1, workers = N (with and without the hand-off) and N
instances side by side, on many queues; what a request costs served where it lands,
forwarded, and after its connection moved.  Tiny sizes: these check that
the command runs and that its own checks pass, not any figure."""

from __future__ import annotations

import dataclasses

from kestreld.bench import cli as bench_cli
from kestreld.bench.servers import KestreldServer, process_tree
from kestreld.bench.workloads import Spec, measure

MANY = Spec("get-drain", connections=8, queues=8, depth=4, items=2000, size=64, seconds=1.0)


def test_the_workers_command_prints_each_server_per_workload_and_the_paths(tmp_path, capsys):
    # 8 queues: bench0-3 are worker 1's, bench4-7 worker 0's, so a connection over 4 of
    # them (from bench1 on) uses both workers
    argv = ["workers", "-c", "4", "--queues", "8", "-n", "400", "--size", "64",
            "--seconds", "0.5", "--hops", "50", "--workdir", str(tmp_path), "--markdown"]  # fmt: skip
    assert bench_cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ")]
    spread = "set, 4 queues a conn"
    servers = [(r[0], r[1]) for r in rows if r[0] in ("set", "get", spread)]
    boxes = ("workers = 1", "workers = 2", "workers = 2, no hand-off")
    assert servers == [
        *((unit, name) for unit in ("set", "get") for name in (*boxes, "2 instances")),
        *((spread, name) for name in boxes),
    ]
    crossed = {(r[0], r[1]): r[7] for r in rows if r[0] in ("set", "get", spread)}
    moved = {(r[0], r[1]): r[8] for r in rows if r[0] in ("set", "get", spread)}
    assert crossed[("set", "workers = 1")] == "0 %" and crossed[("get", "2 instances")] == "0 %"
    assert moved[("set", "workers = 2, no hand-off")] == "0"
    # a connection over both workers' queues is forwarded some requests, moved or not
    assert crossed[(spread, "workers = 2")] != "0 %"
    assert crossed[(spread, "workers = 2, no hand-off")] != "0 %"
    assert all("FAILED" not in r[-1] for r in rows)
    (header,) = [r for r in rows if r[0] == "one client, workers = 2"]
    assert header[1:] == ["served where it lands", "forwarded", "handed off"]
    for label in ("round trip", "a new connection's first set"):  # CPU: too few for a tick
        (line,) = [r for r in rows if r[0].startswith(label)]
        assert all(float(x) > 0 for x in line[1:]), line
    (landed,) = [r[1] for r in rows if r[0].startswith("20 connections")]
    assert sum(int(n) for n in landed.split(" / ")) == 20


def test_a_box_of_workers_counts_the_requests_that_crossed_and_delivers_each_item_once(
    tmp_path,
):
    row = measure(dataclasses.replace(MANY, workers=2), "kestreld", workdir=str(tmp_path))
    assert row is not None and row.key.endswith("-q8-w2") and row.workers == 2
    assert row.errors == 0, row.error_samples
    assert row.check.startswith("exactly once"), row.check
    # 8 connections, each on its own queue, landing where the kernel puts them: each
    # request is counted once, where it landed
    assert row.requests_local + row.requests_crossed >= row.units
    assert 0.0 <= row.crossed <= 1.0


def test_many_queues_over_instances_go_each_to_the_instance_it_hashes_to(tmp_path):
    row = measure(dataclasses.replace(MANY, instances=2), "kestreld", workdir=str(tmp_path))
    assert row is not None and row.instances == 2
    assert row.errors == 0, row.error_samples
    assert row.check.startswith("exactly once"), row.check
    assert row.requests_crossed == 0


def test_server_cpu_is_read_from_the_supervisor_and_every_worker(tmp_path):
    server = KestreldServer(workdir=str(tmp_path), workers=2).start()
    try:
        assert len(process_tree(server.pid)) == 3
    finally:
        server.stop()
