"""A large record written by a worker thread, and the puts that come meanwhile.

The writer journal hands a buffer of at least ``LARGE_WRITE_BYTES`` to a worker thread;
puts that arrive while one of at least ``OVERTAKE_BYTES`` is written start the next segment
and are written on the loop:
stored (their replies may go) before the large batch, resolved (their items offered to
readers) after it.  The worker here is held busy by a gate, so "meanwhile" lasts as long
as the test wants.
"""

from __future__ import annotations

import asyncio
import os
import threading
from concurrent.futures import ThreadPoolExecutor

from waiting import until

from kestreld.journal import codec
from kestreld.journal.large_write import LARGE_WRITE_BYTES, OVERTAKE_BYTES, RESOLVE_SLICE
from kestreld.journal.segment import SegmentReader
from kestreld.journal.writer import WriterJournal

MiB = 1024 * 1024


def _writer(folder: str, executor: ThreadPoolExecutor, sync_journal: int | None = None):
    w = WriterJournal(
        folder, "q", max_journal_size=64 * MiB, sync_journal=sync_journal, executor=executor
    )
    w.open([])
    return w


def _run_with_busy_worker(tmp_path, sync_journal, scenario):
    """Run ``scenario(writer, gate)`` on an event loop; the worker waits for ``gate``."""
    gate = threading.Event()
    with ThreadPoolExecutor(1) as executor:
        executor.submit(gate.wait)
        w = _writer(str(tmp_path), executor, sync_journal)
        try:
            asyncio.run(scenario(w, gate))
        finally:
            gate.set()
            w.close()


def test_puts_behind_a_large_write_are_stored_first_and_resolve_after_it(tmp_path):
    order = []

    async def scenario(w, gate):
        large = w.put(1, b"L" * OVERTAKE_BYTES)
        large.add_done_callback(lambda b: order.append("large"))
        await asyncio.sleep(0.01)  # flushed: handed to the (busy) worker thread
        small = w.put(2, b"small")
        small.add_done_callback(lambda b: order.append("small"))
        await until(lambda: small.stored)
        assert not small.done and not large.done  # items wait for the large one
        gate.set()
        await until(lambda: small.done)
        assert large.error is None and small.error is None

    _run_with_busy_worker(tmp_path, None, scenario)
    assert order == ["large", "small"]


def test_puts_behind_a_large_write_go_to_the_next_segment_in_id_order(tmp_path):
    async def scenario(w, gate):
        w.put(1, b"L" * OVERTAKE_BYTES)
        await asyncio.sleep(0.01)
        smalls = [w.put(2, b"small %d" % i) for i in range(3)]
        await until(lambda: all(b.stored for b in smalls))
        assert len(w.segments) == 2
        gate.set()
        await until(lambda: all(b.done for b in smalls))

    _run_with_busy_worker(tmp_path, None, scenario)
    names = sorted(os.listdir(tmp_path), key=lambda n: int(n.rsplit(".", 1)[1]))
    ids = []
    for name in names:
        with open(tmp_path / name, "rb") as f:
            decoded = codec.decode_file(f.read())
        assert decoded.problem is None
        ids.append([r.id for r in decoded.records if isinstance(r, codec.Put)])
    assert ids == [[1], [2, 3, 4]]


def test_batches_behind_a_large_write_resolve_a_slice_per_turn_in_order(tmp_path):
    """Thousands of ticks may be stored behind an 8 MiB write: once it is written they
    resolve RESOLVE_SLICE per turn of the loop, not all in one callback; a put made while
    they do resolves after them."""
    order: list[int] = []
    seen: dict[str, int] = {}

    async def scenario(w, gate):
        loop = asyncio.get_running_loop()
        large = w.put(1, b"L" * OVERTAKE_BYTES)
        await asyncio.sleep(0.01)
        smalls = []
        for i in range(3 * RESOLVE_SLICE):  # a batch per turn
            smalls.append(w.put(2 + i, b"small"))
            smalls[-1].add_done_callback(lambda b, i=i: order.append(i))
            await asyncio.sleep(0)
        await until(lambda: all(b.stored for b in smalls))
        late: list = []

        def next_turn() -> None:
            seen["done"] = sum(b.done for b in smalls)
            late.append(w.put(9999, b"late"))
            late[0].add_done_callback(lambda b: order.append(-1))

        large.add_done_callback(lambda b: loop.call_soon(next_turn))
        gate.set()
        await until(lambda: bool(late) and late[0].done)
        assert all(b.error is None for b in smalls)

    _run_with_busy_worker(tmp_path, None, scenario)
    assert seen["done"] == RESOLVE_SLICE  # one slice in the turn the large write ended
    assert order == [*range(3 * RESOLVE_SLICE), -1]


def test_with_sync_journal_0_puts_behind_a_large_write_are_stored_after_their_fsync(tmp_path):
    async def scenario(w, gate):
        large = w.put(1, b"L" * OVERTAKE_BYTES)
        await asyncio.sleep(0.01)
        small = w.put(2, b"small")
        # One worker, held: the small batch's fsync waits behind the gate too.
        await asyncio.sleep(0.05)
        assert not small.stored
        gate.set()
        await until(lambda: small.done)
        assert large.done and large.error is None

    _run_with_busy_worker(tmp_path, 0, scenario)


def test_puts_behind_a_write_of_less_than_overtake_bytes_wait_in_its_segment(tmp_path):
    async def scenario(w, gate):
        burst = w.put(1, b"b" * LARGE_WRITE_BYTES)  # off the loop, but quick: no new segment
        await asyncio.sleep(0.01)
        small = w.put(2, b"small")
        await asyncio.sleep(0.05)
        assert not small.stored and not small.done and len(w.segments) == 1
        gate.set()
        await until(lambda: small.done)
        assert burst.error is None and small.error is None and len(w.segments) == 1

    _run_with_busy_worker(tmp_path, None, scenario)


def test_a_second_large_put_waits_for_the_first_large_batch(tmp_path):
    async def scenario(w, gate):
        first = w.put(1, b"A" * LARGE_WRITE_BYTES)
        await asyncio.sleep(0.01)
        assert w.large.busy()
        second = w.put(2, b"B" * LARGE_WRITE_BYTES)
        await asyncio.sleep(0.05)
        assert not second.stored and not second.done  # buffered until the first resolves
        gate.set()
        await until(lambda: second.done)
        assert first.error is None and second.error is None and not w.large.busy()

    _run_with_busy_worker(tmp_path, None, scenario)


def test_a_large_record_torn_before_a_later_segment_is_cut_at_start_up(tmp_path):
    """A crash while the worker wrote the large record, after puts went to the next segment."""
    large = codec.encode_put(2, 1, b"L" * LARGE_WRITE_BYTES)
    (tmp_path / "q.1000").write_bytes(
        codec.WRITER_MAGIC + codec.encode_put(1, 1, b"first") + large[: len(large) // 2]
    )
    (tmp_path / "q.1001").write_bytes(codec.WRITER_MAGIC + codec.encode_put(3, 1, b"third"))
    w = WriterJournal(str(tmp_path), "q", max_journal_size=64 * MiB, sync_journal=None)
    warnings = w.open([(1000, str(tmp_path / "q.1000")), (1001, str(tmp_path / "q.1001"))])
    assert any("torn record" in warning for warning in warnings)
    older = w.segments[0]
    assert (older.first_id, older.last_id, older.items) == (1, 1, 1)
    assert os.path.getsize(tmp_path / "q.1000") == older.size
    assert w.next_id == 4
    w.close()


def test_a_large_put_is_read_back_whole_and_the_reads_go_on_after_it(tmp_path):
    """The read-behind reads a large put's data alone (one copy), then what follows it."""
    large = bytes(range(256)) * (9 * MiB // 256)
    (tmp_path / "q.1000").write_bytes(
        codec.WRITER_MAGIC
        + codec.encode_put(1, 1, b"first")
        + codec.encode_put(2, 1, large, expire_time=5)
        + codec.encode_put(3, 1, b"third")
    )
    w = WriterJournal(str(tmp_path), "q", max_journal_size=64 * MiB, sync_journal=None)
    w.open([(1000, str(tmp_path / "q.1000"))])
    seg = w.segments[0]
    reader = SegmentReader()
    puts, offset, problem = reader.read(seg, codec.MAGIC_SIZE, 1024)
    assert [p.data for p in puts] == [b"first"] and problem is None
    puts, offset, problem = reader.read(seg, offset, 1024)
    assert [(p.id, p.expire_time, p.data == large) for p in puts] == [(2, 5, True)]
    assert problem is None and offset == puts[0].offset + puts[0].length
    puts, offset, problem = reader.read(seg, offset, 1024)
    assert [p.data for p in puts] == [b"third"] and offset == seg.visible
    reader.close()
    w.close()
