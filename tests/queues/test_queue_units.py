"""Unit tests of the queue core's sans-IO parts on a temp folder: BlockingQueue,
ProgressLog and Reader (memory, read-behind, open reads, flush).  The behaviour on a
real server is in test_queue_accounts.py and test_queue_model.py."""

from __future__ import annotations

import asyncio
import errno
import gc
import os
import struct

from kestreld import compiled
from kestreld.config import QueueConfig
from kestreld.journal import codec, fileio
from kestreld.journal.checkpoint import read_checkpoint
from kestreld.journal.progress import ProgressLog, rewrite
from kestreld.journal.writer import WriterJournal
from kestreld.queues.blocking import PRUNE_AFTER, BlockingQueue, Waiter
from kestreld.queues.item import QueueItem
from kestreld.queues.reader import Reader

NOW = 1_700_000_000_000


def _item(id_: int, data: bytes = b"x", expire: int = 0) -> QueueItem:
    return QueueItem(id_, NOW, expire, 0, data)


# --- BlockingQueue ------------------------------------------------------------------------


def test_a_compiled_item_is_not_tracked_by_the_cycle_collector():
    """The compiled QueueItem holds C numbers and bytes only: the items a queue keeps in
    memory are never traversed by a collection.  The plain build's is a slots class (tracked).
    """
    item = QueueItem(1, 2, 0, 0, b"x")
    assert gc.is_tracked(item) is not compiled.is_compiled("kestreld.queues.item")
    assert item.data == b"x" and item.aborted().data is item.data


def test_blocking_queue_is_fifo_with_verbs():
    q = BlockingQueue()
    q.put(_item(1))
    q.put(_item(2))
    q.put_first(_item(0))
    assert len(q) == 3 and q.peek().id == 0
    assert [q.poll().id for _ in range(3)] == [0, 1, 2]
    assert q.poll() is None and not q


async def test_hand_off_goes_to_the_oldest_live_waiter():
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    gone = q.wait(loop, None)
    gone.cancel()
    first, second = q.wait(loop, None), q.wait(loop, None)
    assert q.hand_off(_item(1))
    assert first.result().id == 1 and not second.done()
    assert q.live_waiters() == 1


async def test_timed_out_waiters_are_pruned_behind_a_long_waiter():
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    long = q.wait(loop, 600)
    for _ in range(10 * PRUNE_AFTER):
        await q.wait(loop, 0)
    await asyncio.sleep(0)
    assert len(q.waiters) <= 2 * PRUNE_AFTER + 2
    assert q.live_waiters() == 1 and not long.done()
    long.cancel()


async def test_waits_ending_at_one_deadline_all_end_while_the_timer_prunes_the_lines():
    """The timer resolving many waits prunes the lines as it goes (in place: they are never
    replaced): every wait still ends, none is lost to the prune."""
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    for _ in range(4 * PRUNE_AFTER):  # dead waiters linger in the line: the next ones prune
        q.wait(loop, 0.01)
    await asyncio.sleep(0.05)
    waits = [q.wait(loop, 0.01) for _ in range(2 * PRUNE_AFTER)]
    stays = q.wait(loop, 60)
    await asyncio.sleep(0.05)
    assert all(w.done() and w.result() is None for w in waits)
    assert q.live_waiters() == 1 and len(q.waiters) <= 2 * PRUNE_AFTER + 2
    assert len(q.deadlines) == 1 and q.timer is not None
    assert q.hand_off(_item(7)) and stays.result().id == 7
    q.wake_all()


async def test_timed_waits_share_one_timer_and_each_ends_at_its_own_deadline():
    """One timer per queue, armed for the earliest deadline (issue 28): a short wait
    begun after a long one still ends on time, a served wait never times out, and no
    timer is left once nobody waits."""
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    began = loop.time()
    long = q.wait(loop, 0.4)
    short = q.wait(loop, 0.05)
    served = q.wait(loop, 0.3)
    ended: dict[str, float] = {}
    for name, fut in (("long", long), ("short", short)):
        fut.add_done_callback(lambda _f, name=name: ended.setdefault(name, loop.time() - began))
    await asyncio.sleep(0.15)
    assert short.done() and short.result() is None and not long.done()
    assert 0.04 <= ended["short"] < 0.15
    assert q.hand_off(_item(1))  # the oldest live waiter: long (short is gone)
    assert long.result().id == 1 and not served.done()
    assert q.hand_off(_item(2)) and served.result().id == 2
    await asyncio.sleep(0.35)
    assert q.timer is None and not q.deadlines  # nothing left to time out
    assert q.live_waiters() == 0


async def test_many_served_waits_leave_a_bounded_line_of_deadlines():
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    for i in range(20 * PRUNE_AFTER):
        fut = q.wait(loop, 60)
        assert q.hand_off(_item(i)) and fut.result().id == i
        assert not q.deadlines  # a served wait's deadline leaves with the hand-off
    gone, served = q.wait(loop, 60), q.wait(loop, 60)
    gone.cancel()  # its session ended it: it lingers until the next hand-off passes it
    assert q.hand_off(_item(-1)) and served.result().id == -1 and not q.deadlines
    assert q.timer is not None  # still armed for a deadline served long ago: harmless
    q.wake_all()
    assert q.timer is None and not q.deadlines


async def test_the_waits_of_a_line_ending_in_one_turn_run_together_on_the_next():
    """A get's Waiter ends once: served, timed out or cancelled.  Its callback runs on the
    loop's next turn, as a future's would; the waits of one line that ended in the same turn
    run from one callback, in the order they ended.  An ended waiter is passed by."""
    loop = asyncio.get_running_loop()
    q = BlockingQueue()
    ended: list[tuple[str, object]] = []

    def waiter(name: str, timeout: float | None = None) -> Waiter:
        w = Waiter(lambda w: ended.append((name, None if w.item is None else w.item.id)), loop)
        q.enter(w, timeout)
        return w

    gone, first, second = waiter("gone"), waiter("first"), waiter("second")
    assert gone.cancel() and not gone.cancel() and gone.cancelled()
    assert q.hand_off(_item(1)) and q.hand_off(_item(2))  # gone is passed by
    assert not q.hand_off(_item(3))  # nobody waits any more
    assert first.done() and not first.cancelled() and second.done()
    assert ended == []  # not in the middle of the offers: on the next turn
    handles = len(loop._ready) if hasattr(loop, "_ready") else None  # asyncio's own loop
    await asyncio.sleep(0)
    assert ended == [("gone", None), ("first", 1), ("second", 2)]
    if handles is not None:
        assert handles == 2  # the cancel's callback, and one for both waits served
    try:
        first.serve(_item(4))
    except asyncio.InvalidStateError:
        pass
    else:
        raise AssertionError("a served waiter took a second item")

    timed, stays = waiter("timed", 0.01), waiter("stays", 60)
    await asyncio.sleep(0.05)
    assert timed.done() and ended[-1] == ("timed", None) and not stays.done()
    q.wake_all()  # the queue goes away: every wait still open ends without an item
    await asyncio.sleep(0)
    assert ended[-1] == ("stays", None) and q.live_waiters() == 0


async def test_a_failing_end_of_one_wait_is_reported_and_the_others_still_run():
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        q = BlockingQueue()
        ran: list[int] = []

        def fail(_w: Waiter) -> None:
            raise RuntimeError("a bug")

        q.enter(Waiter(fail, loop), None)
        q.enter(Waiter(lambda w: ran.append(w.item.id), loop), None)
        assert q.hand_off(_item(1)) and q.hand_off(_item(2))
        await asyncio.sleep(0)
        assert ran == [2]
        assert len(reported) == 1 and isinstance(reported[0]["exception"], RuntimeError)
        q.enter(Waiter(lambda w: ran.append(w.item.id), loop), None)
        assert q.hand_off(_item(3))
        await asyncio.sleep(0)
        assert ran == [2, 3]  # the line goes on serving after the failure
    finally:
        loop.set_exception_handler(None)


# --- ProgressLog -------------------------------------------------------------------------


async def test_progress_log_appends_confirms_and_jumps(tmp_path):
    path = str(tmp_path / "q.read.")
    rewrite(path, 3, [5], sync_folder=False)
    acked: list[list[int]] = []
    log = ProgressLog(path, lambda: (3, [5]), lambda ids, batch: acked.append(ids))
    batch = log.record(4)
    assert log.write() is batch
    batch.resolve()
    assert acked == [[4]]
    log.jump(9, [7])
    log.record(10)
    log.write().resolve()
    os.close(log.fd)
    cp = read_checkpoint(path)
    assert (cp.head, cp.done, cp.held) == (9, {10}, {7})


async def test_progress_log_waits_while_a_rewrite_runs(tmp_path):
    log = ProgressLog(str(tmp_path / "q.read."), lambda: (0, []), lambda ids, batch: None)
    log.record(1)
    log.begin_rewrite()
    assert log.write() is None and log.has_pending
    log.rewrite_failed()
    assert log.write() is not None
    assert log.take_created() and not log.take_created()
    os.close(log.fd)


def test_held_ids_are_released_by_a_later_confirm():
    data = (
        codec.encode_checkpoint(2)
        + codec.encode_read_head(8)
        + codec.encode_read_done([-3, -5])
        + codec.encode_read_done([5, 9])
    )
    assert codec.decode_progress(data) == (8, {9}, {3}, None)
    assert codec.decode_checkpoint(data) == (8, {9}, None)


def test_a_jump_backwards_is_damage():
    data = codec.encode_checkpoint(8) + codec.encode_read_head(3)
    head, _done, problem = codec.decode_checkpoint(data)
    assert head == 8 and "going back" in problem


# --- Reader ------------------------------------------------------------------------------


def _journaled_reader(folder: str, **config) -> tuple[WriterJournal, Reader]:
    cfg = QueueConfig(**config)
    journal = WriterJournal(folder, "q", max_journal_size=4096, sync_journal=None)
    journal.open([])
    return journal, Reader("q", "", cfg, folder, journal)


async def _put(journal: WriterJournal, reader: Reader, data: bytes) -> None:
    batch = journal.put(NOW, data)
    id_, seg, offset = journal.put_id, journal.put_segment, journal.put_offset
    journal.flush()
    assert batch.done and batch.error is None
    reader.offer(QueueItem(id_, NOW, 0, 0, data), seg, offset, NOW)


async def test_reader_reads_behind_with_exact_counts(tmp_path):
    journal, reader = _journaled_reader(str(tmp_path), max_memory_size=1000)
    for i in range(20):
        await _put(journal, reader, b"%03d" % i + b"x" * 297)
    assert reader.journal_reader.read_behind is not None and len(reader.memory) < 20
    taken = []
    for left in range(19, -1, -1):
        item = reader.take(NOW)
        taken.append(item.id)
        assert (reader.items, reader.bytes) == (left, left * 300)
        assert len(reader.memory) <= reader.items
    assert taken == list(range(1, 21))
    assert reader.take(NOW) is None and reader.journal_reader.read_behind is None
    journal.close()


async def test_open_reads_abort_to_the_head_and_expired_ones_expire(tmp_path):
    journal, reader = _journaled_reader(str(tmp_path))
    await _put(journal, reader, b"a")
    await _put(journal, reader, b"b")
    read = reader.open(reader.take(NOW))
    assert (reader.items, len(reader.open_reads)) == (1, 1)
    reader.abort([read])
    assert reader.peek(NOW).data == b"a" and reader.canceled_transactions == 1
    stale = reader.open(reader.take(NOW))
    stale.item = QueueItem(stale.item.id, NOW, 1, 0, b"a")  # past its expiry
    reader.abort([stale])
    assert reader.expired_items == 1 and reader.peek(NOW).data == b"b"
    journal.close()


async def test_flush_with_an_open_read_holds_its_id_only(tmp_path):
    journal, reader = _journaled_reader(str(tmp_path), max_memory_size=600)
    for _ in range(30):
        await _put(journal, reader, b"y" * 100)
    read = reader.open(reader.take(NOW))
    ticket = reader.flush()
    jr = reader.journal_reader
    assert (jr.head, jr.held, jr.done) == (30, {1}, set())
    assert reader.items == 0 and reader.journal_reader.read_behind is None
    journal.flush()
    assert ticket.done and ticket.error is None
    cp = read_checkpoint(reader.journal_reader.progress.path)
    assert (cp.head, cp.held) == (30, {1})
    assert reader.floor() == 0  # the segment of the open read stays
    reader.confirm(read)
    journal.flush()
    assert jr.held == set() and reader.floor() == 0  # until the next rewrite
    journal.close()


async def test_a_failed_confirm_kept_by_a_rewrite_is_rewritten_away_at_once(tmp_path):
    """A confirm appended, then a rewrite of the progress file (which keeps the ids in
    flight as done: they are on disk already), then the confirm's fsync fails: the read
    stays open, and the file is rewritten without it at once, not at the next interval
    (a crash meanwhile would never deliver the item again)."""
    journal, reader = _journaled_reader(str(tmp_path))
    await _put(journal, reader, b"a")
    await _put(journal, reader, b"b")
    read = reader.open(reader.take(NOW))
    asked = []
    reader.ask_rewrites_from(asked.append)  # the queue rewrites it on the loop's next turn
    reader.confirm(read)
    batch = reader.journal_reader.progress.write()  # appended; its group fsync has not finished
    reader.journal_reader.dirty = True  # a state to rewrite
    job = reader.start_compaction()
    job.run()
    reader.finish_compaction(job)
    assert 1 in read_checkpoint(reader.journal_reader.progress.path).done  # the rewrite kept it
    batch.resolve("journal fsync failed: Input/output error")
    assert asked == [reader]
    reader.reopen(read)  # what the session does with a failed confirm
    reader.compact_now()
    assert 1 not in read_checkpoint(reader.journal_reader.progress.path).done
    assert 1 in reader.open_reads and reader.journal_reader.done == set()
    reader.confirm(read)  # confirmed again once the disk takes it
    journal.flush()
    assert 1 in read_checkpoint(reader.journal_reader.progress.path).done
    journal.close()


def test_one_id_read_done_is_the_same_record_as_the_general_form():
    """A READ_DONE of one id has its own fast encoder (issue 28): same bytes, same meaning."""
    general = struct.pack("<Bi", 0x91, 8) + struct.pack("<1q", 12)
    assert codec.encode_read_done([12]) == general
    assert codec.encode_read_done((12,)) == general
    assert codec.encode_read_done([-7]) == struct.pack("<Biq", 0x91, 8, -7)
    data = codec.encode_checkpoint(2) + codec.encode_read_done([5]) + codec.encode_read_done([4])
    assert codec.decode_progress(data) == (2, {4, 5}, set(), None)


EDGES_64 = (0, 1, -1, 255, 256, 2**31, 2**32 + 7, -(2**40), 2**63 - 1, -(2**63))
EDGES_32 = (0, 1, -1, 127, 128, 65535, 2**31 - 1, -(2**31))


def test_put_header_and_one_id_read_done_are_structs_bytes_at_the_edges():
    """The compiled build writes these two records field by field (issue 28): the bytes
    must be the Structs' for every value a field can hold, and out-of-range values are
    refused in both builds."""
    for id_ in EDGES_64:
        assert codec.encode_read_done([id_]) == struct.pack("<Biq", 0x91, 8, id_)
        for add_time in EDGES_64:
            for size in EDGES_32:
                header = codec.put_header(id_, add_time, size, 0, size)
                assert header == struct.pack("<Biiqq", 0x86, size, size, id_, add_time)
    record = codec.put_header(9, 1234, 3) + b"abc"
    assert record == codec.encode_put(9, 1234, b"abc")
    for bad in ((2**63, 0, 1), (1, -(2**63) - 1, 1), (1, 0, 2**31), (1, 0, -(2**31) - 1)):
        try:
            codec.put_header(*bad)
        except (OverflowError, struct.error):
            continue
        raise AssertionError(f"put_header{bad} was not refused")


def test_file_writes_are_whole_and_raise_like_os_write(tmp_path):
    """kestreld.journal.fileio (write(2)/writev(2) without the GIL dance when compiled)."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        fileio.write_all(fd, b"head;")
        fileio.write_chunks(fd, [b"a", b"", b"bc;"], 4)
        many = [bytes([65 + i % 26]) for i in range(fileio.WRITEV_CHUNKS * 2 + 3)]
        fileio.write_chunks(fd, many, len(many))  # more than one writev takes: joined
        fileio.write_chunks(fd, [], 0)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head;abc;" + b"".join(many)
    for call in (lambda: fileio.write_all(fd, b"x"), lambda: fileio.write_chunks(fd, [b"x"], 1)):
        try:
            call()
        except OSError as e:
            assert e.errno == errno.EBADF
        else:
            raise AssertionError("a write to a closed descriptor did not raise")


def test_a_put_with_no_event_loop_is_written_and_offered_at_once(tmp_path):
    """Offline (no running loop, as the tools drive a queue): the journal writes each put
    at once, and the queue acknowledges it at once: its readers have it, nothing pending."""
    from kestreld.journal.clock import now_ms
    from kestreld.queues.collection import QueueCollection
    from kestreld.server import build_server_config

    config = build_server_config(None, {"queue_path": str(tmp_path), "port": 0})
    queues = QueueCollection(config)
    try:
        for data in (b"a", b"bc"):
            batch = queues.put("q", data, 0, now_ms())
            assert batch is None or (batch.done and batch.error is None)
        queue = queues.queues["q"]
        assert (queue.pending_items, queue.pending_bytes, queue._unacked) == (0, 0, [])
        reader = queues.reader("q", False)
        assert (reader.items, reader.bytes) == (2, 3)
        assert [reader.take(now_ms()).data for _ in range(2)] == [b"a", b"bc"]
    finally:
        queues.close()
