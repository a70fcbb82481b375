"""kestreld bench (scripts/bench) must keep working: every workload, about a second each, against a real kestreld.

These check that the suite runs and that its own checks pass (every item
delivered exactly once), not any performance figure.
"""

from __future__ import annotations

import dataclasses
import os

import pytest
from lab import instrument

from kestreld.bench import cli as bench_cli
from kestreld.bench.backlog import run_backlog
from kestreld.bench.report import compare_table, evaluate, rows_table
from kestreld.bench.servers import memcached_path
from kestreld.bench.workloads import WORKLOADS, Row, Spec, measure

SMALL = {
    "put-many": Spec("put-many", connections=20, items=3000),
    "get-drain": Spec("get-drain", connections=20, depth=4, items=3000),
    "flood": Spec("flood", reliable=True, producers=2, connections=4, depth=2, items=2000),
    "leaky-reader": Spec(
        "leaky-reader", connections=4, items=1000, abort_rate=0.05, drop_rate=0.02
    ),
    "fanout": Spec("fanout", producers=2, readers=3, depth=8, items=2000),
    "many-clients": Spec("many-clients", connections=50, items=300, rate=1000),
}


def _row(key: str, server: str, us: float, unit: str = "set") -> Row:
    """A measured row with only its key, server and CPU per op of interest."""
    return Row(key, key, server, unit, 100, 100, 1.0, 100.0, 1.0, 2.0, 9.0, 1.0, us, 0.5,
               10.0, 0.1, 1.0, 0.1, 1.0, "1 1 1", "-", 0, [])  # fmt: skip


@pytest.mark.parametrize("workload", WORKLOADS)
def test_workload_runs_and_delivers_every_item_once(workload, tmp_path):
    spec = SMALL[workload]
    spec.seconds = 1.0
    spec.size = 64
    row = measure(spec, "kestreld", workdir=str(tmp_path))
    assert row is not None
    assert row.errors == 0, row.error_samples
    assert row.units > 0 and row.server_cpu >= 0 and row.rss_mib > 0
    if workload != "put-many":
        assert row.check.startswith("exactly once"), row.check
    assert row.description in rows_table([row]).render()


def test_cpu_lists_read_as_taskset_reads_them():
    import argparse

    from kestreld.bench.cli import cpu_list

    mine = sorted(os.sched_getaffinity(0))
    assert cpu_list(str(mine[0])) == {mine[0]}
    assert cpu_list(",".join(map(str, mine))) == set(mine)
    assert cpu_list(f"{mine[0]}-{mine[0]}") == {mine[0]}
    for bad in ("", "x", "1-0", "-1", "0,,1", "100000"):
        with pytest.raises(argparse.ArgumentTypeError):
            cpu_list(bad)


def test_a_pinned_run_places_the_server_and_the_load_generator(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    spec = Spec("flood", size=64, connections=1, producers=1, reliable=True, seconds=1.0)
    spec.items = 2_000
    seen: dict[str, set[int]] = {}

    def profiler(pid):  # runs as the measured load starts: where do the server's threads run?
        tids = os.listdir(f"/proc/{pid}/task")
        seen["server"] = set().union(*(os.sched_getaffinity(int(t)) for t in tids))
        return _NoProfile()

    row = measure(
        spec,
        "kestreld",
        workdir=str(tmp_path),
        server_cpus=frozenset({cpu}),
        client_cpus=frozenset({cpu}),
        profiler_factory=profiler,
    )
    assert row is not None and row.errors == 0 and row.check.startswith("exactly once")
    assert seen["server"] == {cpu}


def test_the_machine_description_says_where_the_run_was_pinned(capsys):
    cpu = str(min(os.sched_getaffinity(0)))
    argv = ["compare", "--list", "--server-cpus", cpu, "--client-cpus", cpu, "--markdown"]
    assert bench_cli.main(argv) == 0
    out = capsys.readouterr().out
    assert f"- server CPUs: {cpu}\n- client CPUs: {cpu}\n" in out


class _NoProfile:
    def start(self):
        pass

    def stop(self):
        pass


@pytest.mark.skipif(memcached_path() is None, reason="memcached is not installed")
def test_memcached_side_and_ratios(tmp_path):
    # 20,000 items: memcached's CPU for 2,000 could read 0 clock ticks (10 ms each); the items
    # end the run, the time bound is only there for a machine too busy to store them in 5 s
    spec = Spec("put-many", size=1024, connections=100, items=20_000, seconds=5.0)
    rows = [measure(spec, s, workdir=str(tmp_path)) for s in ("kestreld", "memcached")]
    assert all(r is not None and r.errors == 0 and r.units == 20_000 for r in rows)
    table = compare_table(rows).render()  # type: ignore[arg-type]
    assert "x" in table.splitlines()[2]  # a kestreld/memcached ratio was computed
    set_target = evaluate(rows)[0]  # type: ignore[arg-type]
    assert set_target.value is not None and set_target.met is not None


def test_backlog_restart_and_drain(tmp_path):
    out = run_backlog(size=4 << 20, max_memory=1 << 20, workdir=str(tmp_path), log=lambda _: None)
    assert out["check"] == "exactly once, in order"
    assert out["first_item_s"] > 0 and out["rss_max_mib"] > 0


def test_every_command_has_help(capsys):
    parser = bench_cli.build_parser()
    for command in (*WORKLOADS, "compare", "backlog"):
        with pytest.raises(SystemExit) as e:
            parser.parse_args([command, "--help"])
        assert e.value.code == 0
    assert capsys.readouterr().out.count("usage: kestreld bench") == len(WORKLOADS) + 2


def test_compare_matrix_holds_the_rows_the_targets_read():
    for quick in (False, True):
        keys = {s.key for s in bench_cli.compare_matrix(quick, 5, 2)}
        assert {"set-1k-c100-d1", "get-1k-c100-d1", "reliable-1k-p50c50-d1"} <= keys
        assert {"reliable-get-1k-c1-d1", "reliable-get-1k-c100-d1"} <= keys
        assert "set-sync0-1k-c100-d1" in keys


def test_a_reliable_drain_confirms_every_item_once(tmp_path):
    """get-drain --reliable: one get q/close/open per item (the first opens, the last
    closes), so the row's unit is a request, as a plain get's."""
    spec = Spec("get-drain", reliable=True, connections=10, depth=4, items=2000, seconds=1.0)
    spec.size = 64
    row = measure(spec, "kestreld", workdir=str(tmp_path))
    assert row is not None and row.key == "reliable-get-64b-c10-d4"
    assert row.errors == 0, row.error_samples
    assert row.check.startswith("exactly once"), row.check
    assert row.units == 2000 and "get q/close/open" in row.description


def test_issue_28s_targets_read_a_get_and_a_reliable_get_against_memcacheds_get():
    def row(key: str, server: str, us: float) -> Row:
        return _row(key, server, us, unit="get")

    rows = [
        row("get-1k-c100-d1", "kestreld", 6.5),
        row("get-1k-c100-d1", "memcached", 6.0),
        row("reliable-get-1k-c100-d1", "kestreld", 8.0),
        row("reliable-get-1k-c100-d1", "memcached", 6.1),  # its plain get: not the reference
    ]
    by = {t.limit: t for t in evaluate(rows) if "memcached get" in t.limit}
    get, reliable = by["<= 1.1x memcached get"], by["<= 1.3x memcached get"]
    assert get.value == pytest.approx(6.5 / 6.0) and get.met
    assert reliable.value == pytest.approx(8.0 / 6.0) and reliable.met is False


def test_a_server_cpu_that_read_zero_gives_no_ratio_and_no_error():
    rows = [_row("set-1k-c100-d1", "kestreld", 6.5), _row("set-1k-c100-d1", "memcached", 0.0)]
    set_target = evaluate(rows)[0]
    assert set_target.value is None and set_target.figure == "-"


def test_profile_summary_shares_of_self_and_total(tmp_path):
    raw = tmp_path / "p.txt"
    raw.write_text("main (a.py:1);loop (b.py:2);flush (c.py:3) 3\nmain (a.py:1);loop (b.py:9) 1\n")
    text = instrument("profiling").summarize(raw)
    assert "75.0%  flush (c.py)" in text
    assert "100.0%  loop (b.py)" in text


def test_repeated_runs_report_medians_and_ranges():
    from kestreld.bench.workloads import Row, median_rows

    def row(us: float, p99: float) -> Row:
        return Row("set-1k-c100-d1", "set", "kestreld", "set", 100, 100, 1.0, 100.0, 1.0,
                   p99, 9.0, 1.0, us, 0.5, 10.0, 0.1, 1.0, 0.1, 1.0, "1 1 1",
                   "-", 0, [])  # fmt: skip

    (merged,) = median_rows([row(30, 5), row(50, 9), row(40, 7)])
    assert merged.runs == 3 and merged.server_us == 40 and merged.p99_ms == 7
    assert merged.server_us_range == (30, 50) and merged.p99_range == (5, 9)


@pytest.mark.parametrize("workload", ["put-many", "get-drain", "flood"])
def test_two_instances_share_the_load_and_every_item_arrives_once(workload, tmp_path):
    spec = dataclasses.replace(SMALL[workload], seconds=1.0, size=64, instances=2)
    row = measure(spec, "kestreld", workdir=str(tmp_path))
    assert row is not None and row.instances == 2
    assert row.errors == 0, row.error_samples
    assert row.key.endswith("-i2") and "2 instances" in row.description
    if workload != "put-many":
        assert row.check.startswith("exactly once"), row.check


def test_the_instances_command_reports_each_count(tmp_path, capsys):
    code = instrument("instances").main(
        [ "--max", "2", "--only", "set", "-c", "2", "-n", "1000", "--seconds", "0.5",
         "--workdir", str(tmp_path), "--markdown"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith("| set |")]
    assert [row.split("|")[2].strip() for row in rows] == ["1", "2"]


def test_every_import_in_the_bench_package_resolves():
    """Imports inside functions too: the harness runs as a package, not with scripts/ on the path."""
    import ast
    import importlib.util
    from pathlib import Path

    import kestreld.bench

    for path in Path(kestreld.bench.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                assert importlib.util.find_spec(name) is not None, f"{path.name}: import {name}"


# --- Darner, the C++ peer (optional: CI has no Darner) ------------------------------------------


def test_darner_runs_kestrelds_queue_workloads_without_kestrelds_config():
    from kestreld.bench.workloads import plan

    reliable_drain = dataclasses.replace(SMALL["get-drain"], reliable=True)
    for spec in (SMALL["put-many"], SMALL["get-drain"], reliable_drain, SMALL["flood"]):
        k, d = plan(spec, "kestreld"), plan(spec, "darner")
        assert d is not None and k is not None and d.config == ""
        assert [(r.name, r.kind, r.queue) for r in d.roles] == [
            (r.name, r.kind, r.queue) for r in k.roles
        ]
    assert plan(SMALL["fanout"], "darner") is None  # no fanout queues in Darner
    assert plan(Spec("put-many", sync_journal=0), "darner") is None  # /sync is per request


def test_darner_path_is_none_for_a_missing_binary(tmp_path, monkeypatch):
    from kestreld.bench.servers import darner_path

    monkeypatch.delenv("DARNER_BIN", raising=False)
    assert darner_path(None) is None
    assert darner_path(str(tmp_path / "darner")) is None
    not_executable = tmp_path / "darner"
    not_executable.write_text("")
    assert darner_path(str(not_executable)) is None
    monkeypatch.setenv("DARNER_BIN", str(tmp_path / "nowhere"))
    assert darner_path(None) is None


@pytest.mark.skipif(memcached_path() is None, reason="memcached is not installed")
def test_compare_without_a_darner_binary_reports_it_and_measures_the_others(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.delenv("DARNER_BIN", raising=False)
    missing = str(tmp_path / "no-darner")
    code = bench_cli.main(
        ["compare", "--quick", "--only", "^set-1k-c1-d1$", "--seconds", "0.3",
         "--workdir", str(tmp_path), "--darner", missing, "--markdown"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    assert f"no Darner binary at {missing!r}: measured without Darner" in err
    assert "on kestreld" in err and "on memcached" in err and "on darner" not in err
    assert "| set 1 KiB, 1 conn |" in out and "Darner us/op" not in out


def test_the_three_way_table_and_the_darner_targets():
    from kestreld.bench.report import darner_table

    row = _row

    rows = [
        row("set-1k-c100-d1", "kestreld", 6.0),
        row("set-1k-c100-d1", "darner", 8.0),
        row("set-1k-c100-d1", "memcached", 5.0),
        row("set-sync0-1k-c100-d1", "kestreld", 9.0),  # no Darner row: not in the table
    ]
    table = darner_table(rows).render(markdown=True).splitlines()
    assert len(table) == 3
    assert table[2].startswith("| set-1k-c100-d1 | 6.00 | 8.00 | 5.00 | 0.75x | 1.20x |")
    assert "| 10.0 / 10.0 / 10.0 |" in table[2]  # RSS of the three
    (target,) = [t for t in evaluate(rows) if "Darner" in t.limit]
    assert target.value == 0.75 and target.met


@pytest.mark.peer
@pytest.mark.skipif(
    __import__("kestreld.bench.servers", fromlist=["darner_path"]).darner_path() is None,
    reason="no Darner binary (set DARNER_BIN)",
)
@pytest.mark.parametrize("workload", ["put-many", "get-drain", "reliable-get", "flood"])
def test_darner_side_delivers_every_item_once(workload, tmp_path):
    from kestreld.bench.servers import darner_path

    if workload == "reliable-get":
        spec = dataclasses.replace(SMALL["get-drain"], reliable=True, seconds=1.0, size=1024)
    else:
        spec = dataclasses.replace(SMALL[workload], seconds=1.0, size=1024)
    row = measure(spec, "darner", workdir=str(tmp_path), darner=darner_path())
    assert row is not None and row.server == "darner"
    assert row.errors == 0, row.error_samples
    if workload != "put-many":
        assert row.check.startswith("exactly once"), row.check


def test_darner_suite_prints_every_scenario_of_darners_table(tmp_path, capsys):
    argv = ["darner-suite", "--scale", "0.005", "--connections", "1,10", "--workdir", str(tmp_path)]
    assert bench_cli.main(argv) == 0
    out = capsys.readouterr().out
    for scenario in ("flood, 64 B, 1 / 10", "packing", "fairness", "after growing to and draining",
                     "items queued", "hang up mid-request"):  # fmt: skip
        assert scenario in out
    assert "alive" in out and "DEAD" not in out
    assert "longest event-loop hold" in out and " ms" in out  # kestreld's loop_hold_max_us


def test_queues_prints_what_idle_queues_cost(tmp_path, capsys):
    argv = ["queues", "20", "--idle-seconds", "0.5", "--workdir", str(tmp_path), "--markdown"]
    assert bench_cli.main(argv) == 0
    row = capsys.readouterr().out.splitlines()[-1].strip("| ").split(" | ")
    assert row[0] == "20" and row[1].endswith("MiB") and int(row[2].replace(",", "")) > 20
