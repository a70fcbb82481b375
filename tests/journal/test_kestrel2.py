"""The Kestrel 2.x journal reader: decoding, finding files, replaying a queue."""

from __future__ import annotations

import os

import pytest
from kestrel2_encoding import (
    add,
    add_xid,
    addx,
    confirm_remove,
    continue_,
    remove,
    remove_tentative,
    remove_tentative_xid,
    save_xid,
    state_dump,
    unremove,
    write_journal,
)

from kestreld.journal import codec
from kestreld.journal.kestrel2 import (
    REPLAY_BATCH,
    ItemData,
    journal_files,
    replay,
    scan_kestrel2,
    scan_kestrel2_folder,
)

T = 1_700_000_000_000  # an add time (ms)
IMPORT_TIME = 1_800_000_000_000


def datas(result) -> list[bytes]:
    return [item.data for item in result.items]


def replay_ops(tmp_path, *ops: bytes, **kw):
    path = write_journal(tmp_path, "q", *ops)
    return replay([path], import_time_ms=IMPORT_TIME, **kw)


# --- decoding -------------------------------------------------------------------------


def test_scan_decodes_every_opcode_of_kestrel_2_1() -> None:
    buf = b"".join(
        [
            add(b"a", 0),
            remove(),
            addx(b"bb", T, T + 5000),
            remove_tentative(),
            save_xid(41),
            unremove(42),
            confirm_remove(43),
            add_xid(44, b"ccc", T + 1),
            continue_(45, b"dddd", T + 2, T + 9),
            remove_tentative_xid(46),
        ]
    )
    ops, stop, problem = scan_kestrel2(buf)
    assert problem is None and stop == len(buf)
    got = [(o.opcode, o.name, o.xid, o.add_time, o.expire_time, o.size, o.data) for o in ops]
    assert got == [
        (0, "ADD", None, None, None, 1, b"a"),
        (1, "REMOVE", None, None, None, None, None),
        (2, "ADDX", None, T, T + 5000, 2, b"bb"),
        (3, "REMOVE_TENTATIVE", None, None, None, None, None),
        (4, "SAVE_XID", 41, None, None, None, None),
        (5, "UNREMOVE", 42, None, None, None, None),
        (6, "CONFIRM_REMOVE", 43, None, None, None, None),
        (7, "ADD_XID", 44, T + 1, None, 3, b"ccc"),
        (8, "CONTINUE", 45, T + 2, T + 9, 4, b"dddd"),
        (9, "REMOVE_TENTATIVE_XID", 46, None, None, None, None),
    ]


def test_offsets_and_lengths_match_the_bytes_in_the_file() -> None:
    records = [add(b"a"), remove(), addx(b"hello world", T), save_xid(1), add_xid(2, b"x", T)]
    ops, _, _ = scan_kestrel2(b"".join(records))
    offset = 0
    for op, record in zip(ops, records, strict=True):
        assert op.offset == offset
        assert op.length == len(record)
        offset += len(record)


def test_add_expiry_in_seconds_becomes_ms_and_zero_means_none() -> None:
    ops, _, _ = scan_kestrel2(add(b"x", 1_700_000_000) + add(b"y", 0))
    assert [o.expire_time for o in ops] == [1_700_000_000_000, None]
    assert [o.add_time for o in ops] == [None, None]


def test_zero_expiry_of_addx_means_none() -> None:
    ops, _, _ = scan_kestrel2(addx(b"x", T, 0))
    assert ops[0].expire_time is None


def test_opcode_8_is_continue_unless_kestrel_2_0() -> None:
    ops, _, problem = scan_kestrel2(continue_(7, b"x", T))
    assert problem is None and ops[0].name == "CONTINUE" and ops[0].xid == 7

    ops, stop, problem = scan_kestrel2(state_dump(7, 3) + remove(), kestrel_2_0=True)
    assert problem is None and stop == 10
    assert (ops[0].name, ops[0].xid, ops[0].count, ops[0].length) == ("STATE_DUMP", 7, 3, 9)
    assert ops[1].name == "REMOVE"


def test_scan_without_data_gives_sizes_and_data_offsets() -> None:
    buf = save_xid(1) + addx(b"hello", T) + add_xid(3, b"xyz", T)
    ops, _, _ = scan_kestrel2(buf, include_data=False)
    assert [o.data for o in ops] == [None, None, None]
    assert [buf[o.data_offset : o.data_offset + o.size] for o in ops[1:]] == [b"hello", b"xyz"]


def test_scan_with_a_limit_returns_a_position_to_resume_from() -> None:
    buf = remove() * 5 + addx(b"x", T)
    ops, stop, problem = scan_kestrel2(buf, limit=3)
    assert (len(ops), stop, problem) == (3, 3, None)
    ops, stop, problem = scan_kestrel2(buf, stop, limit=3)
    assert [o.name for o in ops] == ["REMOVE", "REMOVE", "ADDX"]
    assert (stop, problem) == (len(buf), None)


def test_every_truncation_keeps_the_complete_records_before_it() -> None:
    records = [
        save_xid(1),
        addx(b"hello", T),
        add(b"abc", 5),
        add_xid(2, b"q", T),
        remove_tentative(),
    ]
    buf = b"".join(records)
    starts = [sum(len(r) for r in records[:i]) for i in range(len(records) + 1)]
    for cut in range(len(buf)):
        ops, stop, problem = scan_kestrel2(buf[:cut])
        complete = [s for s in starts[1:] if s <= cut]
        assert len(ops) == len(complete), cut
        if cut in starts:
            assert problem is None and stop == cut
        else:
            assert stop == max([0, *complete])
            assert problem is not None and f"offset {stop}" in problem


def test_unknown_opcode_stops_decoding_at_its_offset() -> None:
    buf = addx(b"ok", T) + bytes([0x2A]) + addx(b"lost", T)
    ops, stop, problem = scan_kestrel2(buf)
    assert [o.data for o in ops] == [b"ok"]
    assert stop == 23
    assert problem == "unknown opcode 42 (0x2a) at offset 23"


def test_size_overrunning_the_file_is_reported_with_the_sizes() -> None:
    bad = bytes([2]) + (1_000_000).to_bytes(4, "little") + b"\0" * 40
    ops, stop, problem = scan_kestrel2(addx(b"ok", T) + bad)
    assert len(ops) == 1 and stop == 23
    assert "ADDX at offset 23 declares 1000000 bytes but only 40 remain" in problem


def test_add_with_size_below_4_is_a_fault() -> None:
    bad = bytes([0]) + (3).to_bytes(4, "little") + b"\0" * 8
    ops, stop, problem = scan_kestrel2(add(b"ok") + bad)
    assert len(ops) == 1 and stop == len(add(b"ok"))
    assert problem == f"ADD at offset {stop} with size 3 (< 4)"


def test_addx_with_size_below_16_or_negative_is_a_fault() -> None:
    for size in (15, -1):
        bad = bytes([2]) + size.to_bytes(4, "little", signed=True) + b"\0" * 20
        ops, stop, problem = scan_kestrel2(bad)
        assert ops == [] and stop == 0
        assert problem == f"ADDX at offset 0 with size {size} (< 16)"


# --- files in a folder ----------------------------------------------------------------


def test_rotated_files_replay_oldest_first_then_the_live_file(tmp_path) -> None:
    for name in ("jobs", "jobs.1000", "jobs.200", "jobs.30000"):
        write_journal(tmp_path, name, remove())
    assert journal_files(str(tmp_path)) == {
        "jobs": [str(tmp_path / n) for n in ("jobs.200", "jobs.1000", "jobs.30000", "jobs")]
    }


def test_a_pack_file_supersedes_rotated_files_up_to_its_timestamp(tmp_path) -> None:
    for name in ("cars", "cars.904", "cars.950", "cars.951", "cars.950.pack"):
        write_journal(tmp_path, name, remove())
    found = scan_kestrel2_folder(str(tmp_path))
    assert found.queues == {
        "cars": [str(tmp_path / n) for n in ("cars.950.pack", "cars.951", "cars")]
    }
    assert sorted(found.superseded) == [str(tmp_path / "cars.904"), str(tmp_path / "cars.950")]


def test_the_newest_pack_file_supersedes_older_pack_files(tmp_path) -> None:
    for name in ("cars.100.pack", "cars.200.pack", "cars.150", "cars.250"):
        write_journal(tmp_path, name, remove())
    found = scan_kestrel2_folder(str(tmp_path))
    assert found.queues == {"cars": [str(tmp_path / "cars.200.pack"), str(tmp_path / "cars.250")]}
    assert sorted(found.superseded) == [str(tmp_path / "cars.100.pack"), str(tmp_path / "cars.150")]


def test_temporaries_and_native_files_are_not_2x_journals(tmp_path) -> None:
    write_journal(tmp_path, "jobs", remove())
    write_journal(tmp_path, "jobs~~1234", remove())
    write_journal(tmp_path, "jobs.5~~", remove())
    write_journal(tmp_path, "other.1700000000000", codec.WRITER_MAGIC)
    write_journal(tmp_path, "other.read.", codec.encode_checkpoint(0))
    write_journal(tmp_path, ".kestreld-status", b"{}")
    found = scan_kestrel2_folder(str(tmp_path))
    assert found.queues == {"jobs": [str(tmp_path / "jobs")]}
    assert len(found.ignored) == 5


def test_fanout_children_are_listed_as_parent_plus_child(tmp_path) -> None:
    for name in ("orders", "orders+audit", "orders+audit.100", "orders+billing"):
        write_journal(tmp_path, name, remove())
    assert journal_files(str(tmp_path)) == {
        "orders": [str(tmp_path / "orders")],
        "orders+audit": [str(tmp_path / "orders+audit.100"), str(tmp_path / "orders+audit")],
        "orders+billing": [str(tmp_path / "orders+billing")],
    }


# --- replay ---------------------------------------------------------------------------


def test_replay_applies_adds_and_removes_in_order(tmp_path) -> None:
    result = replay_ops(tmp_path, addx(b"a", T), addx(b"b", T), remove(), addx(b"c", T))
    assert datas(result) == [b"b", b"c"]
    assert result.problems == [] and result.warnings == [] and result.ops == 4


def test_add_items_get_the_import_time_as_add_time(tmp_path) -> None:
    result = replay_ops(tmp_path, add(b"old", 1_900_000_000), addx(b"new", T, T + 1))
    assert [(i.add_time, i.expire_time) for i in result.items] == [
        (IMPORT_TIME, 1_900_000_000_000),
        (T, T + 1),
    ]


def test_expired_items_are_kept_with_their_expiry(tmp_path) -> None:
    result = replay_ops(tmp_path, addx(b"stale", T, T + 1))
    assert [(i.data, i.expire_time) for i in result.items] == [(b"stale", T + 1)]


def test_open_transactions_return_to_head_lowest_xid_first(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        *(addx(d, T) for d in (b"a", b"b", b"c", b"d")),
        remove_tentative_xid(30),  # a
        remove_tentative_xid(10),  # b
        remove_tentative_xid(20),  # c
    )
    assert datas(result) == [b"b", b"c", b"a", b"d"]
    assert result.open_returned == 3


def test_remove_tentative_takes_the_next_xid_after_save_xid(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        save_xid(41),
        addx(b"a", T),
        addx(b"b", T),
        remove_tentative(),  # a: xid 42
        remove_tentative(),  # b: xid 43
        confirm_remove(42),
    )
    assert datas(result) == [b"b"]
    assert result.warnings == [] and result.open_returned == 1


def test_next_xid_skips_xids_still_open(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        *(addx(d, T) for d in (b"a", b"b", b"c")),
        remove_tentative_xid(2),  # a
        save_xid(1),
        remove_tentative(),  # b: 2 is open, so 3
        confirm_remove(3),
    )
    assert datas(result) == [b"a", b"c"]
    assert result.warnings == []


def test_unremove_puts_the_item_back_at_the_head(tmp_path) -> None:
    result = replay_ops(
        tmp_path, addx(b"a", T), addx(b"b", T), remove_tentative(), unremove(1), remove()
    )
    assert datas(result) == [b"b"]
    assert result.open_returned == 0


def test_confirm_remove_finishes_the_transaction(tmp_path) -> None:
    result = replay_ops(
        tmp_path, addx(b"a", T), addx(b"b", T), remove_tentative(), confirm_remove(1)
    )
    assert datas(result) == [b"b"]
    assert result.open_returned == 0


def test_remove_tentative_right_after_add_xid_takes_that_xid(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        save_xid(100),
        add_xid(7, b"open", T),
        remove_tentative(),  # xid 7, not 101
        addx(b"queued", T),
        confirm_remove(7),
    )
    assert datas(result) == [b"queued"]
    assert result.warnings == []


def test_remove_tentative_not_right_after_add_xid_takes_the_next_xid(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        save_xid(100),
        add_xid(7, b"a", T),
        addx(b"b", T),
        remove_tentative(),  # a, with xid 101
        confirm_remove(101),
    )
    assert datas(result) == [b"b"]
    assert result.warnings == []


def test_continue_confirms_the_xid_and_appends_its_item(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        addx(b"a", T),
        addx(b"b", T),
        remove_tentative_xid(5),
        continue_(5, b"c", T + 1, T + 2),
    )
    assert [(i.data, i.add_time, i.expire_time) for i in result.items] == [
        (b"b", T, None),
        (b"c", T + 1, T + 2),
    ]
    assert result.open_returned == 0


def test_kestrel_2_0_state_dump_sets_the_xid_counter(tmp_path) -> None:
    result = replay_ops(
        tmp_path,
        state_dump(9, 0),
        addx(b"a", T),
        remove_tentative(),  # xid 10
        confirm_remove(10),
        kestrel_2_0=True,
    )
    assert datas(result) == [] and result.warnings == [] and result.problems == []


def test_removes_on_an_empty_queue_are_warnings_not_faults(tmp_path) -> None:
    result = replay_ops(tmp_path, remove(), remove_tentative(), confirm_remove(9), addx(b"a", T))
    assert datas(result) == [b"a"]
    assert result.problems == []
    assert [(w.offset, w.message) for w in result.warnings] == [
        (0, "REMOVE on an empty queue (ignored)"),
        (1, "REMOVE_TENTATIVE on an empty queue (ignored)"),
        (2, "CONFIRM_REMOVE of xid 9, which is not open (ignored)"),
    ]


def test_files_replay_as_one_contiguous_journal(tmp_path) -> None:
    first = write_journal(tmp_path, "q.100", addx(b"a", T), addx(b"b", T), remove_tentative_xid(3))
    second = write_journal(tmp_path, "q", confirm_remove(3), addx(b"c", T))
    result = replay([first, second], import_time_ms=IMPORT_TIME)
    assert datas(result) == [b"b", b"c"]
    assert result.file_bytes == os.path.getsize(first) + os.path.getsize(second)


def test_fault_in_a_rotated_file_keeps_records_before_it_and_goes_on_with_the_next_file(
    tmp_path,
) -> None:
    good = addx(b"a", T) + addx(b"b", T)
    rotated = write_journal(tmp_path, "q.100", good, bytes([0x63]), addx(b"lost", T))
    live = write_journal(tmp_path, "q", remove(), addx(b"c", T))
    result = replay([rotated, live], import_time_ms=IMPORT_TIME)
    assert datas(result) == [b"b", b"c"]
    [problem] = result.problems
    assert (problem.path, problem.offset) == (rotated, len(good))
    assert problem.dropped_bytes == 1 + len(addx(b"lost", T))
    assert "unknown opcode 99" in problem.message


def test_truncated_last_record_of_the_last_file_is_dropped_and_reported(tmp_path) -> None:
    whole = addx(b"a", T) + addx(b"partial", T)
    path = write_journal(tmp_path, "q", whole[:-3])
    result = replay([path], import_time_ms=IMPORT_TIME)
    assert datas(result) == [b"a"]
    [problem] = result.problems
    assert problem.offset == 22 and problem.dropped_bytes == len(whole) - 3 - 22
    assert str(problem).startswith("q: ADDX at offset 22 declares")
    assert str(problem).endswith(f"; {problem.dropped_bytes} bytes dropped")


def test_replay_without_data_reads_items_through_item_data(tmp_path) -> None:
    path = write_journal(tmp_path, "q", addx(b"hello", T), add(b"world"))
    result = replay([path], import_time_ms=IMPORT_TIME, include_data=False)
    assert [i.data for i in result.items] == [None, None]
    with ItemData() as data:
        assert [data(i) for i in result.items] == [b"hello", b"world"]


def test_replay_reports_progress_in_file_bytes(tmp_path) -> None:
    a = write_journal(tmp_path, "q.1", addx(b"a", T))
    b = write_journal(tmp_path, "q", addx(b"bb", T))
    seen: list[int] = []
    replay([a, b], import_time_ms=IMPORT_TIME, progress=seen.append)
    assert seen == sorted(seen)
    assert seen[-1] == os.path.getsize(a) + os.path.getsize(b)


def test_empty_journal_file_replays_to_an_empty_queue(tmp_path) -> None:
    result = replay_ops(tmp_path)
    assert result.items == [] and result.problems == [] and result.ops == 0


@pytest.mark.parametrize("count", [3, REPLAY_BATCH + 10])
def test_large_journals_replay_in_batches_with_the_same_result(tmp_path, count) -> None:
    ops = [addx(str(i).encode(), T + i) for i in range(count)] + [remove()] * (count // 2)
    result = replay_ops(tmp_path, *ops)
    assert datas(result) == [str(i).encode() for i in range(count // 2, count)]


def test_a_file_that_cannot_be_opened_is_a_fault_and_replay_goes_on(tmp_path) -> None:
    live = write_journal(tmp_path, "q", addx(b"a", T))
    missing = str(tmp_path / "q.100")
    result = replay([missing, live], import_time_ms=IMPORT_TIME)
    assert datas(result) == [b"a"]
    [problem] = result.problems
    assert (problem.path, problem.offset) == (missing, 0)
    assert problem.message.startswith("cannot read the file:")
