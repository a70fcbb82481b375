"""``kestreld journal dump``: every record of native and Kestrel 2.x journal files, readably."""

from __future__ import annotations

import re

from kestrel2_encoding import add, addx, remove, remove_tentative_xid, write_journal

from kestreld import cli
from kestreld.journal import codec
from kestreld.tools.dump import iso_time, main, preview

T = 1_700_000_000_000  # 2023-11-14T22:13:20.000Z


def dump(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def segment(tmp_path, name: str, *records: bytes) -> str:
    return write_journal(tmp_path, name, codec.WRITER_MAGIC, *records)


def test_times_are_iso_8601_utc_with_z() -> None:
    assert iso_time(T) == "2023-11-14T22:13:20.000Z"
    assert iso_time(T + 7) == "2023-11-14T22:13:20.007Z"
    assert iso_time(0) == "1970-01-01T00:00:00.000Z"


def test_data_preview_is_short_and_escaped() -> None:
    assert preview(b'say "hi"\n\x00\xff\\') == '"say \\"hi\\"\\n\\x00\\xff\\\\"'
    assert preview(b"x" * 40) == '"' + "x" * 32 + '"...(+8)'


def test_put_records_show_offset_id_times_sizes_errors_and_data(tmp_path, capsys) -> None:
    path = segment(
        tmp_path,
        "jobs.1700000000000",
        codec.encode_put(100, T, b"hello", error_count=1),
        codec.encode_put(101, T + 1, b"bye", expire_time=T + 60_000),
    )
    code, out, _ = dump(capsys, path)
    assert code == 0
    assert out.splitlines() == [
        f"== {path}: writer segment, {4 + 30 + 36} bytes",
        "         4  PUT         id=100 add=2023-11-14T22:13:20.000Z expire=never size=5 "
        'errors=1 data="hello"',
        "        34  PUT         id=101 add=2023-11-14T22:13:20.001Z "
        'expire=2023-11-14T22:14:20.000Z size=3 errors=0 data="bye"',
    ]


def test_checkpoints_show_head_and_every_done_id(tmp_path, capsys) -> None:
    path = write_journal(
        tmp_path, "jobs.read.audit", codec.encode_checkpoint(511, [515, 513, 514, 520])
    )
    code, out, _ = dump(capsys, path)
    assert code == 0
    assert "         4  READ_HEAD   id=511" in out
    assert "        13  READ_DONE   count=4 ids=[513-515, 520]" in out


def test_unknown_native_commands_are_shown_and_skipped(tmp_path, capsys) -> None:
    unknown = bytes([0x51]) + b"\0" * 4  # command 5, one header word
    path = segment(tmp_path, "q.1", unknown, codec.encode_put(1, T, b"after"))
    _, out, _ = dump(capsys, path)
    assert "         4  UNKNOWN     command=5 length=5 (skipped)" in out
    assert 'data="after"' in out


def test_a_truncated_tail_is_reported_after_the_records_before_it(tmp_path, capsys) -> None:
    good = codec.encode_put(1, T, b"kept")
    path = segment(tmp_path, "q.1", good, codec.encode_put(2, T, b"torn")[:-1])
    code, out, _ = dump(capsys, path)
    assert code == 1  # damage found, the records before it dumped
    lines = out.splitlines()
    assert 'data="kept"' in lines[1]
    assert lines[2] == f"   problem: truncated record at offset {4 + len(good)} (28 bytes cut)"


def test_a_corrupt_record_is_reported_not_crashed_on(tmp_path, capsys) -> None:
    path = segment(tmp_path, "q.1", bytes.fromhex("81ffffff7f"))
    code, out, _ = dump(capsys, path)
    assert code == 1
    assert "problem: corrupt record at offset 4: item too large (2147483647 bytes)" in out


def test_a_zero_filled_tail_is_the_end_of_data(tmp_path, capsys) -> None:
    path = segment(tmp_path, "q.1", codec.encode_put(1, T, b"a"), b"\0" * 100)
    _, out, _ = dump(capsys, path)
    assert "problem" not in out
    path = segment(tmp_path, "q.2", codec.encode_put(1, T, b"a"), b"\0" * 10 + b"\x01")
    _, out, _ = dump(capsys, path)
    assert "problem: data after the end marker at offset 30" in out


def test_kestrel2_journals_are_dumped_op_by_op(tmp_path, capsys) -> None:
    path = write_journal(
        tmp_path,
        "jobs",
        add(b"old", 1_700_000_000),
        addx(b"new", T),
        remove_tentative_xid(3),
        remove(),
    )
    code, out, _ = dump(capsys, path)
    assert code == 0
    assert out.splitlines() == [
        f"== {path}: Kestrel 2.x journal, 42 bytes",
        '         0  ADD                  add=(import time) expire=2023-11-14T22:13:20.000Z size=3 data="old"',
        '        12  ADDX                 add=2023-11-14T22:13:20.000Z expire=never size=3 data="new"',
        "        36  REMOVE_TENTATIVE_XID xid=3",
        "        41  REMOVE",
    ]


def test_kestrel2_faults_are_reported_with_their_offset(tmp_path, capsys) -> None:
    path = write_journal(tmp_path, "jobs.1000", addx(b"a", T), bytes([0x77, 1, 2]))
    code, out, err = dump(capsys, path)
    assert code == 1
    problem = "unknown opcode 119 (0x77) at offset 22; 3 bytes not decoded"
    assert out.splitlines()[-1] == f"   problem: {problem}"
    assert err == f"journal dump: {path}: damaged: {problem}\n"


def test_a_folder_means_every_journal_file_in_it(tmp_path, capsys) -> None:
    segment(tmp_path, "q.1700000000000", codec.encode_put(1, T, b"a"))
    write_journal(tmp_path, "q.read.", codec.encode_checkpoint(0))
    write_journal(tmp_path, "old", addx(b"b", T))
    write_journal(tmp_path, "q.read.~~123", codec.encode_checkpoint(0))
    write_journal(tmp_path, "notes.txt", b"hello")
    code, out, err = dump(capsys, tmp_path)
    assert code == 0
    assert err.splitlines() == [
        f"journal dump: {tmp_path}/notes.txt: skipped: not a journal file",
        f"journal dump: {tmp_path}/q.read.~~123: skipped: a temporary "
        "(the server deletes it at start-up)",
    ]
    assert re.findall(r"^== (\S+):", out, re.M) == [
        f"{tmp_path}/old",
        f"{tmp_path}/q.1700000000000",
        f"{tmp_path}/q.read.",
    ]


def test_stats_print_one_summary_line_per_file(tmp_path, capsys) -> None:
    seg = segment(
        tmp_path,
        "q.1",
        codec.encode_put(7, T, b"abc"),
        codec.encode_put(8, T, b"de"),
        codec.encode_put(9, T, b"f")[:-1],
    )
    cp = write_journal(tmp_path, "q.read.", codec.encode_checkpoint(6, [8]))
    old = write_journal(tmp_path, "q", addx(b"xy", T), remove_tentative_xid(4), remove())
    code, out, err = dump(capsys, "--stats", seg, cp, old)
    assert code == 1  # the truncated record
    assert err == f"journal dump: {seg}: damaged: truncated record at offset 59 (25 bytes cut)\n"
    assert out.splitlines() == [
        f"{seg}: writer segment, 84 bytes, 2 records, 2 items, 5 data bytes, ids 7-8, "
        "problems: truncated record at offset 59 (25 bytes cut)",
        f"{cp}: reader checkpoint, 26 bytes, head 6, 1 done id(s) (8-8), problems: none",
        f"{old}: Kestrel 2.x journal, 29 bytes, 3 ops, 1 items, 2 data bytes, xids 4-4 "
        "(ADDX 1, REMOVE 1, REMOVE_TENTATIVE_XID 1), problems: none",
    ]


def test_a_folder_names_each_damaged_checkpoint_exits_1_and_dumps_the_rest(
    tmp_path, capsys
) -> None:
    seg = segment(tmp_path, "jobs.1700000000000", codec.encode_put(1, T, b"a"))
    (tmp_path / "jobs.read.").write_bytes(bytes(range(7, 71)))  # 64 bytes, no magic
    (tmp_path / "jobs.read.audit").write_bytes(b"")
    code, out, err = dump(capsys, "--stats", tmp_path)
    assert code == 1
    assert out.splitlines() == [
        f"{seg}: writer segment, 30 bytes, 1 records, 1 items, 1 data bytes, ids 1-1, "
        "problems: none"
    ]
    assert err.splitlines() == [
        f"journal dump: {tmp_path}/jobs.read.: damaged: named as a reader checkpoint but does "
        "not start with its magic (first bytes 0708090a, 64 bytes)",
        f"journal dump: {tmp_path}/jobs.read.audit: damaged: named as a reader checkpoint "
        "but empty (0 bytes)",
    ]


def test_a_healthy_folder_exits_0_with_nothing_on_stderr(tmp_path, capsys) -> None:
    segment(tmp_path, "jobs.1700000000000", codec.encode_put(1, T, b"a"))
    write_journal(tmp_path, "jobs.read.", codec.encode_checkpoint(1))
    code, out, err = dump(capsys, "--stats", tmp_path)
    assert (code, err) == (0, "")
    assert len(out.splitlines()) == 2


def test_missing_paths_and_non_journal_files_exit_1(tmp_path, capsys) -> None:
    other = write_journal(tmp_path, "notes.txt", b"hello")
    code, _, err = dump(capsys, tmp_path / "missing", other)
    assert code == 1
    assert "missing: no such file or folder" in err
    assert "notes.txt: not a journal file" in err


def test_kestreld_cli_runs_the_dump(tmp_path, capsys) -> None:
    path = segment(tmp_path, "q.1", codec.encode_put(1, T, b"via cli"))
    assert cli.main(["journal", "dump", path]) == 0
    assert 'data="via cli"' in capsys.readouterr().out


def test_a_damaged_checkpoint_dumped_by_name_says_why(tmp_path, capsys) -> None:
    path = tmp_path / "jobs.read."
    path.write_bytes(b"")
    code, _, err = dump(capsys, path)
    assert code == 1
    assert err == (
        f"journal dump: {path}: not a journal file "
        "(named as a reader checkpoint but empty (0 bytes))\n"
    )
