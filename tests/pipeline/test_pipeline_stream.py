"""The kestrel_journal streaming source: tailing a queue folder by (segment, offset)."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from pipeline_fixtures import (  # noqa: F401 - spark_fixture provides `spark`
    BASE_MS,
    Item,
    spark_fixture,
    spark_missing,
    stream_ids,
    write_segment,
)

from kestreld.journal import codec

pytestmark = pytest.mark.spark


def items(first: int, n: int) -> list[Item]:
    return [Item(i, BASE_MS + i, f"item-{i}".encode()) for i in range(first, first + n)]


def offered(reader, start: dict, end: dict) -> list[tuple[str, int]]:
    """(op, id) rows of one micro-batch, read the way Spark would."""
    rows = []
    for part in reader.partitions(start, end):
        for batch in reader.read(part):
            rows += [(r["op"], r["id"]) for r in batch.to_pylist()]
    return rows


@pytest.fixture
def stream_reader():
    reason = spark_missing()
    if reason:
        pytest.skip(reason)
    from kestreld.pipeline.stream import KestrelJournalStreamReader

    return KestrelJournalStreamReader


def test_only_complete_records_are_offered_and_the_rest_follows(stream_reader, tmp_path) -> None:
    seg = write_segment(tmp_path, "jobs", 1000, items(1, 3))
    half = items(4, 1)[0].record()
    with open(seg, "ab") as f:
        f.write(half[:9])
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first == {"queues": {"jobs": {"segment": "jobs.1000", "offset": seg.stat().st_size - 9}}}
    assert offered(reader, start, first) == [("PUT", 1), ("PUT", 2), ("PUT", 3)]
    assert reader.latestOffset(first, None) == first  # nothing new yet: no batch
    with open(seg, "ab") as f:
        f.write(half[9:])
    second = reader.latestOffset(first, None)
    assert offered(reader, first, second) == [("PUT", 4)]
    assert json.loads(json.dumps(second)) == second  # offsets are plain JSON


def test_rotation_and_archiving_are_followed(stream_reader, tmp_path) -> None:
    live, archive = tmp_path / "queues", tmp_path / "archive"
    archive.mkdir()
    write_segment(live, "jobs", 1000, items(1, 2))
    reader = stream_reader({"path": str(live), "archivePath": str(archive)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert offered(reader, start, first) == [("PUT", 1), ("PUT", 2)]
    # The writer finishes the segment, starts the next; the old one is archived.
    with open(live / "jobs.1000", "ab") as f:
        f.write(items(3, 1)[0].record())
    write_segment(live, "jobs", 2000, items(4, 2))
    (live / "jobs.1000").rename(archive / "jobs.1000")
    write_segment(live, "mail", 1500, items(1, 1))
    second = reader.latestOffset(first, None)
    assert second["queues"]["jobs"]["segment"] == "jobs.2000"
    assert sorted(offered(reader, first, second)) == [
        ("PUT", 1),
        ("PUT", 3),
        ("PUT", 4),
        ("PUT", 5),
    ]
    # Replaying a batch (a restart before its commit) gives the same rows.
    assert sorted(offered(reader, first, second)) == [
        ("PUT", 1),
        ("PUT", 3),
        ("PUT", 4),
        ("PUT", 5),
    ]


def test_a_spare_segment_holding_only_its_header_leaves_the_offset_before_it(
    stream_reader, tmp_path
) -> None:
    """The server makes its next segment ready before the current one is finished
    (kestreld/journal/spare.py): what the current one gets meanwhile is still offered."""
    seg = write_segment(tmp_path, "jobs", 1000, items(1, 2))
    write_segment(tmp_path, "jobs", 2000, [])  # the spare: its header only
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first == {"queues": {"jobs": {"segment": "jobs.1000", "offset": seg.stat().st_size}}}
    with open(seg, "ab") as f:
        f.write(items(3, 1)[0].record())
    second = reader.latestOffset(first, None)
    assert offered(reader, first, second) == [("PUT", 3)]
    with open(tmp_path / "jobs.2000", "ab") as f:  # the rotation took the spare
        f.write(items(4, 1)[0].record())
    third = reader.latestOffset(second, None)
    assert third["queues"]["jobs"]["segment"] == "jobs.2000"
    assert offered(reader, second, third) == [("PUT", 4)]


def test_a_corrupt_tail_of_a_finished_segment_is_reported(stream_reader, tmp_path) -> None:
    # Command 8 without a data length: never a record, not one being written.
    write_segment(tmp_path, "jobs", 1000, items(1, 2), tail=b"\x80\x01\x02")
    write_segment(tmp_path, "jobs", 2000, items(3, 1))
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert offered(reader, start, end) == [("PUT", 1), ("PUT", 2), ("PROBLEM", None), ("PUT", 3)]


def overtaken_large_write(folder: Path) -> tuple[Path, bytes]:
    """The files while a worker thread writes item 3 (3 MiB) to jobs.1000 and puts 4 and 5,
    coming meanwhile, went to jobs.2000 (kestreld/journal/large_write.py); the rest of
    item 3's record is returned."""
    large = Item(3, BASE_MS + 3, b"x" * (3 * 1024 * 1024)).record()
    seg = write_segment(folder, "jobs", 1000, items(1, 2), tail=large[: 1024 * 1024])
    write_segment(folder, "jobs", 2000, items(4, 2))
    return seg, large[1024 * 1024 :]


def test_a_large_record_overtaken_by_later_puts_is_offered_before_them(
    stream_reader, tmp_path
) -> None:
    seg, rest = overtaken_large_write(tmp_path)
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    complete = seg.stat().st_size - 1024 * 1024
    assert first == {"queues": {"jobs": {"segment": "jobs.1000", "offset": complete}}}
    assert offered(reader, start, first) == [("PUT", 1), ("PUT", 2)]
    assert reader.latestOffset(first, None) == first  # still being written: no batch
    with open(seg, "ab") as f:
        f.write(rest)
    second = reader.latestOffset(first, None)
    assert second["queues"]["jobs"]["segment"] == "jobs.2000"
    assert offered(reader, first, second) == [("PUT", 3), ("PUT", 4), ("PUT", 5)]


def test_a_large_record_not_yet_begun_when_later_puts_overtook_it_is_offered_before_them(
    stream_reader, tmp_path
) -> None:
    """The worker thread has not written a byte of item 3 yet; items 4 and 5 are in the next
    segment: the gap in the ids says a record is still to come."""
    seg = write_segment(tmp_path, "jobs", 1000, items(1, 2))
    write_segment(tmp_path, "jobs", 2000, items(4, 2))
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first == {"queues": {"jobs": {"segment": "jobs.1000", "offset": seg.stat().st_size}}}
    assert offered(reader, start, first) == [("PUT", 1), ("PUT", 2)]
    with open(seg, "ab") as f:
        f.write(Item(3, BASE_MS + 3, b"x" * (3 * 1024 * 1024)).record())
    second = reader.latestOffset(first, None)
    assert offered(reader, first, second) == [("PUT", 3), ("PUT", 4), ("PUT", 5)]


def test_starting_offsets_latest_during_a_large_write_still_offers_it(
    stream_reader, tmp_path
) -> None:
    seg, rest = overtaken_large_write(tmp_path)
    reader = stream_reader({"path": str(tmp_path), "startingOffsets": "latest"})
    start = reader.initialOffset()
    with open(seg, "ab") as f:
        f.write(rest)
    assert offered(reader, start, reader.latestOffset(start, None)) == [
        ("PUT", 3),
        ("PUT", 4),
        ("PUT", 5),
    ]


def test_a_tail_torn_by_a_crash_holds_the_stream_only_until_it_is_old(
    stream_reader, tmp_path
) -> None:
    from kestreld.pipeline.stream import TORN_AFTER_SECONDS

    seg, _ = overtaken_large_write(tmp_path)
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first["queues"]["jobs"]["segment"] == "jobs.1000"
    crashed = time.time() - TORN_AFTER_SECONDS - 1  # nothing was written since
    os.utime(seg, (crashed, crashed))
    second = reader.latestOffset(first, None)
    assert second["queues"]["jobs"]["segment"] == "jobs.2000"
    assert offered(reader, first, second) == [("PROBLEM", None), ("PUT", 4), ("PUT", 5)]


def test_a_partial_tail_before_the_newest_two_segments_is_passed(stream_reader, tmp_path) -> None:
    """A write can be in flight only in the newest two segments: an older partial tail
    is torn for good, however recent."""
    overtaken_large_write(tmp_path)
    write_segment(tmp_path, "jobs", 3000, items(6, 1))
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    end = reader.latestOffset(start, None)
    assert end["queues"]["jobs"]["segment"] == "jobs.3000"
    assert offered(reader, start, end) == [
        ("PUT", 1),
        ("PUT", 2),
        ("PROBLEM", None),
        ("PUT", 4),
        ("PUT", 5),
        ("PUT", 6),
    ]


def test_a_spare_after_an_overtaking_segment_does_not_count_as_newer(
    stream_reader, tmp_path
) -> None:
    seg, rest = overtaken_large_write(tmp_path)
    write_segment(tmp_path, "jobs", 3000, [])  # the spare: its header only
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    first = reader.latestOffset(start, None)
    assert first["queues"]["jobs"]["segment"] == "jobs.1000"
    with open(seg, "ab") as f:
        f.write(rest)
    second = reader.latestOffset(first, None)
    assert offered(reader, first, second) == [("PUT", 3), ("PUT", 4), ("PUT", 5)]


def test_starting_offsets_latest_skips_what_is_there(stream_reader, tmp_path) -> None:
    seg = write_segment(tmp_path, "jobs", 1000, items(1, 3))
    reader = stream_reader({"path": str(tmp_path), "startingOffsets": "latest"})
    start = reader.initialOffset()
    assert reader.latestOffset(start, None) == start
    with open(seg, "ab") as f:
        f.write(items(4, 1)[0].record())
    assert offered(reader, start, reader.latestOffset(start, None)) == [("PUT", 4)]


def test_available_now_stops_at_what_was_there(stream_reader, tmp_path) -> None:
    seg = write_segment(tmp_path, "jobs", 1000, items(1, 2))
    reader = stream_reader({"path": str(tmp_path)})
    start = reader.initialOffset()
    reader.prepareForTriggerAvailableNow()
    with open(seg, "ab") as f:
        f.write(items(3, 1)[0].record())
    end = reader.latestOffset(start, None)
    assert offered(reader, start, end) == [("PUT", 1), ("PUT", 2)]
    assert reader.latestOffset(end, None) == end


class Writer(threading.Thread):
    """Appends items to a queue folder like the server: torn writes, rotation, archiving."""

    def __init__(
        self, live: Path, archive: Path, queue: str, total: int, per_segment: int, gate: int
    ) -> None:
        super().__init__(daemon=True)
        self.live, self.archive, self.queue = live, archive, queue
        self.total, self.per_segment = total, per_segment
        self.gate_at, self.gate = gate, threading.Event()  # pause after `gate` items
        self.written = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            stamp, f = 0, None
            for i in range(1, self.total + 1):
                if (i - 1) % self.per_segment == 0:
                    if f is not None:
                        f.close()
                        old = f"{self.queue}.{stamp}"
                        (self.live / old).rename(self.archive / old)
                    stamp = 1000 + i
                    f = open(self.live / f"{self.queue}.{stamp}", "wb")  # noqa: SIM115
                    f.write(codec.WRITER_MAGIC)
                record = Item(i, BASE_MS + i, b"%d" % i * (i % 50)).record()
                f.write(record[:5])  # a record seen half-written must not be offered
                f.flush()
                f.write(record[5:])
                f.flush()
                self.written = i
                if i == self.gate_at:
                    self.gate.wait(120)
                elif i % 20 == 0:
                    time.sleep(0.02)
            f.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e


def start_stream(spark, live: Path, archive: Path, out: Path, checkpoint: Path):
    return (
        spark.readStream.format("kestrel_journal")
        .option("archivePath", str(archive))
        .option("includeData", "false")
        .load(str(live))
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="200 milliseconds")
        .start()
    )


def test_growing_folder_restarted_from_checkpoint_gives_every_item_once(spark, tmp_path) -> None:
    live, archive, out, ck = (tmp_path / n for n in ("queues", "archive", "out", "ck"))
    live.mkdir()
    archive.mkdir()
    writers = [
        Writer(live, archive, "jobs", 1500, 400, gate=100),
        Writer(live, archive, "mail", 600, 250, gate=10),
    ]
    for w in writers:
        w.start()
    query = start_stream(spark, live, archive, out, ck)

    def rows_in() -> int:
        return sum(p["numInputRows"] for p in query.recentProgress)

    deadline = time.monotonic() + 90
    while rows_in() == 0:
        assert time.monotonic() < deadline, "the stream offered nothing"
        time.sleep(0.1)
    before = rows_in()
    for w in writers:
        w.gate.set()  # the files grow while the stream runs
    while rows_in() == before or writers[0].written < 700:
        assert time.monotonic() < deadline, "the stream did not follow the growing files"
        time.sleep(0.05)
    query.stop()  # mid-way: the writers are still going
    for w in writers:
        w.join(60)
        assert w.error is None and w.written == w.total
    query = start_stream(spark, live, archive, out, ck)
    query.processAllAvailable()
    query.stop()
    got = spark.read.parquet(str(out)).select("queue", "id", "op").collect()
    assert all(r["op"] == "PUT" for r in got)
    counts = Counter((r["queue"], r["id"]) for r in got)
    assert max(counts.values()) == 1
    assert sorted(counts) == [("jobs", i) for i in range(1, 1501)] + [
        ("mail", i) for i in range(1, 601)
    ]
    assert stream_ids(spark, out)  # the helper reads the same sink


def test_a_stream_polling_a_server_during_large_writes_offers_every_item_once(
    stream_reader, make_server
) -> None:
    """Small sets flow on one connection while 8 MiB items are set on another, so the
    server's later puts overtake each large write into a new segment; micro-batches
    planned all the while give every item once, in id order, and no PROBLEM."""
    srv = make_server()
    reader = stream_reader({"path": str(srv.queue_path), "includeData": "false"})
    stop = threading.Event()
    errors: list[BaseException] = []

    def small_sets() -> None:
        try:
            client = srv.client()
            n = 0
            while not stop.is_set():
                assert client.set("jobs", b"small-%d" % n, noreply=False)
                n += 1
            client.close()
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    rows: list[tuple[str, int]] = []
    batches = 0

    def poll(until: threading.Event) -> None:
        nonlocal batches
        try:
            offset = reader.initialOffset()
            while True:
                last = until.is_set()
                end = reader.latestOffset(offset, None)
                if end != offset:
                    rows.extend(offered(reader, offset, end))
                    reader.commit(end)
                    offset, batches = end, batches + 1
                if last:
                    return
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    done = threading.Event()
    threads = [threading.Thread(target=small_sets), threading.Thread(target=poll, args=(done,))]
    for t in threads:
        t.start()
    large = srv.client()
    try:
        for i in range(32):
            assert large.set("jobs", bytes([65 + i]) * (8 * 1024 * 1024), noreply=False)
    finally:
        stop.set()
        threads[0].join(60)
        done.set()  # one last batch after every set was answered
        threads[1].join(120)
        large.close()
    assert not errors
    ids = [id_ for op, id_ in rows]
    assert {op for op, _ in rows} == {"PUT"}
    assert ids == list(range(1, len(ids) + 1))
    assert len(ids) > 32 and batches > 1
