"""The next segment made ready by a worker thread (kestreld/journal/spare.py).

A queue that rotates often keeps its next segment created, header written, so that a
rotation on the event loop only swaps descriptors.  These drive a writer journal with a
real executor on a real event loop and look at the files it leaves.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from waiting import until

from kestreld.journal import codec, spare
from kestreld.journal.handles import HandleCache
from kestreld.journal.writer import WriterJournal

#: Each put of this size fills a segment: every put rotates.
SEGMENT = 1024
ITEM = b"x" * 900


def _writer(folder, executor, handles=None) -> WriterJournal:
    w = WriterJournal(
        str(folder),
        "q",
        max_journal_size=SEGMENT,
        sync_journal=None,
        executor=executor,
        handles=handles,
    )
    w.open([])
    return w


def _stamps(folder) -> list[int]:
    return sorted(int(n.rsplit(".", 1)[1]) for n in os.listdir(folder))


def _spare_ready(w: WriterJournal) -> bool:
    s = w.spare.spare
    return s is not None and s.ready()


def _run(tmp_path, scenario, workers: int = 2) -> None:
    with ThreadPoolExecutor(workers) as executor:
        w = _writer(tmp_path, executor)
        try:
            asyncio.run(scenario(w))
        finally:
            w.close()


def test_a_queue_that_rotates_often_takes_its_next_segment_ready_made(tmp_path):
    async def scenario(w):
        w.put(1, ITEM)  # a queue's first segment: no spare (the queue may stay small)
        assert w.spare.spare is None
        w.put(2, ITEM)  # a rotation soon after: a spare for the next
        assert w.spare.spare is not None
        await until(lambda: _spare_ready(w))
        made = w.spare.spare
        w.put(3, ITEM)
        assert w.spare.taken == 1
        assert w.segments[-1].path == made.path
        assert [s.stamp for s in w.segments] == sorted(s.stamp for s in w.segments)
        await until(lambda: w.spare.spare is not None and _spare_ready(w))
        w.flush()

    _run(tmp_path, scenario)
    ids = []
    for stamp in _stamps(tmp_path):
        with open(tmp_path / f"q.{stamp}", "rb") as f:
            decoded = codec.decode_file(f.read())
        assert decoded.problem is None
        ids += [r.id for r in decoded.records if isinstance(r, codec.Put)]
    assert ids == [1, 2, 3]
    assert len(os.listdir(tmp_path)) == 3  # the unused spare went with close()


def test_a_spare_not_ready_is_not_waited_for_and_is_deleted_once_made(tmp_path):
    gate = threading.Event()

    async def scenario(w):
        w.put(1, ITEM)
        w.put(2, ITEM)
        await until(lambda: _spare_ready(w))
        w.executor.submit(gate.wait)  # the only worker thread is busy from now on
        w.put(3, ITEM)  # takes the spare, asks for the next: it waits behind the gate
        pending = w.spare.spare
        assert pending is not None and not pending.ready()
        w.put(4, ITEM)  # does not wait: made here, after the spare's stamp
        assert w.spare.missed == 1
        assert w.segments[-1].stamp > pending.stamp
        gate.set()
        await until(lambda: not os.path.exists(pending.path))

    with ThreadPoolExecutor(1) as executor:
        w = _writer(tmp_path, executor)
        try:
            asyncio.run(scenario(w))
        finally:
            gate.set()
            w.close()
    assert _stamps(tmp_path) == sorted(s.stamp for s in w.segments)


def test_a_queue_that_rotates_rarely_keeps_no_spare(tmp_path, monkeypatch):
    monkeypatch.setattr(spare, "KEEP_SECONDS", 0.05)

    async def scenario(w):
        w.put(1, ITEM)
        await asyncio.sleep(0.1)
        w.put(2, ITEM)
        await asyncio.sleep(0.1)
        assert w.spare.spare is None
        assert len(os.listdir(tmp_path)) == 2

    _run(tmp_path, scenario)


def test_an_unused_spare_is_deleted_once_rotations_stop(tmp_path, monkeypatch):
    monkeypatch.setattr(spare, "KEEP_SECONDS", 0.2)

    async def scenario(w):
        w.put(1, ITEM)
        w.put(2, ITEM)
        path = w.spare.spare.path
        await until(lambda: os.path.exists(path))
        await until(lambda: not os.path.exists(path))
        assert w.spare.spare is None
        assert w.open_handles() == 1  # the segment only

    _run(tmp_path, scenario)


def test_closing_an_idle_journals_descriptors_deletes_its_spare(tmp_path):
    async def scenario(w):
        w.put(1, ITEM)
        w.put(2, ITEM)
        await until(lambda: _spare_ready(w))
        path = w.spare.spare.path
        w.flush()
        assert w.open_handles() == 2  # the segment and the spare
        assert w.close_handles()
        assert w.open_handles() == 0
        await until(lambda: not os.path.exists(path))

    _run(tmp_path, scenario)


def test_a_full_descriptor_budget_makes_no_spare(tmp_path):
    async def scenario(w):
        w.put(1, ITEM)
        w.put(2, ITEM)
        assert w.spare.spare is None

    with ThreadPoolExecutor(1) as executor:
        w = _writer(tmp_path, executor, HandleCache(max_journals=1))
        try:
            asyncio.run(scenario(w))
        finally:
            w.close()


def test_erase_deletes_the_spare_with_the_segments(tmp_path):
    async def scenario(w):
        w.put(1, ITEM)
        w.put(2, ITEM)
        await until(lambda: _spare_ready(w))
        w.erase()
        assert os.listdir(tmp_path) == []

    _run(tmp_path, scenario)


def test_erase_waits_for_a_spare_being_made_and_deletes_it(tmp_path):
    gate = threading.Event()

    async def scenario(w):
        w.executor.submit(gate.wait)  # the spare waits behind this
        w.put(1, ITEM)
        w.put(2, ITEM)
        assert w.spare.spare is not None and not w.spare.spare.ready()
        threading.Timer(0.05, gate.set).start()
        w.erase()
        assert os.listdir(tmp_path) == []

    with ThreadPoolExecutor(1) as executor:
        w = _writer(tmp_path, executor)
        try:
            asyncio.run(scenario(w))
        finally:
            gate.set()
            w.close()


def test_start_up_recovers_the_segments_before_a_spare_left_by_a_crash(tmp_path):
    """A large write torn in the segment before the current one, and the spare after it:
    the torn tail is cut as it is without a spare, the spare is an empty segment."""
    large = codec.encode_put(1, 1, b"L" * 5000)
    small = codec.encode_put(2, 2, b"small")
    (tmp_path / "q.1000").write_bytes(codec.WRITER_MAGIC + large[:3000])  # torn
    (tmp_path / "q.1001").write_bytes(codec.WRITER_MAGIC + small)
    (tmp_path / "q.1002").write_bytes(codec.WRITER_MAGIC)  # the spare
    w = WriterJournal(str(tmp_path), "q", max_journal_size=1 << 20, sync_journal=None)
    warnings = w.open([(s, str(tmp_path / f"q.{s}")) for s in (1000, 1001, 1002)])
    try:
        assert len(warnings) == 1 and "q.1000: torn record" in warnings[0]
        assert (tmp_path / "q.1000").stat().st_size == codec.MAGIC_SIZE
        assert [(s.first_id, s.last_id) for s in w.segments] == [(0, 0), (2, 2), (0, 0)]
        assert w.next_id == 3
        w.put(3, b"after")  # appended to the spare, now the current segment
        assert w.segments[-1].stamp == 1002
    finally:
        w.close()
    assert codec.decode_file((tmp_path / "q.1002").read_bytes()).records[0].id == 3


def test_stamps_stay_in_order_when_the_clock_is_behind_the_newest_segment(tmp_path):
    far = 1 << 50  # a segment named in the future (a clock set back)
    (tmp_path / f"q.{far}").write_bytes(codec.WRITER_MAGIC)
    w = WriterJournal(str(tmp_path), "q", max_journal_size=SEGMENT, sync_journal=None)
    w.open([(far, str(tmp_path / f"q.{far}"))])
    try:
        w.segments[-1].opened(SEGMENT)  # full: the next put rotates
        w.put(1, ITEM)
        assert [s.stamp for s in w.segments] == [far, far + 1]
    finally:
        w.close()
