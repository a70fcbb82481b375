"""``workers = 2``: the admin port (worker 0's) shows the box, scraped over HTTP; the box's
connection limit and open-file limit."""

from __future__ import annotations

import json
import os
import signal
import socket

import pytest
from kestreld_process import Conn, KestreldProcess
from metrics_scrape import METRICS_CONFIG, fetch, metrics_url, scrape, value
from worker_box import owned_by, until

WORKERS = 2


@pytest.fixture
def names() -> tuple[str, str]:
    """Two queues: the first owned by worker 0, the second by worker 1."""
    return owned_by(0, "jobs"), owned_by(1, "jobs")


@pytest.fixture
def box(make_server, names) -> KestreldProcess:
    """A box with its admin port, 3 items in worker 0's queue and 5 in worker 1's."""
    server = make_server(METRICS_CONFIG, args=["--workers", str(WORKERS)])
    conn = Conn(server.connect())
    for _ in range(3):
        assert conn.set(names[0], b"a") == b"STORED"
    for _ in range(5):
        assert conn.set(names[1], b"bb") == b"STORED"
    conn.close()
    return server


def _json(server: KestreldProcess, path: str) -> dict:
    status, _, body = fetch(metrics_url(server, path))
    assert status == 200
    return json.loads(body)


def test_metrics_show_each_queue_once_with_its_owners_figures(box, names):
    samples = scrape(box)
    items = samples["kestreld_queue_items"]
    assert items[(("queue", names[0]),)] == 3
    assert items[(("queue", names[1]),)] == 5
    assert len(items) == 2  # once each, from its owner


def test_metrics_totals_are_the_sum_over_the_workers(box):
    samples = scrape(box)
    assert value(samples, "kestreld_items") == 8
    assert value(samples, "kestreld_bytes") == 3 + 10
    assert value(samples, "kestreld_cmd_set_total") == 8
    assert value(samples, "kestreld_queue_creates_total") == 2


def test_metrics_latency_histograms_merge_every_workers_observations(box, names):
    samples = scrape(box)
    assert value(samples, "kestreld_request_latency_seconds_count", op="set") == 8
    per_queue = samples["kestreld_queue_set_latency_seconds_count"]
    assert per_queue[(("queue", names[0]), ("reader", ""))] == 3
    assert per_queue[(("queue", names[1]), ("reader", ""))] == 5


def test_metrics_say_every_worker_answered(box):
    samples = scrape(box)
    assert value(samples, "kestreld_workers") == WORKERS
    assert value(samples, "kestreld_workers_answering") == WORKERS


def test_metrics_count_clients_not_the_workers_channels(box, names):
    conn = Conn(box.connect())
    assert [conn.get(name) for name in names] == [b"a", b"bb"]  # one of them crossed
    assert value(scrape(box), "kestreld_connections") == 1


def test_process_figures_are_labelled_per_worker(box):
    samples = scrape(box)
    memory = samples["process_resident_memory_bytes"]
    assert sorted(dict(labels)["worker"] for labels in memory) == ["0", "1"]
    assert all(v > 0 for v in memory.values())


def test_stats_json_shows_the_box(box, names):
    doc = _json(box, "/stats.json")
    assert doc["gauges"]["items"] == 8
    assert doc["gauges"][f"q/{names[0]}/items"] == 3
    assert doc["gauges"][f"q/{names[1]}/items"] == 5
    assert doc["counters"]["cmd_set"] == 8
    assert doc["counters"][f"q/{names[1]}/put_items"] == 5
    assert doc["gauges"]["workers_answering"] == WORKERS
    assert doc["metrics"]["set_latency_usec"]["count"] == 8


def test_the_live_page_shows_the_queues_of_every_worker(box, names):
    doc = _json(box, "/admin/overview.json")
    rows = {row["name"]: row["items"] for row in doc["rows"]}
    assert rows == {names[0]: 3, names[1]: 5}
    assert doc["server"]["items"] == 8
    assert doc["server"]["workers_answering"] == WORKERS


def test_a_worker_that_does_not_answer_is_left_out_and_said_so(box, names):
    pid = box.worker_pids()[1]
    os.kill(pid, signal.SIGSTOP)  # its loop stops: it cannot answer in time
    try:
        samples = scrape(box)
        assert value(samples, "kestreld_workers_answering") == 1
        assert value(samples, "kestreld_items") == 3  # worker 0's queue only
    finally:
        os.kill(pid, signal.SIGCONT)
    samples = scrape(box)
    assert value(samples, "kestreld_workers_answering") == WORKERS
    assert value(samples, "kestreld_items") == 8


def test_max_connections_clients_each_using_both_workers_all_connect(make_server, names):
    limit = 6
    server = make_server(f"max_connections = {limit}\n", args=["--workers", str(WORKERS)])
    conns = [Conn(server.connect()) for _ in range(limit)]
    for i, conn in enumerate(conns):
        for name in names:  # one of the two crosses: a channel connection at its owner
            assert conn.set(name, f"{i}") == b"STORED"
    for conn in conns:
        assert [conn.get(name) is not None for name in names] == [True, True]
    assert conns[0].stats()["curr_connections"] == str(limit)


def test_the_open_file_limit_is_raised_and_logged_once_for_the_box(make_server):
    server = make_server(args=["--workers", str(WORKERS)])
    (event,) = server.events("open_file_limit")
    assert event["workers"] == WORKERS
    assert "worker" not in event  # the supervisor's, not a worker's


def test_each_worker_keeps_its_share_of_the_client_descriptors(make_server):
    above_any_share = "max_connections = 100000000\n"  # so the share is what is logged
    lone = make_server(above_any_share)
    box = make_server(above_any_share, args=["--workers", str(WORKERS)])
    (alone,) = lone.events("open_file_limit")
    (shared,) = box.events("open_file_limit")
    assert shared["connections_at_most"] == alone["connections_at_most"] // WORKERS
    assert shared["journals_open_at_most"] == alone["journals_open_at_most"]


def test_admin_shutdown_stops_every_worker(box):
    pids = box.worker_pids()
    status, _, _ = fetch(metrics_url(box, "/shutdown"))
    assert status == 200
    assert box.proc.wait(15) == 0
    assert len(box.events("worker_stopped")) == WORKERS
    assert not any(_alive(pid) for pid in pids.values())


def test_admin_reload_reloads_every_worker(box):
    status, _, _ = fetch(metrics_url(box, "/reload"))
    assert status == 200
    assert until(lambda: {e["worker"] for e in box.events("config_reloaded")} == {0, 1})


def test_a_taken_admin_port_stops_the_box_naming_it(make_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = make_server(f"metrics_port = {port}\n", args=["--workers", "2"], start=False)
        with pytest.raises(RuntimeError, match=f"127.0.0.1:{port} for metrics"):
            server.start()
    assert server.proc.returncode == 1


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
