"""The pipeline over journals written by a real kestreld under a scripted pymemcache workload."""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest
from pipeline_fixtures import pymemcache_items, spark_fixture  # noqa: F401 - the spark fixture

from kestreld.pipeline import analyze

pytestmark = pytest.mark.spark


def server_config(archive, *, audit: bool = True) -> str:
    """Small segments, an archive, frequent checkpoints; ``jobs+audit`` a fanout reader."""
    lines = [
        'max_journal_size = "4KiB"',
        f'archive_path = "{archive}"',
        'checkpoint_interval = "100ms"',
    ]
    if audit:
        lines.append('[queues."jobs+audit"]')
    return "\n".join(lines) + "\n"


def table(out, name: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(out / f"{name}.parquet").to_pylist()


def test_analyze_reports_what_the_server_journaled(spark, make_server, tmp_path) -> None:
    archive = tmp_path / "archive"
    srv = make_server(server_config(archive))
    client = srv.client()
    jobs = list(pymemcache_items(120, "job"))
    mail = list(pymemcache_items(150, "mail"))
    for data in jobs:
        assert client.set("jobs", data, noreply=False)
    for data in mail:
        assert client.set("mail", data, noreply=False)
    assert [client.get("jobs") for _ in range(50)] == jobs[:50]  # the default reader only
    assert [client.get("mail") for _ in range(150)] == mail
    time.sleep(0.5)  # a checkpoint interval or two: dead mail segments go to the archive
    client.close()
    assert srv.stop() == 0
    assert any(archive.iterdir()), "the server archived no segment"

    out = tmp_path / "out"
    assert analyze.main([str(srv.queue_path), "--archive", str(archive), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["problems"] == []
    assert summary["id_gaps"] == 0
    assert {q: (v["items"], v["bytes"]) for q, v in summary["queues"].items()} == {
        "jobs": (120, sum(map(len, jobs))),
        "mail": (150, sum(map(len, mail))),
    }
    lag = {(r["queue"], r["reader"]): r for r in table(out, "consumer_lag")}
    assert sorted(lag) == [("jobs", ""), ("jobs", "audit"), ("mail", "")]
    assert (lag["jobs", ""]["head"], lag["jobs", ""]["unread_items"]) == (50, 70)
    assert lag["jobs", ""]["unread_bytes"] == sum(map(len, jobs[50:]))
    assert (lag["jobs", "audit"]["unread_items"], lag["jobs", "audit"]["unread_bytes"]) == (
        120,
        sum(map(len, jobs)),
    )
    assert (lag["mail", ""]["head"], lag["mail", ""]["unread_items"]) == (150, 0)
    assert lag["mail", ""]["oldest_unread_age_ms"] is None
    assert sum(r["items"] for r in table(out, "per_minute")) == 270
    assert table(out, "error_counts") == [
        {"queue": "jobs", "error_count": 0, "items": 120},
        {"queue": "mail", "error_count": 0, "items": 150},
    ]


def test_data_source_reads_the_server_folder_item_for_item(spark, make_server, tmp_path) -> None:
    srv = make_server('max_journal_size = "4KiB"\n')
    client = srv.client()
    sent = list(pymemcache_items(200, "x"))
    for data in sent:
        assert client.set("jobs", data, noreply=False)
    client.close()
    df = spark.read.format("kestrel_journal").load(str(srv.queue_path))  # server still running
    puts = df.filter("op = 'PUT'").orderBy("id").collect()
    assert [bytes(r["data"]) for r in puts] == sent
    assert [r["id"] for r in puts] == list(range(1, 201))
    assert len({r["segment"] for r in puts}) > 1  # rotated at 4 KiB
    assert df.filter("op = 'PROBLEM'").count() == 0
    srv.stop()


def test_stream_follows_a_server_taking_sets_exactly_once(spark, make_server, tmp_path) -> None:
    archive, out, ck = tmp_path / "archive", tmp_path / "out", tmp_path / "ck"
    srv = make_server(server_config(archive, audit=False))
    payloads = list(pymemcache_items(1500, "s"))
    chunks = [payloads[i : i + 300] for i in range(0, len(payloads), 300)]

    def start():
        return (
            spark.readStream.format("kestrel_journal")
            .option("archivePath", str(archive))
            .load(str(srv.queue_path))
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(ck))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    def rows_in(query) -> int:
        return sum(p["numInputRows"] for p in query.recentProgress)

    client = srv.client()
    query = start()
    try:
        for n, chunk in enumerate(chunks):
            if n == 3:
                query = start()  # restarted from its checkpoint while the server kept taking sets
            before = rows_in(query)
            for data in chunk:
                assert client.set("jobs", data, noreply=False)
            # The default reader consumes as it goes: dead segments move to the archive.
            for _ in range(250):
                assert client.get("jobs") is not None
            if n == 2:
                query.stop()  # stopped mid-workload
                continue
            deadline = time.monotonic() + 120
            while rows_in(query) == before:  # the running stream picks up this chunk's sets
                assert time.monotonic() < deadline, "the stream did not follow the server"
                time.sleep(0.05)
        deadline = time.monotonic() + 10
        while not (archive.exists() and any(archive.iterdir())):
            assert time.monotonic() < deadline, "the server archived no segment"
            time.sleep(0.1)
        query.processAllAvailable()
    finally:
        query.stop()
        client.close()
        srv.stop()
    rows = spark.read.parquet(str(out)).select("op", "id", "data").collect()
    assert {r["op"] for r in rows} == {"PUT"}
    assert Counter(r["id"] for r in rows) == Counter(range(1, len(payloads) + 1))
    assert sorted(bytes(r["data"]) for r in rows) == sorted(payloads)
