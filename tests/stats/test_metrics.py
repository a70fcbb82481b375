"""The metrics endpoint: Prometheus ``/metrics`` and ``/flat_stats.json`` on ``metrics_port``.

Every test scrapes a real server over HTTP and parses the text with
``prometheus_client``'s own parser.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from kestreld_process import Conn, KestreldProcess
from metrics_scrape import METRICS_CONFIG, fetch, metrics_url, scrape, value
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from kestreld.stats.collector import GLOBAL_METRICS, PROCESS_DUPLICATES
from kestreld.stats.latency import LatencyHistogram


@pytest.fixture(scope="module")
def metrics_server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("metrics")
    proc = KestreldProcess(folder / "queues", METRICS_CONFIG)
    proc.start()
    yield proc
    proc.stop()


def test_metrics_are_prometheus_text_that_prometheus_client_parses(metrics_server):
    status, headers, body = fetch(metrics_url(metrics_server))
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    assert families["kestreld_items"].type == "gauge"
    assert families["kestreld_cmd_set"].type == "counter"
    assert families["kestreld_request_latency_seconds"].type == "histogram"
    assert families["kestreld_fsync_latency_seconds"].type == "histogram"
    assert families["kestreld_build_info"].samples[0].labels["version"]
    assert "process_resident_memory_bytes" in {s.name for f in families.values() for s in f.samples}


def test_global_figures_equal_the_stats_command(metrics_server):
    c = Conn(metrics_server.connect())
    for i in range(3):
        assert c.set("metrics_global", f"item{i}") == b"STORED"
    assert c.get("metrics_global") == b"item0"
    assert c.get("metrics_global_empty") is None
    samples = scrape(metrics_server)
    stats = c.stats()
    c.close()
    for key, metric in [
        ("curr_items", "kestreld_items"),
        ("bytes", "kestreld_bytes"),
        ("total_items", "kestreld_items_added_total"),
        ("cmd_get", "kestreld_cmd_get_total"),
        ("cmd_set", "kestreld_cmd_set_total"),
        ("get_hits", "kestreld_get_hits_total"),
        ("get_misses", "kestreld_get_misses_total"),
        ("queue_creates", "kestreld_queue_creates_total"),
        ("curr_connections", "kestreld_connections"),
    ]:
        assert value(samples, metric) == float(stats[key]), key


def test_per_queue_figures_are_labelled_with_the_queue_name(metrics_server):
    c = Conn(metrics_server.connect())
    assert c.get("metrics_orders+audit") is None  # creates the fanout reader
    for i in range(4):
        assert c.set("metrics_orders", f"o{i}") == b"STORED"
    assert c.set("metrics_invoices", "i0") == b"STORED"
    assert c.get("metrics_orders+audit/open") == b"o0"
    samples = scrape(metrics_server)
    stats = c.stats()
    c.close()
    assert value(samples, "kestreld_queue_items", queue="metrics_orders") == 4
    assert value(samples, "kestreld_queue_items", queue="metrics_invoices") == 1
    # the reader has its own families and labels: summing queue items counts each once
    audit = {"queue": "metrics_orders", "reader": "audit"}
    assert value(samples, "kestreld_reader_items", **audit) == 3
    assert value(samples, "kestreld_reader_open_transactions", **audit) == 1
    assert value(samples, "kestreld_reader_items_added_total", **audit) == 4
    assert not any("+" in dict(labels).get("queue", "") for f in samples.values() for labels in f)
    queue_items = {
        dict(labels)["queue"]: v for labels, v in samples["kestreld_queue_items"].items()
    }
    assert queue_items["metrics_orders"] == 4 and "metrics_orders+audit" not in queue_items
    assert value(samples, "kestreld_queue_children", queue="metrics_orders") == 1
    assert value(samples, "kestreld_queue_items_added_total", queue="metrics_orders") == 4
    assert value(samples, "kestreld_queue_journal_bytes", queue="metrics_orders") == float(
        stats["queue_metrics_orders_logsize"]
    )
    assert value(samples, "kestreld_queue_bytes", queue="metrics_orders") == float(
        stats["queue_metrics_orders_bytes"]
    )


def test_every_stats_key_has_a_metric(metrics_server):
    c = Conn(metrics_server.connect())
    assert c.set("metrics_every", "x") == b"STORED"
    stats = c.stats()
    c.close()
    samples = scrape(metrics_server)
    per_queue = [k for k in stats if k.startswith("queue_metrics_every_")]
    labelled = [name for name, values in samples.items() if (("queue", "metrics_every"),) in values]
    assert len(labelled) == len(per_queue) == 18
    for key in stats:
        if key.startswith("queue_") and key not in GLOBAL_METRICS:
            continue
        if key in PROCESS_DUPLICATES:  # the process collector has them
            assert f"kestreld_{key}_seconds" not in samples
            continue
        if key == "version":
            assert "kestreld_build_info" in samples
            continue
        if key == "status":  # a word: one labelled gauge per status
            assert samples["kestreld_status"][(("status", stats[key]),)] == 1.0
            continue
        spec = GLOBAL_METRICS[key]
        assert spec.name + ("_total" if spec.kind == "counter" else "") in samples, key


def test_no_series_duplicates_the_process_collector(metrics_server):
    samples = scrape(metrics_server)
    assert "process_start_time_seconds" in samples
    assert "kestreld_uptime_seconds" not in samples and "kestreld_time_seconds" not in samples
    assert PROCESS_DUPLICATES == {"uptime", "time"}


def test_the_oldest_item_age_keeps_growing_while_nobody_consumes(make_server):
    proc = make_server(METRICS_CONFIG)
    c = Conn(proc.connect())
    assert c.get("aging+audit") is None  # a fanout reader
    assert c.set("aging", "first") == b"STORED"
    assert c.set("aging", "second") == b"STORED"
    assert c.get("aging") == b"first"  # the queue's own reader consumed one
    time.sleep(1.2)
    first = scrape(proc)
    time.sleep(1.0)
    second = scrape(proc)
    stats = c.stats()
    c.close()
    queue, reader = {"queue": "aging"}, {"queue": "aging", "reader": "audit"}
    frozen = value(first, "kestreld_queue_age_seconds", **queue)
    assert frozen == value(second, "kestreld_queue_age_seconds", **queue)  # the old figure
    grew = value(second, "kestreld_queue_oldest_item_age_seconds", **queue) - value(
        first, "kestreld_queue_oldest_item_age_seconds", **queue
    )
    assert 0.7 < grew < 3.0
    assert value(first, "kestreld_queue_oldest_item_age_seconds", **queue) >= 1.0
    assert value(second, "kestreld_reader_oldest_item_age_seconds", **reader) >= 2.0
    assert int(stats["queue_aging_oldest_item_age"]) >= 2000  # the stats command says it too
    assert int(stats["queue_aging+audit_oldest_item_age"]) >= 2000


def test_the_oldest_item_age_is_0_for_an_empty_queue_and_survives_a_restart(make_server):
    proc = make_server(METRICS_CONFIG)
    c = Conn(proc.connect())
    assert c.set("ages", "x") == b"STORED"
    assert c.get("ages") == b"x"
    assert c.set("kept", "y") == b"STORED"
    c.close()
    samples = scrape(proc)
    assert value(samples, "kestreld_queue_oldest_item_age_seconds", queue="ages") == 0
    time.sleep(1.1)
    proc.restart()
    samples = scrape(proc)  # the head item is on disk after the restart: still counted
    assert value(samples, "kestreld_queue_oldest_item_age_seconds", queue="kept") >= 1.0


def test_latency_histograms_count_sets_hits_and_timeouts(make_server):
    proc = make_server(METRICS_CONFIG)
    c = Conn(proc.connect())
    for i in range(5):
        assert c.set("lat", f"v{i}") == b"STORED"
    assert c.get("lat") == b"v0"
    assert c.get("lat/t=1000") == b"v1"
    assert c.get("lat_empty/t=50") is None
    samples = scrape(proc)
    c.close()
    assert value(samples, "kestreld_request_latency_seconds_count", op="set") == 5
    assert value(samples, "kestreld_request_latency_seconds_count", op="get_hit") == 2
    assert value(samples, "kestreld_request_latency_seconds_count", op="get_timeout") == 1
    # the timed-out get waited its 50 ms
    assert value(samples, "kestreld_request_latency_seconds_sum", op="get_timeout") >= 0.04
    assert (
        value(samples, "kestreld_request_latency_seconds_bucket", op="get_timeout", le="0.025") == 0
    )
    assert (
        value(samples, "kestreld_request_latency_seconds_bucket", op="get_timeout", le="+Inf") == 1
    )


def test_blocking_get_latency_is_the_wait_for_the_item(make_server):
    proc = make_server(METRICS_CONFIG)
    waiter = Conn(proc.connect())
    waiter.send("get later/t=5000\r\n")
    threading.Event().wait(0.3)
    producer = Conn(proc.connect())
    assert producer.set("later", "x") == b"STORED"
    assert waiter.read_value() == b"x"
    samples = scrape(proc)
    assert 0.2 <= value(samples, "kestreld_request_latency_seconds_sum", op="get_hit") < 5
    waiter.close()
    producer.close()


def test_fsync_histogram_counts_group_commits_with_sync_journal_0(make_server):
    proc = make_server(METRICS_CONFIG + "sync_journal = 0\n")
    c = Conn(proc.connect())
    for i in range(3):
        assert c.set("synced", f"v{i}") == b"STORED"
    samples = scrape(proc)
    c.close()
    fsyncs = value(samples, "kestreld_fsync_latency_seconds_count")
    assert fsyncs >= 3  # one STORED at a time: each waited for its own fsync
    assert value(samples, "kestreld_fsync_latency_seconds_bucket", le="+Inf") == fsyncs
    assert value(samples, "kestreld_fsync_latency_seconds_sum") > 0


def test_status_is_exported_as_one_gauge_per_status(metrics_server):
    c = Conn(metrics_server.connect())
    samples = scrape(metrics_server)
    assert value(samples, "kestreld_status", status="UP") == 1
    assert value(samples, "kestreld_status", status="QUIESCENT") == 0
    c.send("status readonly\r\n")
    assert c.line() == b"END"
    try:
        samples = scrape(metrics_server)
        assert value(samples, "kestreld_status", status="READONLY") == 1
        assert value(samples, "kestreld_status", status="UP") == 0
    finally:
        c.send("status up\r\n")
        assert c.line() == b"END"
        c.close()


def test_flat_stats_json_holds_the_stats_figures_as_numbers(metrics_server):
    # The flat document that was /stats.json (that path now has ostrich's shape).
    c = Conn(metrics_server.connect())
    assert c.set("metrics_json", "hello") == b"STORED"
    status, headers, body = fetch(metrics_url(metrics_server, "/flat_stats.json"))
    stats = c.stats()
    c.close()
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    doc = json.loads(body)
    assert doc["version"] == stats["version"]
    assert doc["status"] == "UP"
    assert doc["cmd_set"] == int(stats["cmd_set"])
    assert isinstance(doc["reserved_memory_ratio"], float)
    assert doc["queues"]["metrics_json"]["items"] == 1
    assert doc["queues"]["metrics_json"]["bytes"] == 5
    assert set(doc) - {"status", "queues"} == {
        k for k in stats if not k.startswith("queue_metrics_") and k != "status"
    }


def test_openmetrics_is_served_when_asked_for(metrics_server):
    status, headers, body = fetch(
        metrics_url(metrics_server), {"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert status == 200
    assert headers["Content-Type"].startswith("application/openmetrics-text")
    names = {f.name for f in openmetrics_families(body.decode())}
    assert {"kestreld_items", "kestreld_request_latency_seconds", "kestreld_status"} <= names


def test_metrics_are_gzipped_for_a_scraper_that_accepts_gzip(metrics_server):
    status, headers, body = fetch(metrics_url(metrics_server), {"Accept-Encoding": "gzip"})
    assert status == 200
    assert headers["Content-Encoding"] == "gzip"
    assert b"kestreld_items" in gzip.decompress(body)


def test_unknown_path_is_404_and_other_methods_405(metrics_server):
    assert fetch(metrics_url(metrics_server, "/nope"))[0] == 404
    request = urllib.request.Request(metrics_url(metrics_server), data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(request, timeout=10)
    assert e.value.code == 405


def test_a_client_that_sends_nothing_does_not_block_scrapes(metrics_server):
    url = metrics_url(metrics_server)
    host, port = url.split("/")[2].split(":")
    silent = socket.create_connection((host, int(port)), timeout=5)
    try:
        assert scrape(metrics_server)["kestreld_items"]
    finally:
        silent.close()


def test_scrapes_during_load_all_succeed_and_clients_are_served(metrics_server):
    errors: list[BaseException] = []
    stop = threading.Event()

    scrapes = []

    def scraper() -> None:
        try:
            while not stop.is_set() and len(scrapes) < 200:
                scrapes.append(scrape(metrics_server))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=scraper) for _ in range(2)]
    for t in threads:
        t.start()
    c = Conn(metrics_server.connect())
    try:
        for i in range(300):
            assert c.set("metrics_load", f"{i}") == b"STORED"
        for i in range(300):
            assert c.get("metrics_load") == f"{i}".encode()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        c.close()
    assert not errors
    assert scrapes


def test_metrics_are_off_unless_metrics_port_is_set(make_server):
    proc = make_server()
    assert proc.events("metrics_listening") == []


def test_metrics_address_chooses_the_interface(make_server):
    proc = make_server('metrics_port = 0\nmetrics_address = "127.0.0.2"\n')
    assert proc.events("metrics_listening")[0]["address"].startswith("127.0.0.2:")
    assert "kestreld_items" in scrape(proc)


def test_metrics_port_closes_on_shutdown(make_server):
    proc = make_server(METRICS_CONFIG)
    url = metrics_url(proc)
    assert proc.stop() == 0
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(url, timeout=5)


def test_histogram_buckets_are_upper_bounds_inclusive():
    h = LatencyHistogram()
    for seconds in (0.00005, 0.00006, 0.001, 100.0):
        h.observe(seconds)
    buckets = dict(h.cumulative())
    assert buckets["5e-05"] == 1
    assert buckets["0.0001"] == 2
    assert buckets["0.001"] == 3
    assert buckets["60.0"] == 3
    assert buckets["+Inf"] == 4
    assert h.total == pytest.approx(100.00111)


def test_a_taken_metrics_port_stops_start_up_naming_it(make_server):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = make_server(f"metrics_port = {port}\n", start=False)
        with pytest.raises(RuntimeError) as e:
            proc.start()
    assert proc.proc.returncode == 1
    assert f"127.0.0.1:{port} for metrics" in str(e.value)
