"""The kestrel_journal batch data source: what spark.read.format("kestrel_journal") returns."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pipeline_fixtures import (  # noqa: F401 - spark_fixture provides `spark`
    BASE_MS,
    Item,
    record_offsets,
    rows_of,
    spark_fixture,
    ts,
    write_checkpoint,
    write_segment,
)

from kestreld.journal import codec
from kestreld.pipeline.listing import FileKind, JournalFile, group_files, list_journal_files
from kestreld.pipeline.schema import COLUMNS, arrow_schema

pytestmark = pytest.mark.spark

ITEMS_A = [
    Item(1, BASE_MS + 100, b"a" * 10),
    Item(2, BASE_MS + 200, b"b" * 20, expire_time=BASE_MS + 60_200, error_count=1),
    Item(3, BASE_MS + 300, b""),
]
ITEMS_B = [Item(4, BASE_MS + 61_000, bytes(range(256)), error_count=3)]


def load(spark, *paths: str | Path, **options: str):
    reader = spark.read.format("kestrel_journal")
    for key, value in options.items():
        reader = reader.option(key, value)
    names = [str(p) for p in paths]
    return reader.load(names[0] if len(names) == 1 else names)


def problems(df) -> list[tuple[str, int, str]]:
    return sorted(
        (r["segment"], r["offset"], bytes(r["data"]).decode())
        for r in df.filter("op = 'PROBLEM'").collect()
    )


def test_arrow_schema_is_what_spark_expects_of_the_declared_schema() -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    types = {
        "offset": LongType(),
        "id": LongType(),
        "add_time": TimestampType(),
        "expire_time": TimestampType(),
        "error_count": IntegerType(),
        "size": IntegerType(),
        "data": BinaryType(),
    }
    declared = StructType([StructField(c, types.get(c, StringType())) for c in COLUMNS])
    assert to_arrow_schema(declared, timezone="UTC").equals(arrow_schema())


def test_puts_are_read_with_their_exact_fields(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    write_segment(tmp_path, "jobs", 2000, ITEMS_B)
    df = load(spark, tmp_path)
    assert df.columns == list(COLUMNS)
    got = [r.asDict() for r in df.filter("op = 'PUT'").orderBy("id").collect()]
    offsets = record_offsets(ITEMS_A) + record_offsets(ITEMS_B)
    segments = ["jobs.1000"] * 3 + ["jobs.2000"]
    expected = [
        {
            "queue": "jobs",
            "reader": None,
            "segment": seg,
            "offset": off,
            "op": "PUT",
            "id": i.id,
            "add_time": ts(i.add_time),
            "expire_time": ts(i.expire_time) if i.expire_time else None,
            "error_count": i.error_count,
            "size": len(i.data),
            "data": bytearray(i.data),
        }
        for i, off, seg in zip(ITEMS_A + ITEMS_B, offsets, segments, strict=True)
    ]
    assert got == expected
    assert df.filter("op = 'PROBLEM'").count() == 0


def test_checkpoints_give_head_and_one_row_per_done_id(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    write_checkpoint(tmp_path, "jobs", "", 1, [3])
    write_checkpoint(tmp_path, "jobs", "audit", 0)
    df = load(spark, tmp_path).filter("op != 'PUT'")
    assert rows_of(df, "queue", "reader", "segment", "op", "id") == [
        ("jobs", "", "jobs.read.", "READ_DONE", 3),
        ("jobs", "", "jobs.read.", "READ_HEAD", 1),
        ("jobs", "audit", "jobs.read.audit", "READ_HEAD", 0),
    ]


def test_include_data_false_leaves_data_null_and_keeps_sizes(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A + ITEMS_B)
    df = load(spark, tmp_path, includeData="false")
    assert rows_of(df, "id", "size") == [(i.id, len(i.data)) for i in ITEMS_A + ITEMS_B]
    assert df.filter("data IS NOT NULL").count() == 0


def test_torn_tail_keeps_complete_records_and_is_reported(spark, tmp_path) -> None:
    torn = Item(5, BASE_MS, b"torn!").record()[:-2]
    write_segment(tmp_path, "jobs", 1000, ITEMS_A, tail=torn)
    df = load(spark, tmp_path)
    end = record_offsets(ITEMS_A + [Item(5, 0, b"")])[-1]
    assert rows_of(df.filter("op = 'PUT'"), "id") == [(1,), (2,), (3,)]
    assert problems(df) == [
        ("jobs.1000", end, f"truncated record at offset {end} ({len(torn)} bytes cut)")
    ]


def test_corrupt_record_keeps_records_before_it_and_is_reported(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A, tail=b"\x86\xff\xff\xff\x7f" + b"\0" * 40)
    write_segment(tmp_path, "mail", 1000, [], tail=b"junk")  # a record header cut short
    (tmp_path / "jobs.read.").write_bytes(b"\x26\x3c\x26\x03\x02\x05")  # torn checkpoint
    df = load(spark, tmp_path)
    end = record_offsets(ITEMS_A + [Item(5, 0, b"")])[-1]
    assert rows_of(df.filter("op = 'PUT'"), "id") == [(1,), (2,), (3,)]
    found = problems(df)
    assert found[0][:2] == ("jobs.1000", end) and "item too large" in found[0][2]
    assert found[1][:2] == ("jobs.read.", 4) and "truncated" in found[1][2]
    assert found[2] == ("mail.1000", 4, "truncated record at offset 4 (4 bytes cut)")
    assert len(found) == 3
    assert df.filter("queue = 'mail' AND op = 'PUT'").count() == 0


def test_bad_magic_file_named_like_a_segment_is_reported_not_fatal(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    (tmp_path / "jobs.2000").write_bytes(b"\xee\xee\xee\xee" + Item(9, 1, b"x").record())
    df = load(spark, tmp_path)
    assert df.filter("op = 'PUT'").count() == 3
    assert [p[:2] for p in problems(df)] == [("jobs.2000", 0)]


def test_archive_and_live_folders_are_read_once_each_segment(spark, tmp_path) -> None:
    live, archive = tmp_path / "queues", tmp_path / "archive"
    write_segment(archive, "jobs", 1000, ITEMS_A)
    write_segment(live, "jobs", 1000, ITEMS_A)  # caught mid-move: in both folders
    write_segment(live, "jobs", 2000, ITEMS_B)
    df = load(spark, live, archivePath=str(archive), includeData="false")
    assert rows_of(df, "id") == [(1,), (2,), (3,), (4,)]
    assert rows_of(load(spark, archive, live, includeData="false"), "id") == [
        (1,),
        (2,),
        (3,),
        (4,),
    ]


def test_single_files_can_be_loaded(spark, tmp_path) -> None:
    seg = write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    write_segment(tmp_path, "jobs", 2000, ITEMS_B)
    cp = write_checkpoint(tmp_path, "jobs", "x", 2)
    df = load(spark, seg, cp)
    assert rows_of(df, "op", "id") == [("PUT", 1), ("PUT", 2), ("PUT", 3), ("READ_HEAD", 2)]


def test_kestrel_2x_journals_are_read_op_by_op(spark, tmp_path) -> None:
    from kestrel2_encoding import add, addx, remove

    (tmp_path / "old.100").write_bytes(addx(b"one", BASE_MS, BASE_MS + 5000) + remove())
    (tmp_path / "old").write_bytes(addx(b"two", BASE_MS + 1000) + add(b"three") + b"\x02\x40")
    (tmp_path / "old+fan").write_bytes(addx(b"one", BASE_MS))
    df = load(spark, tmp_path)
    assert rows_of(
        df.filter("op != 'PROBLEM'"),
        "reader",
        "segment",
        "op",
        "add_time",
        "expire_time",
        "size",
        "data",
    ) == [
        ("", "old", "ADD", None, None, 5, bytearray(b"three")),
        ("", "old", "ADDX", ts(BASE_MS + 1000), None, 3, bytearray(b"two")),
        ("", "old.100", "ADDX", ts(BASE_MS), ts(BASE_MS + 5000), 3, bytearray(b"one")),
        ("", "old.100", "REMOVE", None, None, None, None),
        ("fan", "old+fan", "ADDX", ts(BASE_MS), None, 3, bytearray(b"one")),
    ]
    assert {r["queue"] for r in df.collect()} == {"old"}
    torn_at = len(addx(b"two", 0)) + len(add(b"three"))
    assert [p[:2] for p in problems(df)] == [("old", torn_at)]


def test_missing_path_is_reported_not_fatal(spark, tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    df = load(spark, tmp_path, tmp_path / "nope")
    assert df.filter("op = 'PUT'").count() == 3
    assert problems(df) == [("nope", 0, "no such file or folder")]


def test_many_small_files_share_partitions_and_big_ones_do_not(spark, tmp_path) -> None:
    for q in range(40):
        write_segment(tmp_path, f"q{q}", 1000, ITEMS_A)
        write_checkpoint(tmp_path, f"q{q}", "", 1)
    df = load(spark, tmp_path, includeData="false")
    assert df.rdd.getNumPartitions() < 80
    assert df.filter("op = 'PUT'").count() == 120
    few = [JournalFile(FileKind.SEGMENT, f"q.{i}", "q", None, [], 10) for i in range(5)]
    assert [len(g) for g in group_files(few)] == [1] * 5
    many = [JournalFile(FileKind.SEGMENT, f"q.{i}", "q", None, [], 10 << 20) for i in range(40)]
    many[5].size = 100 << 20
    groups = group_files(many, target_bytes=32 << 20)
    assert [g for g in groups if many[5] in g] == [[many[5]]]
    assert sum(len(g) for g in groups) == 40 and len(groups) < 40


def test_temporaries_are_ignored(tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, ITEMS_A)
    (tmp_path / "jobs.read.~~123").write_bytes(codec.encode_checkpoint(3))
    listing = list_journal_files([str(tmp_path)])
    assert [f.name for f in listing.files] == ["jobs.1000"]
    assert listing.problems == []


def test_big_payloads_are_split_into_batches_of_bounded_size(tmp_path) -> None:
    pytest.importorskip("pyarrow")
    from kestreld.pipeline.columnar import CHUNK_DATA_BYTES, read_file

    big = [Item(i, BASE_MS, bytes([i]) * (12 << 20)) for i in range(1, 6)]
    write_segment(tmp_path, "jobs", 1000, big + [Item(6, BASE_MS, b"small")])
    [jf] = list_journal_files([str(tmp_path)]).files
    batches = list(read_file(jf, include_data=True))
    assert all(sum(batch.column("size").to_pylist()) <= CHUNK_DATA_BYTES for batch in batches)
    data = [v for batch in batches for v in batch.column("data").to_pylist()]
    assert data == [i.data for i in big] + [b"small"]


def utc(ms: int) -> datetime:
    """A journal time as Arrow's to_pylist() returns it (aware, UTC)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)


def _rows(tmp_path) -> list[dict]:
    pytest.importorskip("pyarrow")
    from kestreld.pipeline.columnar import read_file

    files = list_journal_files([str(tmp_path)]).files
    return [row for jf in files for b in read_file(jf, include_data=False) for row in b.to_pylist()]


def test_an_add_time_no_timestamp_can_hold_is_a_problem_row_not_1970(tmp_path) -> None:
    far = 1 << 62  # ms: imported unchanged from a Kestrel 2.x journal
    write_segment(tmp_path, "jobs", 1000, [Item(1, BASE_MS, b"a"), Item(2, far, b"b")])
    offsets = record_offsets([Item(1, BASE_MS, b"a"), Item(2, far, b"b")])
    rows = _rows(tmp_path)
    puts = [r for r in rows if r["op"] == "PUT"]
    assert [(r["id"], r["add_time"]) for r in puts] == [(1, utc(BASE_MS)), (2, None)]
    [problem] = [r for r in rows if r["op"] == "PROBLEM"]
    assert (problem["segment"], problem["offset"]) == ("jobs.1000", offsets[1])
    assert problem["data"].decode() == (
        f"add time {far} ms is outside years 1-9999; add_time left null"
    )


def test_a_negative_expiry_is_a_problem_row_and_never_a_time(tmp_path) -> None:
    write_segment(tmp_path, "jobs", 1000, [Item(1, BASE_MS, b"a", expire_time=-5000)])
    rows = _rows(tmp_path)
    assert [r["expire_time"] for r in rows if r["op"] == "PUT"] == [None]
    assert [r["data"].decode() for r in rows if r["op"] == "PROBLEM"] == [
        "negative expiry -5000 ms; expire_time left null"
    ]


def test_kestrel_2x_times_out_of_range_are_problem_rows(tmp_path) -> None:
    from kestrel2_encoding import addx

    (tmp_path / "old").write_bytes(addx(b"x", BASE_MS) + addx(b"y", -(1 << 62)))
    rows = _rows(tmp_path)
    assert [r["add_time"] for r in rows if r["op"] == "ADDX"] == [utc(BASE_MS), None]
    [problem] = [r for r in rows if r["op"] == "PROBLEM"]
    assert problem["offset"] > 0 and "outside years 1-9999" in problem["data"].decode()


def test_times_at_the_ends_of_the_range_are_kept_exactly(tmp_path) -> None:
    from kestreld.pipeline.columnar import MAX_TIME_MS, MIN_TIME_MS

    write_segment(tmp_path, "jobs", 1000, [Item(1, MIN_TIME_MS, b""), Item(2, MAX_TIME_MS, b"")])
    rows = _rows(tmp_path)
    assert [r["op"] for r in rows] == ["PUT", "PUT"]
    assert [r["add_time"] for r in rows] == [utc(MIN_TIME_MS), utc(MAX_TIME_MS)]
