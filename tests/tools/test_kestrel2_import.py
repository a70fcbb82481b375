"""``kestreld journal import-kestrel2``: Kestrel 2.x journals in, native kestreld files out.

The imported files are checked by decoding them with the native codec: what
each reader would be served is every PUT after its head and not in its done
set.
"""

from __future__ import annotations

import io
import os
import re

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
    write_journal,
)

from kestreld import cli
from kestreld.journal import codec
from kestreld.journal.files import scan_folder
from kestreld.tools.kestrel2_import import SEGMENT_LIMIT, import_kestrel2, main

T = 1_700_000_000_000
NOW = 1_800_000_000_000


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def segments(folder, queue: str) -> list[str]:
    """The queue's writer segments, oldest first."""
    return [path for _, path in scan_folder(str(folder)).queues[queue].segments]


def puts(folder, queue: str) -> list[codec.Put]:
    records: list[codec.Put] = []
    for path in segments(folder, queue):
        with open(path, "rb") as f:
            decoded = codec.decode_file(f.read())
        assert decoded.kind is codec.FileKind.WRITER and decoded.problem is None
        records.extend(decoded.records)  # type: ignore[arg-type]
    return records


def checkpoint(folder, queue: str, reader: str = "") -> tuple[int, set[int]]:
    with open(os.path.join(folder, f"{queue}.read.{reader}"), "rb") as f:
        head, done, problem = codec.decode_checkpoint(f.read())
    assert problem is None
    return head, done


def served(folder, queue: str, reader: str = "") -> list[bytes]:
    """What the reader would be given, in order."""
    head, done = checkpoint(folder, queue, reader)
    return [p.data for p in puts(folder, queue) if p.id > head and p.id not in done]


def files_in(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


# --- one queue ------------------------------------------------------------------------


def test_items_are_written_in_queue_order_with_ids_from_1(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "jobs", *(addx(b"job%d" % i, T + i) for i in range(5)), remove(), remove())
    code, _, _ = run(capsys, old, new)
    assert code == 0
    records = puts(new, "jobs")
    assert [(p.id, p.data) for p in records] == [(1, b"job2"), (2, b"job3"), (3, b"job4")]
    assert all(p.error_count == 0 for p in records)
    assert checkpoint(new, "jobs") == (0, set())


def test_add_and_expiry_times_are_kept(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T, T + 60_000), addx(b"b", T + 1, 0))
    run(capsys, old, new)
    assert [(p.add_time, p.expire_time) for p in puts(new, "q")] == [(T, T + 60_000), (T + 1, 0)]


def test_add_items_get_the_import_time_and_expiry_in_ms(tmp_path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", add(b"a", 1_900_000_000), add(b"b"))
    import_kestrel2(str(old), str(new), now_ms=NOW, out=io.StringIO())
    assert [(p.add_time, p.expire_time) for p in puts(new, "q")] == [
        (NOW, 1_900_000_000_000),
        (NOW, 0),
    ]


def test_segment_names_are_queue_dot_epoch_ms(tmp_path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T))
    import_kestrel2(str(old), str(new), now_ms=NOW, out=io.StringIO())
    assert files_in(new) == [f"q.{NOW}", "q.read."]


def test_open_transactions_become_queued_items_at_the_head(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(
        old,
        "q",
        *(addx(d, T) for d in (b"a", b"b", b"c")),
        remove_tentative_xid(9),  # a
        remove_tentative_xid(4),  # b
    )
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert served(new, "q") == [b"b", b"a", b"c"]
    assert re.search(r"^q\s+1\s+3\s+3\s+2\s+0\s+0$", out, re.M)


def test_every_opcode_replays_into_the_imported_queue(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(
        old,
        "q",
        save_xid(10),
        add_xid(3, b"was-open", T),
        remove_tentative(),  # was-open: xid 3
        add(b"added"),
        addx(b"x1", T + 1),
        addx(b"x2", T + 2),
        remove(),  # added
        remove_tentative(),  # x1: xid 11
        remove_tentative(),  # x2: xid 12
        confirm_remove(11),
        continue_(12, b"continued", T + 3),
        remove_tentative_xid(20),  # continued
        confirm_remove(3),
    )
    run(capsys, old, new)
    assert served(new, "q") == [b"continued"]


def test_rotated_and_pack_files_import_as_one_journal(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q.100", addx(b"dead", T))  # superseded by the pack
    write_journal(old, "q.200.pack", addx(b"p1", T), addx(b"p2", T))
    write_journal(old, "q.300", remove(), addx(b"r1", T))
    write_journal(old, "q", addx(b"live", T))
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert served(new, "q") == [b"p2", b"r1", b"live"]
    assert "skipped: q.100 (superseded by a pack file)" in out


def test_segments_hold_at_most_16_mib(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    big = 5 * 1024 * 1024
    write_journal(old, "q", *(addx(bytes([65 + i]) * big, T + i) for i in range(5)))
    run(capsys, old, new)
    paths = segments(new, "q")
    assert len(paths) == 2
    assert all(os.path.getsize(p) <= SEGMENT_LIMIT for p in paths)
    assert [(p.id, p.data[:1]) for p in puts(new, "q")] == [
        (1, b"A"),
        (2, b"B"),
        (3, b"C"),
        (4, b"D"),
        (5, b"E"),
    ]


def test_an_empty_queue_gets_a_checkpoint_and_no_segment(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "empty", addx(b"a", T), remove())
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert files_in(new) == ["empty.read."]
    assert re.search(r"^empty\s+1\s+0\s+0\s+0\s+0\s+0$", out, re.M)


def test_imported_folder_holds_only_native_files(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "a", addx(b"1", T))
    write_journal(old, "b+c", addx(b"2", T))
    run(capsys, old, new)
    found = scan_folder(str(new))
    assert sorted(found.queues) == ["a", "b"]
    assert found.temporaries == [] and found.kestrel2 == [] and found.unknown == []
    assert not any("~~" in name for name in files_in(new))


# --- fanout ---------------------------------------------------------------------------


def test_fanout_child_becomes_a_reader_of_the_parents_journal(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    items = [addx(b"i%d" % i, T + i) for i in range(4)]
    write_journal(old, "orders", *items, remove(), remove())
    write_journal(old, "orders+audit", *items, remove())
    code, _, _ = run(capsys, old, new)
    assert code == 0
    # i0 was consumed by every reader: it is not written at all
    assert [p.data for p in puts(new, "orders")] == [b"i1", b"i2", b"i3"]
    assert checkpoint(new, "orders") == (1, set())
    assert checkpoint(new, "orders", "audit") == (0, set())
    assert served(new, "orders") == [b"i2", b"i3"]
    assert served(new, "orders", "audit") == [b"i1", b"i2", b"i3"]
    assert not os.path.exists(new / "orders+audit.read.")


def test_child_only_items_are_written_once_and_done_for_the_parent(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T), addx(b"shared", T + 1))
    write_journal(old, "q+one", addx(b"only-child", T + 5), addx(b"shared", T + 1))
    write_journal(old, "q+two", addx(b"only-child", T + 5))
    run(capsys, old, new)
    assert [p.data for p in puts(new, "q")] == [b"a", b"only-child", b"shared"]
    assert checkpoint(new, "q") == (0, {2})
    assert served(new, "q") == [b"a", b"shared"]
    assert served(new, "q", "one") == [b"only-child", b"shared"]
    assert served(new, "q", "two") == [b"only-child"]


def test_parent_items_a_child_lacks_are_in_that_childs_done_set(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    items = [addx(b"i%d" % i, T + i) for i in range(4)]
    write_journal(old, "q", *items)
    # the child reserved i0 and i1, confirmed i1 out of order; i0 is still open at the end
    write_journal(old, "q+c", *items, remove_tentative(), remove_tentative(), confirm_remove(2))
    run(capsys, old, new)
    assert [p.data for p in puts(new, "q")] == [b"i0", b"i1", b"i2", b"i3"]
    assert checkpoint(new, "q", "c") == (0, {2})
    assert served(new, "q", "c") == [b"i0", b"i2", b"i3"]
    assert checkpoint(new, "q") == (0, set())


def test_items_no_reader_holds_fold_into_the_head(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    items = [addx(b"i%d" % i, T + i) for i in range(4)]
    write_journal(old, "q", *items)
    write_journal(old, "q+c", *items, remove(), remove(), remove())
    run(capsys, old, new)
    assert checkpoint(new, "q", "c") == (3, set())
    assert served(new, "q", "c") == [b"i3"]


def test_items_equal_in_data_but_not_add_time_are_different_items(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"same", T))
    write_journal(old, "q+c", addx(b"same", T + 1))
    run(capsys, old, new)
    assert [(p.data, p.add_time) for p in puts(new, "q")] == [(b"same", T), (b"same", T + 1)]
    assert served(new, "q") == [b"same"] and checkpoint(new, "q") == (0, {2})
    assert served(new, "q", "c") == [b"same"] and checkpoint(new, "q", "c") == (1, set())


def test_repeated_equal_items_align_from_the_tail(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    ops = [add(b"tick")] * 5
    write_journal(old, "q", *ops, remove(), remove())
    write_journal(old, "q+c", *ops)
    run(capsys, old, new)
    assert len(puts(new, "q")) == 5
    assert checkpoint(new, "q") == (2, set())
    assert checkpoint(new, "q", "c") == (0, set())


def test_every_reader_sees_exactly_the_items_its_old_journal_held(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    stream = [addx(b"m%02d" % i, T + i) for i in range(12)]
    write_journal(old, "q", *stream[:8], remove(), remove(), remove(), *stream[8:])
    write_journal(old, "q+a", *stream[:3], remove(), *stream[3:], remove_tentative_xid(1))
    write_journal(old, "q+b", addx(b"before", T - 1), *stream[:10], *([remove()] * 7))
    write_journal(old, "q+c", *stream[5:], addx(b"after", T + 99))
    run(capsys, old, new)
    assert served(new, "q") == [b"m%02d" % i for i in range(3, 12)]
    assert served(new, "q", "a") == [b"m%02d" % i for i in range(1, 12)]
    assert served(new, "q", "b") == [b"m%02d" % i for i in range(6, 10)]
    assert served(new, "q", "c") == [b"m%02d" % i for i in range(5, 12)] + [b"after"]
    ids = [p.id for p in puts(new, "q")]
    assert ids == list(range(1, len(ids) + 1))
    # m00 and "before" were consumed by every reader; the rest is written once
    assert [p.data for p in puts(new, "q")] == [b"m%02d" % i for i in range(1, 12)] + [b"after"]


def test_fanout_child_without_a_parent_journal(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "p+c", addx(b"x", T), addx(b"y", T))
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert checkpoint(new, "p") == (2, set())
    assert served(new, "p", "c") == [b"x", b"y"]
    assert re.search(r"^p\s+0\s+0\s+0\s+0\s+0\s+0$", out, re.M)


# --- summary, faults and options ------------------------------------------------------


def test_summary_lists_every_queue_including_empty_ones(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "busy", addx(b"12345", T), addx(b"678", T))
    write_journal(old, "idle", b"")
    write_journal(old, "busy+kid", addx(b"12345", T))
    code, out, _ = run(capsys, old, new)
    assert code == 0
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("queue"))
    assert lines[header].split() == [
        "queue",
        "files",
        "items",
        "bytes",
        "open",
        "returned",
        "faults",
        "warnings",
    ]
    assert [line.split() for line in lines[header + 1 : header + 4]] == [
        ["busy", "1", "2", "8", "0", "0", "0"],
        ["busy+kid", "1", "1", "5", "0", "0", "0"],
        ["idle", "1", "0", "0", "0", "0", "0"],
    ]
    assert (
        "wrote busy: 2 item(s) (ids 1-2) in 1 segment(s); checkpoints busy.read., busy.read.kid"
        in out
    )
    assert "wrote idle: 0 item(s) in no segment; checkpoints idle.read." in out


def test_faults_are_reported_and_the_import_still_succeeds_without_strict(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    good = addx(b"a", T)
    write_journal(old, "q.100", good, bytes([0x42]), addx(b"lost", T))
    write_journal(old, "q", addx(b"b", T), addx(b"torn", T)[:-2])
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert served(new, "q") == [b"a", b"b"]
    assert re.search(r"^q\s+2\s+2\s+2\s+0\s+2\s+0$", out, re.M)
    assert (
        "fault: q: q.100: unknown opcode 66 (0x42) at offset 22; "
        "26 bytes dropped; replay went on with the next file"
    ) in out
    assert (
        "fault: q: q: ADDX at offset 22 declares 20 bytes but only 18 remain "
        "(truncated record or corrupt size); 23 bytes dropped"
    ) in out


def test_strict_with_faults_exits_non_zero_and_writes_nothing(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "clean", addx(b"a", T))
    write_journal(old, "broken", addx(b"a", T), bytes([0x0F]))
    code, out, _ = run(capsys, old, new, "--strict")
    assert code == 1
    assert "--strict: 1 fault(s); nothing written" in out
    assert files_in(new) == []


def test_strict_without_faults_imports(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T), remove())  # a REMOVE too many is a warning only
    write_journal(old, "q.1", remove())
    code, out, _ = run(capsys, old, new, "--strict")
    assert code == 0
    assert "warning: q: q.1 at offset 0: REMOVE on an empty queue (ignored)" in out
    assert files_in(new) == ["q.read."]


def test_an_item_larger_than_16_mib_is_a_fault(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"x" * (codec.MAX_DATA_SIZE + 1), T), addx(b"small", T))
    code, out, _ = run(capsys, old, new)
    assert code == 0
    assert served(new, "q") == [b"small"]
    assert "larger than kestreld's limit of 16777216 bytes; not imported" in out
    assert run(capsys, old, tmp_path / "strict", "--strict")[0] == 1


def test_dry_run_writes_nothing(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T))
    code, out, _ = run(capsys, old, new, "--dry-run")
    assert code == 0
    assert "dry run: nothing written" in out
    assert re.search(r"^q\s+1\s+1\s+1\s+0\s+0\s+0$", out, re.M)
    assert not new.exists()


def test_refuses_to_overwrite_native_files_of_the_same_queue(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    new.mkdir()
    write_journal(old, "q", addx(b"a", T))
    write_journal(old, "other", addx(b"b", T))
    (new / "q.read.").write_bytes(codec.encode_checkpoint(7))
    code, _, err = run(capsys, old, new)
    assert code == 1
    assert "already holds files of queue(s) q" in err
    assert files_in(new) == ["q.read."]
    assert (new / "q.read.").read_bytes() == codec.encode_checkpoint(7)


def test_queue_option_imports_that_queue_and_its_fanout_children(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "a", addx(b"1", T))
    write_journal(old, "a+r", addx(b"1", T))
    write_journal(old, "b", addx(b"2", T))
    code, out, _ = run(capsys, old, new, "--queue", "a")
    assert code == 0
    assert files_in(new)[1:] == ["a.read.", "a.read.r"] and len(files_in(new)) == 3
    assert "\nb " not in out
    assert run(capsys, old, new, "--queue", "b")[0] == 0
    assert served(new, "b") == [b"2"]


def test_queue_option_refuses_a_child_or_unknown_name(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "a+r", addx(b"1", T))
    code, _, err = run(capsys, old, new, "--queue", "a+r")
    assert code == 1 and "its fanout children come with it" in err
    code, _, err = run(capsys, old, new, "--queue", "nope")
    assert code == 1 and "no Kestrel 2.x journal for it" in err
    assert files_in(new) == []


def test_refuses_to_import_a_folder_into_itself(tmp_path, capsys) -> None:
    write_journal(tmp_path, "q", addx(b"a", T))
    code, _, err = run(capsys, tmp_path, tmp_path)
    assert code == 1 and "NEW_DIR must not be OLD_DIR" in err
    assert files_in(tmp_path) == ["q"]


def test_kestrel_2_0_option_reads_opcode_8_as_state_dump(tmp_path, capsys) -> None:
    old = tmp_path / "old"
    old.mkdir()
    write_journal(old, "q", state_dump(5, 0), addx(b"a", T), remove_tentative(), confirm_remove(6))
    code, out, _ = run(capsys, old, tmp_path / "as21")
    assert code == 0 and "fault: q" in out  # as CONTINUE, the STATE_DUMP is a torn record
    code, out, _ = run(capsys, old, tmp_path / "as20", "--kestrel-2.0")
    assert code == 0 and "fault:" not in out and "warning:" not in out
    assert files_in(tmp_path / "as20") == ["q.read."]


def test_progress_bar_goes_to_stderr_for_large_journals(tmp_path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", *(addx(b"x" * 100, T) for _ in range(50)))
    out, err = io.StringIO(), io.StringIO()
    report = import_kestrel2(str(old), str(new), out=out, err=err, progress_min_bytes=1000)
    assert report.exit_code == 0
    assert "replaying [##############################] 100%" in err.getvalue()
    assert "writing [##############################] 100%" in err.getvalue()
    assert "#" not in out.getvalue()
    quiet = io.StringIO()
    import_kestrel2(str(old), str(tmp_path / "n2"), out=io.StringIO(), err=quiet)
    assert quiet.getvalue() == ""


def test_kestreld_cli_runs_the_import(tmp_path, capsys) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    write_journal(old, "q", addx(b"a", T))
    assert cli.main(["journal", "import-kestrel2", str(old), str(new)]) == 0
    assert served(new, "q") == [b"a"]


# --- the real server on an imported folder --------------------------------------------


def drain(client, queue: str) -> list[bytes]:
    items = []
    while (value := client.get(queue)) is not None:
        items.append(value)
    return items


def test_server_serves_imported_queues_and_fanout_readers(tmp_path, capsys, make_server) -> None:
    old, new = tmp_path / "old", tmp_path / "imported"
    old.mkdir()
    future = 4_000_000_000_000  # year 2096
    stream = [addx(b"m%d" % i, T + i) for i in range(5)]
    write_journal(old, "jobs.100", *stream[:3])
    write_journal(
        old,
        "jobs",
        *stream[3:],
        addx(b"expired", T + 10, T + 11),
        addx(b"later", T + 12, future),
        remove(),  # m0
        remove_tentative(),  # m1: open at the end, back at the head
    )
    write_journal(old, "jobs+audit", *stream, addx(b"audit-only", T + 20), remove(), remove())
    write_journal(old, "plain", add(b"legacy"), add(b"x" * 5000))
    code, _, _ = run(capsys, old, new)
    assert code == 0

    srv = make_server(queue_path=new)
    client = srv.client()
    assert drain(client, "jobs") == [b"m1", b"m2", b"m3", b"m4", b"later"]
    assert drain(client, "jobs+audit") == [b"m2", b"m3", b"m4", b"audit-only"]
    assert drain(client, "plain") == [b"legacy", b"x" * 5000]
    client.set("jobs", b"new")
    assert client.get("jobs") == b"new"
    assert client.get("jobs+audit") == b"new"
