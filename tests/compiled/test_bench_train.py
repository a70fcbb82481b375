"""The profile-guided build's training run (scripts/build/pgo_train.py) against a real server.

setup.py compiles the extensions from what this run counts; a workload that stopped
matching the server would make the build fall back to a plain compile, so every
workload is run here and checks its replies.
"""

from __future__ import annotations

import os
import subprocess
import sys

from kestreld_process import Conn, KestreldProcess
from lab import BUILD, build_step

from kestreld import compiled

train = build_step("pgo_train")


def test_every_training_workload_runs_against_a_real_server_and_drains_its_queues(tmp_path):
    with KestreldProcess(tmp_path / "queues", train.CONFIG) as srv:
        train.one_connection(srv, 200)
        train.open_close_loop(srv, 50, waiting=True)
        train.open_close_loop(srv, 50, waiting=False)
        train.many_connections(srv, 10, 5)
        train.fanout_and_read_behind(srv, 40)
        stats = Conn(srv.connect()).stats()
    queues = ("one", "loop", "many", "manyloop", "fan", "fan+a", "fan+b", "behind")
    for queue in queues:
        assert stats[f"queue_{queue}_items"] == "0", queue
        assert stats[f"queue_{queue}_open_transactions"] == "0", queue
    assert int(stats["queue_behind_total_items"]) == 40


def test_the_training_run_says_when_the_compiled_modules_do_not_run():
    env = dict(os.environ)
    out = subprocess.run(
        [sys.executable, str(BUILD / "pgo_train.py")],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    if compiled.extensions_disabled() or compiled.implementation() != "compiled":
        assert out.returncode == 2, out.stderr
        assert "not the ones that run" in out.stderr
    else:
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("kestreld train: done in ")
