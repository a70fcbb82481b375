"""``kestreld analyze``: every output of pipeline.md, with exact numbers for a scripted workload."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from pipeline_fixtures import (  # noqa: F401 - spark_fixture provides `spark`
    BASE_MS,
    Item,
    record_offsets,
    spark_fixture,
    write_checkpoint,
    write_segment,
)

from kestreld.pipeline import analyze
from kestreld.pipeline.analyze import iso_ms, parse_time

pytestmark = pytest.mark.spark

S = 1000
UNTIL = BASE_MS + 10 * 60 * S  # lag ages are measured at --until

JOBS_1 = [
    Item(1, BASE_MS + 100, b"a" * 10),
    Item(2, BASE_MS + 200, b"b" * 20, expire_time=BASE_MS + 200 + 60 * S, error_count=1),
    Item(3, BASE_MS + 300, b"c" * 30),
    Item(4, BASE_MS + 1500, b"d" * 40, expire_time=BASE_MS + 1500 + 30 * S, error_count=2),
    Item(5, BASE_MS + 61 * S, b"e" * 100),
    Item(6, BASE_MS + 61500, b"f" * 300, expire_time=BASE_MS + 61500 + 10 * S),
]
JOBS_2 = [  # ids 7 and 8 are missing
    Item(9, BASE_MS + 125 * S, b"g" * 5, error_count=1),
    Item(10, BASE_MS + 125200, b"h" * 5),
]
MAIL = [
    Item(1, BASE_MS + 10 * S, b"i" * 7),
    Item(2, BASE_MS + 10500, b"j" * 8),
    Item(3, BASE_MS + 70 * S, b"k" * 9),
]
CORRUPT = b"\x86\xff\xff\xff\x7f" + bytes(20)  # a whole header declaring 2 GiB


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    """Two queues, two readers on jobs (one behind), none on mail, a corrupt tail."""
    folder = tmp_path_factory.mktemp("analyze") / "queues"
    write_segment(folder, "jobs", 1000, JOBS_1)
    write_segment(folder, "jobs", 2000, JOBS_2)
    write_segment(folder, "mail", 1500, MAIL, tail=CORRUPT)
    write_checkpoint(folder, "jobs", "", 3, [5])
    write_checkpoint(folder, "jobs", "audit", 0)
    (folder / "jobs.read.~~99").write_bytes(b"ignored temporary")
    return folder


@pytest.fixture(scope="module")
def report(spark, workload, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    assert analyze.main([str(workload), "--out", str(out), "--until", iso_ms(UNTIL)]) == 0
    return out


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def table(report: Path, name: str) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(report / f"{name}.parquet").to_pylist()


def test_every_output_file_is_written(report) -> None:
    names = {p.name for p in report.iterdir()}
    for name in ("per_minute", "consumer_lag", "error_counts", "id_gaps"):
        assert f"{name}.parquet" in names and f"{name}.csv" in names
    assert {"summary.json", "throughput.png", "sizes.png", "lag.png"} <= names


def test_charts_are_png_of_at_least_800_by_500(report) -> None:
    import struct

    for name in ("throughput.png", "sizes.png", "lag.png"):
        head = (report / name).read_bytes()[:24]
        assert head[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", head[16:24])
        assert width >= 800 and height >= 500


def test_per_minute_counts_sizes_peaks_and_ttl(report) -> None:
    rows = table(report, "per_minute")
    assert [tuple(r.values())[:5] for r in rows] == [
        ("jobs", "2026-11-21T14:05:00Z", 4, 100, 25.0),
        ("jobs", "2026-11-21T14:06:00Z", 2, 400, 200.0),
        ("jobs", "2026-11-21T14:07:00Z", 2, 10, 5.0),
        ("mail", "2026-11-21T14:05:00Z", 2, 15, 7.5),
        ("mail", "2026-11-21T14:06:00Z", 1, 9, 9.0),
    ]
    assert [r["size_p99"] for r in rows] == pytest.approx([39.7, 298.0, 5.0, 7.99, 9.0])
    assert [r["peak_items_per_s"] for r in rows] == [3, 2, 2, 2, 1]
    assert [r["ttl_p50_ms"] for r in rows] == [45000.0, 10000.0, None, None, None]
    assert list(rows[0]) == [
        "queue", "minute", "items", "bytes", "size_p50", "size_p99", "peak_items_per_s", "ttl_p50_ms",
    ]  # fmt: skip


def test_consumer_lag_from_checkpoints(report) -> None:
    assert table(report, "consumer_lag") == [
        # head 3, done {5}: 4, 6, 9, 10 unread; oldest is 4 (added at +1.5 s)
        {"queue": "jobs", "reader": "", "head": 3, "unread_items": 4, "unread_bytes": 350,
         "oldest_unread_age_ms": UNTIL - (BASE_MS + 1500)},
        {"queue": "jobs", "reader": "audit", "head": 0, "unread_items": 8, "unread_bytes": 510,
         "oldest_unread_age_ms": UNTIL - (BASE_MS + 100)},
        # no checkpoint at all: the implied default reader has read nothing
        {"queue": "mail", "reader": "", "head": 0, "unread_items": 3, "unread_bytes": 24,
         "oldest_unread_age_ms": UNTIL - (BASE_MS + 10 * S)},
    ]  # fmt: skip


def test_error_counts_and_id_gaps(report) -> None:
    assert table(report, "error_counts") == [
        {"queue": "jobs", "error_count": 0, "items": 5},
        {"queue": "jobs", "error_count": 1, "items": 2},
        {"queue": "jobs", "error_count": 2, "items": 1},
        {"queue": "mail", "error_count": 0, "items": 3},
    ]
    assert table(report, "id_gaps") == [
        {"queue": "jobs", "after_id": 6, "before_id": 9, "missing": 2}
    ]


def test_csv_files_match_the_parquet_tables(report) -> None:
    for name in ("per_minute", "consumer_lag", "error_counts", "id_gaps"):
        rows = read_csv(report / f"{name}.csv")
        parquet = table(report, name)
        assert len(rows) == len(parquet)
        for got, want in zip(rows, parquet, strict=True):
            assert list(got) == list(want)
            for key, value in want.items():
                if value is None or value == "":
                    assert got[key] == ""
                elif isinstance(value, float):
                    assert float(got[key]) == pytest.approx(value)
                else:
                    assert got[key] == str(value)


def test_summary_totals_readers_gaps_and_problems(report, workload) -> None:
    summary = json.loads((report / "summary.json").read_text())
    assert summary["source"] == str(workload)
    assert summary["generated_at"].endswith("Z")
    assert summary["id_gaps"] == 1
    jobs, mail = summary["queues"]["jobs"], summary["queues"]["mail"]
    assert (jobs["items"], jobs["bytes"]) == (8, 510)
    assert (jobs["first_add"], jobs["last_add"]) == (
        iso_ms(BASE_MS + 100),
        iso_ms(BASE_MS + 125200),
    )
    assert jobs["readers"][""]["unread_items"] == 4
    assert jobs["readers"]["audit"]["unread_bytes"] == 510
    assert (mail["items"], mail["bytes"], list(mail["readers"])) == (3, 24, [""])
    offset = record_offsets(MAIL + [Item(9, 0, b"")])[-1]
    assert summary["problems"] == [
        {
            "path": str(workload / "mail.1500"),
            "offset": offset,
            "queue": "mail",
            "problem": f"corrupt record at offset {offset}: item too large (2147483647 bytes)",
        }
    ]


def test_since_and_until_keep_items_added_in_between(spark, workload, tmp_path) -> None:
    since, until = BASE_MS + 60 * S, BASE_MS + 125 * S
    assert (
        analyze.main(
            [str(workload), "--out", str(tmp_path), "--since", str(since), "--until", iso_ms(until)]
        )
        == 0
    )
    minutes = [(r["queue"], r["minute"], r["items"]) for r in table(tmp_path, "per_minute")]
    assert minutes == [("jobs", "2026-11-21T14:06:00Z", 2), ("mail", "2026-11-21T14:06:00Z", 1)]
    assert table(tmp_path, "id_gaps") == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["queues"]["jobs"]["items"] == 2
    # lag describes the readers now, over every item, measured at --until
    lag = table(tmp_path, "consumer_lag")
    assert [r["unread_items"] for r in lag] == [4, 8, 3]
    assert lag[0]["oldest_unread_age_ms"] == until - (BASE_MS + 1500)


def test_time_bounds_accept_iso_and_epoch_ms() -> None:
    assert parse_time("2026-11-21T14:05:00Z") == BASE_MS
    assert parse_time("2026-11-21T14:05:00") == BASE_MS
    assert parse_time("2026-11-21T15:05:00+01:00") == BASE_MS
    assert parse_time(str(BASE_MS)) == BASE_MS
    assert parse_time(str(BASE_MS // 1000)) == BASE_MS
    assert iso_ms(BASE_MS + 7) == "2026-11-21T14:05:00.007Z"


def test_missing_source_is_a_usage_error(tmp_path, capsys) -> None:
    assert analyze.main([str(tmp_path / "nope"), "--out", str(tmp_path / "out")]) == 2
    assert "no such file or folder" in capsys.readouterr().err


def test_kestrel_2x_adds_count_as_items_of_their_queue(spark, tmp_path) -> None:
    from kestrel2_encoding import add, addx, remove

    from kestreld.pipeline import tables

    (tmp_path / "old").write_bytes(
        addx(b"12345", BASE_MS + 100, BASE_MS + 2100)
        + addx(b"123", BASE_MS + 61 * S)
        + remove()
        + add(b"1")
    )
    (tmp_path / "old+fan").write_bytes(
        addx(b"12345", BASE_MS + 100)
    )  # a fanout copy: not counted again
    rows = spark.read.format("kestrel_journal").option("includeData", "false").load(str(tmp_path))
    items = tables.items(rows)
    assert [tuple(r.values())[:4] for r in tables.per_minute(items).toArrow().to_pylist()] == [
        ("old", "2026-11-21T14:05:00Z", 1, 5),
        ("old", "2026-11-21T14:06:00Z", 1, 3),
    ]  # the ADD has no add time: in the totals, in no minute
    totals = tables.queue_totals(items).collect()
    assert [(r["queue"], r["items"], r["bytes"]) for r in totals] == [("old", 3, 9)]
    assert tables.consumer_lag(rows, items, BASE_MS).count() == 0  # no native reader state


def test_throughput_chart_draws_idle_minutes_as_zero() -> None:
    from datetime import datetime, timedelta

    from kestreld.pipeline.charts import FILL_MINUTES, minute_series

    t0 = datetime(2026, 11, 23, 12, 0)
    points = {t0: 5, t0 + timedelta(minutes=3): 2}
    xs, ys = minute_series(points, t0, t0 + timedelta(minutes=3))
    assert xs == [t0 + timedelta(minutes=i) for i in range(4)]
    assert ys == [5, 0, 0, 2]
    far = t0 + timedelta(minutes=FILL_MINUTES + 5)
    xs, ys = minute_series({t0: 1, far: 1}, t0, far)
    assert (xs, ys) == ([t0, far], [1, 1]), "over very long spans only minutes with items"


def test_out_that_is_a_file_is_a_usage_error(workload, tmp_path, capsys) -> None:
    target = tmp_path / "report.txt"
    target.write_text("not a folder")
    assert analyze.main([str(workload), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--out {target} is a file, not a folder" in err
    assert "Traceback" not in err
    assert target.read_text() == "not a folder"
    assert analyze.main([str(workload), "--out", str(target / "sub")]) == 2
    assert "cannot create --out" in capsys.readouterr().err


def test_csv_numbers_are_rounded_to_what_they_mean(report) -> None:
    import re

    for name in ("per_minute", "consumer_lag", "error_counts", "id_gaps"):
        text = (report / f"{name}.csv").read_text()
        assert not re.search(r"\d\.\d{3,}", text), f"{name}.csv: {text}"
    rows = read_csv(report / "per_minute.csv")
    assert [r["size_p99"] for r in rows] == ["39.7", "298.0", "5.0", "7.99", "9.0"]
    assert [r["ttl_p50_ms"] for r in rows] == ["45000.0", "10000.0", "", "", ""]


def test_times_it_cannot_place_are_problems_never_1970(spark, tmp_path) -> None:
    far = 1 << 62  # ms: a Kestrel 2.x add time imported unchanged
    items = [
        Item(1, BASE_MS + 100, b"a"),
        Item(2, far, b"bb"),
        Item(3, BASE_MS + 200, b"ccc", expire_time=-1),
    ]
    folder = tmp_path / "queues"
    write_segment(folder, "jobs", 1000, items)
    out = tmp_path / "out"
    assert analyze.main([str(folder), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    offsets = record_offsets(items)
    assert summary["problems"] == [
        {
            "path": str(folder / "jobs.1000"),
            "offset": offsets[1],
            "queue": "jobs",
            "problem": f"add time {far} ms is outside years 1-9999; add_time left null",
        },
        {
            "path": str(folder / "jobs.1000"),
            "offset": offsets[2],
            "queue": "jobs",
            "problem": "negative expiry -1 ms; expire_time left null",
        },
    ]
    jobs = summary["queues"]["jobs"]
    assert jobs["items"] == 3  # every item counted (no --since/--until); the unplaced in no minute
    assert (jobs["first_add"], jobs["last_add"]) == (iso_ms(BASE_MS + 100), iso_ms(BASE_MS + 200))
    minutes = [row["minute"] for row in read_csv(out / "per_minute.csv")]
    assert not any(m.startswith("1970") for m in minutes) and len(minutes) == 1
