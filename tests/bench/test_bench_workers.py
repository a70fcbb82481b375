"""kestreld bench workers: workers = 1, workers = N and N instances side by side, on many
queues; what a request that crosses to another worker costs.  Tiny sizes: these check that
the command runs and that its own checks pass, not any figure."""

from __future__ import annotations

import dataclasses

from kestreld.bench import cli as bench_cli
from kestreld.bench.servers import KestreldServer, process_tree
from kestreld.bench.workloads import Spec, measure

MANY = Spec("get-drain", connections=8, queues=8, depth=4, items=2000, size=64, seconds=1.0)


def test_the_workers_command_prints_each_server_per_workload_and_the_hop(tmp_path, capsys):
    argv = ["workers", "-c", "4", "--queues", "4", "-n", "400", "--size", "64",
            "--seconds", "0.5", "--hops", "50", "--workdir", str(tmp_path), "--markdown"]  # fmt: skip
    assert bench_cli.main(argv) == 0
    out = capsys.readouterr().out
    rows = [line.strip("| ").split(" | ") for line in out.splitlines() if line.startswith("| ")]
    servers = [(r[0], r[1]) for r in rows if r[0] in ("set", "get")]
    assert servers == [
        (unit, name)
        for unit in ("set", "get")
        for name in ("workers = 1", "workers = 2", "2 instances")
    ]
    crossed = {(r[0], r[1]): r[7] for r in rows if r[0] in ("set", "get")}
    assert crossed[("set", "workers = 1")] == "0 %" and crossed[("get", "2 instances")] == "0 %"
    assert all("FAILED" not in r[-1] for r in rows)
    assert any(r[0].startswith("round trip") for r in rows)
    assert any(r[0].startswith("server CPU") for r in rows)
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
