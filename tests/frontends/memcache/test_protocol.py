"""The memcache text protocol, row by row of the reference, against a real server."""

from __future__ import annotations

import socket
import time

import pytest
from kestreld_process import Conn


def test_set_then_get_returns_item_with_key_as_sent(conn, qname):
    assert conn.set(qname, "hello") == b"STORED"
    conn.send(f"get {qname}\r\n")
    assert conn.line() == f"VALUE {qname} 0 5".encode()
    assert conn.exact(7) == b"hello\r\n"
    assert conn.line() == b"END"


def test_get_on_empty_queue_is_end(conn, qname):
    assert conn.get(qname) is None


def test_items_come_out_in_fifo_order(conn, qname):
    for i in range(20):
        assert conn.set(qname, f"item{i}") == b"STORED"
    assert [conn.get(qname) for i in range(20)] == [f"item{i}".encode() for i in range(20)]


def test_value_reply_echoes_options_in_key(conn, qname):
    conn.set(qname, "abc")
    conn.send(f"get {qname}/t=10/open\r\n")
    assert conn.line() == f"VALUE {qname}/t=10/open 0 3".encode()
    conn.exact(5)
    assert conn.line() == b"END"


def test_command_word_is_case_insensitive_queue_name_is_not(conn, qname):
    conn.send(f"SET {qname} 0 0 1\r\nx\r\n")
    assert conn.line() == b"STORED"
    assert conn.get(qname.upper() + "X") is None
    conn.send(f"GeT {qname}\r\n")
    assert conn.read_value() == b"x"


def test_bare_newline_terminators_are_accepted(conn, qname):
    conn.send(f"set {qname} 0 0 2\nhi\r\nget {qname}\n")
    assert conn.line() == b"STORED"
    assert conn.read_value() == b"hi"


def test_runs_of_spaces_and_trailing_spaces_are_ignored(conn, qname):
    conn.send(f"set  {qname}   0 0 3 \r\nabc\r\nstats \r\n")
    assert conn.line() == b"STORED"
    lines = conn.until_end()
    assert lines[0].startswith(b"STAT uptime")


def test_data_block_may_hold_crlf_and_any_byte(conn, qname):
    payload = bytes(range(256)) + b"\r\nEND\r\n\x00"
    assert conn.set(qname, payload) == b"STORED"
    assert conn.get(qname) == payload


def test_zero_byte_item_is_legal(conn, qname):
    assert conn.set(qname, b"") == b"STORED"
    conn.send(f"get {qname}\r\n")
    assert conn.line() == f"VALUE {qname} 0 0".encode()
    assert conn.exact(2) == b"\r\n"
    assert conn.line() == b"END"


def test_pipelined_requests_in_one_packet_reply_in_order(conn, qname):
    reqs = b"".join(f"set {qname} 0 0 2\r\n{i:02d}\r\n".encode() for i in range(50))
    reqs += f"get {qname}\r\nget {qname}\r\nversion\r\n".encode()
    conn.send(reqs)
    assert [conn.line() for _ in range(50)] == [b"STORED"] * 50
    assert conn.read_value() == b"00"
    assert conn.read_value() == b"01"
    assert conn.line().startswith(b"VERSION ")


def test_request_split_across_packets_byte_by_byte(conn, qname):
    req = f"set {qname} 0 0 11\r\nhello world\r\nget {qname}\r\n".encode()
    for i in range(len(req)):
        conn.send(req[i : i + 1])
        time.sleep(0.001)
    assert conn.line() == b"STORED"
    assert conn.read_value() == b"hello world"


def test_large_item_near_max_size_round_trips(conn, qname):
    payload = bytes(range(256)) * (4 * 1024 * 4)  # 4 MiB
    assert conn.set(qname, payload) == b"STORED"
    assert conn.get(qname) == payload


def test_noreply_suppresses_the_reply(conn, qname):
    conn.send(f"set {qname} 0 0 1 noreply\r\na\r\nget {qname}\r\n")
    assert conn.read_value() == b"a"


def test_gets_is_get(conn, qname):
    conn.set(qname, "z")
    conn.send(f"gets {qname}\r\n")
    assert conn.read_value() == b"z"


def test_multi_key_get_answers_one_item_per_queue(conn, qname):
    conn.set(qname, "one")
    conn.set(qname + "b", "two")
    conn.send(f"get {qname} {qname}b {qname}c\r\n")
    assert conn.until_end() == [
        f"VALUE {qname} 0 3".encode(),
        b"one",
        f"VALUE {qname}b 0 3".encode(),
        b"two",
        b"END",
    ]


def test_peek_returns_head_without_removing(conn, qname):
    conn.set(qname, "a")
    conn.set(qname, "b")
    assert conn.get(f"{qname}/peek") == b"a"
    assert conn.get(f"{qname}/peek") == b"a"
    assert conn.get(qname) == b"a"


def test_delete_removes_queue_and_always_replies_deleted(conn, qname):
    conn.set(qname, "a")
    conn.send(f"delete {qname}\r\ndelete {qname}_never_existed\r\n")
    assert conn.line() == b"DELETED"
    assert conn.line() == b"DELETED"
    assert conn.get(qname) is None
    stats = conn.stats()
    assert f"queue_{qname}_never_existed_items" not in stats


def test_flush_drops_every_item(conn, qname):
    for i in range(5):
        conn.set(qname, str(i))
    conn.send(f"flush {qname}\r\n")
    assert conn.line() == b"END"
    assert conn.get(qname) is None
    assert conn.stats()[f"queue_{qname}_total_flushes"] == "1"


def test_flush_all_replies_flushed_all_queues(conn, qname):
    conn.set(qname, "x")
    conn.send("flush_all\r\n")
    assert conn.line() == b"Flushed all queues."
    assert conn.get(qname) is None


def _set_expiring(conn: Conn, queue: str, count: int) -> float:
    """Sets ``count`` items that expire 1 s after they arrive; returns when all have expired."""
    for i in range(count):
        assert conn.set(queue, f"old{i}", exptime=1) == b"STORED"  # relative: 1 s
    return time.time() + 1.05


def _wait_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(left)


def test_flush_expired_counts_discarded_items(make_server):
    # No background sweep: flush_expired is the only thing that discards, so the count is
    # exact.  (An item already expired when it arrives is dropped at once, never counted here.)
    conn = Conn(make_server("expiration_timer_frequency = 0\n").connect())
    expired_at = _set_expiring(conn, "fe", 2)
    conn.set("fe", "new")
    _wait_until(expired_at)
    conn.send("flush_expired fe\r\nflush_expired fe_missing\r\nflush_expired fe\r\n")
    assert [conn.line() for _ in range(3)] == [b"2", b"0", b"0"]
    assert conn.get("fe") == b"new"
    assert conn.get("fe") is None


def test_flush_all_expired_replies_total(make_server):
    conn = Conn(make_server("expiration_timer_frequency = 0\n").connect())
    expired_at = 0.0
    for queue, expired in (("fa", 2), ("fb", 1), ("fc", 0)):
        expired_at = max(expired_at, _set_expiring(conn, queue, expired))
        conn.set(queue, "new")
    _wait_until(expired_at)
    conn.send("flush_all_expired\r\nflush_all_expired\r\n")
    assert [conn.line(), conn.line()] == [b"3", b"0"]
    assert [conn.get(q) for q in ("fa", "fb", "fc")] == [b"new"] * 3


def test_version_has_major_at_least_one(conn):
    conn.send("version\r\n")
    line = conn.line()
    assert line.startswith(b"VERSION ")
    major, minor, patch = line.split()[1].split(b".")
    assert int(major) >= 1


def test_quit_closes_the_connection(server):
    c = Conn(server.connect())
    c.send("quit\r\n")
    assert c.closed()


def test_unknown_command_is_client_error_and_connection_stays(conn):
    conn.send("FROBNICATE now\r\nversion\r\n")
    assert conn.line() == b"CLIENT_ERROR unknown command frobnicate"
    assert conn.line().startswith(b"VERSION")


def test_line_too_long_is_client_error_and_closes(server):
    c = Conn(server.connect())
    c.send(b"get " + b"a" * 9000)
    assert c.line() == b"CLIENT_ERROR line too long"
    assert c.closed()


def test_line_of_exactly_the_limit_is_accepted(server):
    c = Conn(server.connect())
    # 8192 bytes including "\r\n": a get with a (bad, too long) queue name
    line = b"get " + b"a" * (8192 - 6) + b"\r\n"
    assert len(line) == 8192
    c.send(line)
    assert c.line() == b"CLIENT_ERROR bad queue name"
    c.send("version\r\n")
    assert c.line().startswith(b"VERSION")


def test_set_without_crlf_after_data_is_bad_data_chunk_and_not_stored(conn, qname):
    conn.send(f"set {qname} 0 0 3\r\nabcXY")
    assert conn.line() == b"CLIENT_ERROR bad data chunk"
    conn.send("\r\n")
    assert conn.get(qname) is None


def test_set_with_non_numeric_bytes_closes_connection(server):
    c = Conn(server.connect())
    c.send("set q 0 0 abc\r\n")
    assert c.line() == b"CLIENT_ERROR bad data chunk"
    assert c.closed()


def test_set_with_negative_bytes_closes_connection(server):
    c = Conn(server.connect())
    c.send("set q 0 0 -5\r\n")
    assert c.line() == b"CLIENT_ERROR bad data chunk"
    assert c.closed()


def test_set_with_non_numeric_flags_skips_block_and_keeps_connection(conn, qname):
    conn.send(f"set {qname} x 0 5\r\nhello\r\nversion\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")
    assert conn.line().startswith(b"VERSION")
    assert conn.get(qname) is None


def test_set_with_non_numeric_exptime_skips_block(conn, qname):
    conn.send(f"set {qname} 0 soon 5\r\nhello\r\nversion\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")
    assert conn.line().startswith(b"VERSION")


def test_set_over_max_item_size_is_not_stored_and_stream_stays_in_step(make_server):
    srv = make_server("max_item_size = 1024\n")
    c = Conn(srv.connect())
    big = b"x" * 5000
    c.send(b"set big 0 0 5000\r\n" + big + b"\r\nset big 0 0 2\r\nok\r\n")
    assert c.line() == b"NOT_STORED"
    assert c.line() == b"STORED"
    assert c.get("big") == b"ok"


def _status_mib(srv, field: str) -> float:
    """A /proc status figure summed over the server's processes (its workers too)."""
    total = 0
    for pid in srv.pids():
        with open(f"/proc/{pid}/status") as f:
            total += next(int(line.split()[1]) for line in f if line.startswith(field))
    return total / 1024


def _peak_rss_mib(srv) -> float:
    """The server's peak resident memory (VmHWM): a buffered block shows even once freed."""
    return _status_mib(srv, "VmHWM:")


def test_huge_declared_size_is_discarded_as_it_arrives(make_server):
    srv = make_server("max_item_size = 1024\n")
    c = Conn(srv.connect())
    assert c.set("q", "warm") == b"STORED"
    before = _peak_rss_mib(srv)
    size = 50_000_000
    c.send(f"set q 0 0 {size}\r\n".encode())
    assert c.line() == b"NOT_STORED"  # answered at once, from the line alone
    chunk = b"y" * 65536
    sent = 0
    while sent < size // 2:
        c.send(chunk)
        sent += len(chunk)
    c.send("version\r\n")  # still inside the data block: it is payload, not a command
    sent += len("version\r\n")
    c.sock.settimeout(0.3)
    with pytest.raises((TimeoutError, socket.timeout)):
        c.line()
    c.sock.settimeout(30)
    while sent < size:
        part = chunk[: size - sent]
        c.send(part)
        sent += len(part)
    c.send(b"\r\nversion\r\n")
    assert c.line().startswith(b"VERSION ")  # the block ended exactly where it said
    grown = _peak_rss_mib(srv) - before
    assert grown < 16, f"peak memory grew {grown:.0f} MiB for a 48 MiB block that was dropped"
    assert c.get("q") == b"warm"
    assert c.get("q") is None


def test_set_to_fanout_reader_is_client_error(conn, qname):
    conn.send(f"set {qname}+r 0 0 1\r\nx\r\nversion\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")
    assert conn.line().startswith(b"VERSION")


@pytest.mark.parametrize(
    "name",
    [
        "../x",
        "a.b",
        "a/b",
        "q+",
        "+r",
        "a+b+c",
        "~q",
        "..",
        "x" * 201,
        "caf\u00e9",
        "q\x7f",
        "/etc/passwd",
    ],
)
def test_illegal_queue_names_are_refused_and_create_nothing(server, name):
    c = Conn(server.connect())
    raw = name.encode()
    c.send(b"set " + raw + b" 0 0 1\r\nx\r\n")
    assert c.line() == b"CLIENT_ERROR bad queue name"
    # In a get key "/" starts the options: "a/b" is queue "a" with an unknown option.
    cmds = (b"delete ", b"flush ", b"flush_expired ", b"monitor ") + (
        () if "/" in name[1:] else (b"get ",)
    )
    for cmd in cmds:
        c.send(cmd + raw + b"\r\n")
        assert c.line().startswith(b"CLIENT_ERROR"), cmd
    files = [p.name for p in server.queue_path.iterdir()]
    assert not any(".." in f or "/" in f or "\\" in f or f.startswith("~") for f in files)
    assert not (server.queue_path.parent / "x").exists()
    c.close()


def test_nul_byte_in_queue_name_is_refused(conn):
    conn.send(b"get a\x00b\r\n")
    assert conn.line() == b"CLIENT_ERROR bad queue name"


def test_name_of_200_chars_is_legal(conn):
    name = "n" * 200
    assert conn.set(name, "ok") == b"STORED"
    assert conn.get(name) == b"ok"


def test_stats_global_keys_in_reference_order(conn, qname):
    conn.set(qname, "x")
    keys = list(conn.stats())
    expected = (
        "uptime time version curr_items total_items bytes reserved_memory_ratio curr_connections "
        "total_connections cmd_get cmd_set cmd_peek get_hits get_misses bytes_read bytes_written "
        "queue_creates queue_deletes queue_expires"
    ).split()
    assert keys[: len(expected)] == expected


def test_stats_per_queue_keys_in_reference_order(conn, qname):
    conn.set(qname, "x")
    stats = conn.stats()
    prefix = f"queue_{qname}_"
    keys = [k[len(prefix) :] for k in stats if k.startswith(prefix)]
    assert (
        keys
        == (
            "items bytes total_items logsize expired_items mem_items mem_bytes age discarded waiters "
            "open_transactions transactions canceled_transactions total_flushes journal_rewrites "
            "journal_rotations punted_items oldest_item_age"
        ).split()
    )


def test_stats_count_items_bytes_gets_and_hits(conn, qname):
    before = conn.stats()
    conn.set(qname, "12345")
    conn.set(qname, "678")
    conn.get(qname)
    conn.get(qname + "_empty")
    conn.get(f"{qname}/peek")
    after = conn.stats()
    assert after[f"queue_{qname}_items"] == "1"
    assert after[f"queue_{qname}_bytes"] == "3"
    assert after[f"queue_{qname}_total_items"] == "2"
    assert int(after["cmd_set"]) - int(before["cmd_set"]) == 2
    assert int(after["cmd_get"]) - int(before["cmd_get"]) == 2
    assert int(after["cmd_peek"]) - int(before["cmd_peek"]) == 1
    assert int(after["get_hits"]) - int(before["get_hits"]) == 2
    assert int(after["get_misses"]) - int(before["get_misses"]) == 1


def test_stats_lines_of_a_queue_follow_each_change(conn, qname):
    conn.set(qname, "12345")
    first = conn.stats()  # an unchanged queue's lines are kept; a changed one's redone
    conn.set(qname, "678")
    second = conn.stats()
    assert second[f"queue_{qname}_items"] == "2"
    assert int(second[f"queue_{qname}_logsize"]) > int(first[f"queue_{qname}_logsize"])
    assert conn.get(f"{qname}/open") == b"12345"
    third = conn.stats()
    assert third[f"queue_{qname}_items"] == "1"
    assert third[f"queue_{qname}_open_transactions"] == "1"
    conn.send(f"get {qname}/abort\r\n")
    assert conn.line() == b"END"
    fourth = conn.stats()
    assert fourth[f"queue_{qname}_items"] == "2"
    assert fourth[f"queue_{qname}_open_transactions"] == "0"
    assert fourth[f"queue_{qname}_canceled_transactions"] == "1"


def test_stats_and_dump_stats_agree_on_every_queue_figure(conn, qname):
    for data in ("a", "bb", "ccc"):
        conn.set(qname, data)
    assert conn.get(f"{qname}/open") == b"a"
    assert conn.get(f"{qname}/close/open") == b"bb"  # one open read, two transactions
    stats = conn.stats()
    conn.send(f"dump_stats {qname}\r\n")
    lines = conn.until_end()
    dumped = dict(line.decode().strip().split("=", 1) for line in lines[1:-2])
    age = "oldest_item_age"
    assert int(stats[f"queue_{qname}_{age}"]) <= int(dumped.pop(age))
    assert {k: stats[f"queue_{qname}_{k}"] for k in dumped} == dumped


def test_stats_of_an_idle_queue_repeat_but_its_oldest_item_age_grows(conn, qname):
    conn.set(qname, "x")
    first = conn.stats()
    time.sleep(0.05)
    second = conn.stats()
    ours = [k for k in first if k.startswith(f"queue_{qname}_")]
    age = f"queue_{qname}_oldest_item_age"
    assert {k: first[k] for k in ours if k != age} == {k: second[k] for k in ours if k != age}
    assert int(second[age]) >= int(first[age]) + 50


def test_stats_count_a_waiting_get_until_it_times_out(make_server, qname):
    srv = make_server()
    c = Conn(srv.connect())
    c.set(qname, "x")
    assert c.get(qname) == b"x"
    assert c.stats()[f"queue_{qname}_waiters"] == "0"
    waiting = Conn(srv.connect())
    waiting.send(f"get {qname}/t=300\r\n")
    deadline = time.monotonic() + 5
    while c.stats()[f"queue_{qname}_waiters"] != "1":
        assert time.monotonic() < deadline, "the waiting get was never counted"
        time.sleep(0.01)
    assert waiting.line() == b"END"
    assert c.stats()[f"queue_{qname}_waiters"] == "0"


def test_curr_items_excludes_open_reads(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    c.set("a", "1")
    c.set("a", "2")
    c.get("a/open")
    stats = c.stats()
    assert stats["curr_items"] == "1"
    assert stats["queue_a_open_transactions"] == "1"


def test_dump_stats_frames_each_queue(conn, qname):
    conn.set(qname, "abc")
    conn.send(f"dump_stats {qname}\r\n")
    lines = conn.until_end()
    assert lines[0] == f"queue '{qname}' {{".encode()
    assert b"  items=1" in lines
    assert lines[-2] == b"}"


def test_dump_config_shows_every_key_for_a_name_that_is_not_a_queue(conn):
    conn.send("dump_config not_a_queue_yet\r\n")
    lines = conn.until_end()
    assert lines[0] == b"queue 'not_a_queue_yet' {"
    keys = [line.strip().split(b"=")[0].decode() for line in lines[1:-2]]
    assert (
        keys
        == (
            "max_items max_size max_item_size max_age discard_old_when_full journal sync_journal "
            "max_journal_size max_memory_size expire_to_queue max_expire_sweep fanout_only "
            "max_queue_age open_transaction_timeout punt_error_to_queue "
            "punt_many_errors_to_queue punt_many_errors_count"
        ).split()
    )
    assert b"  max_item_size=16777216" in lines
    assert b"  max_items=(none)" in lines
    assert b"  journal=true" in lines


def test_stats_and_delete_never_create_a_queue(conn, qname):
    conn.send(
        f"delete {qname}\r\nflush {qname}\r\nflush_expired {qname}\r\nget {qname}/close\r\nget {qname}/abort\r\n"
    )
    assert conn.line() == b"DELETED"
    assert conn.line() == b"END"
    assert conn.line() == b"0"
    assert conn.line() == b"END"
    assert conn.line() == b"END"
    assert f"queue_{qname}_items" not in conn.stats()


def test_get_creates_queue(conn, qname):
    conn.get(qname)
    assert f"queue_{qname}_items" in conn.stats()


def test_shutdown_command_stops_server_cleanly(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    c.set("keep", "me")
    c.send("shutdown\r\n")
    assert c.closed()
    assert srv.proc.wait(10) == 0
    srv.start()
    assert Conn(srv.connect()).get("keep") == b"me"


def _rss_mib(srv) -> float:
    return _status_mib(srv, "VmRSS:")


def test_client_that_never_reads_replies_is_paused_not_buffered(make_server):
    srv = make_server()
    setup = Conn(srv.connect())
    setup.set("big", b"x" * 1_000_000)
    c = srv.connect()
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    c.settimeout(0.2)
    sent = 0
    req = b"get big/peek\r\n" * 100
    try:
        for _ in range(20000):
            c.send(req)
            sent += len(req)
    except (TimeoutError, BlockingIOError):
        pass
    # The server stopped reading: we could not push all 28 MB of requests
    # (each asking for 1 MB of reply) through, and it holds little of the output.
    assert sent < 20000 * len(req)
    assert _rss_mib(srv) < 200
    # Other clients are still served.
    other = Conn(srv.connect())
    other.send("version\r\n")
    assert other.line().startswith(b"VERSION")
    c.close()


def test_fanout_name_too_long_for_its_checkpoint_file_is_refused(conn):
    # "<queue>.read.<reader>~~<ms>" must fit 255 bytes: 234 characters of names at most.
    conn.send(f"get {'a' * 200}+{'b' * 35}\r\n")
    assert conn.line() == b"CLIENT_ERROR bad queue name"
    assert conn.get(f"{'a' * 200}+{'b' * 34}") is None


def test_value_headers_follow_each_items_key_and_size(conn, qname):
    """The connection reuses its last VALUE header while key and size repeat (issue 28):
    a new size, a new key and the same key again each get their own header."""
    for data in ("aaa", "bbb", "cccc", "dd", "eeee"):
        assert conn.set(qname, data) == b"STORED"
    other = qname + "x"
    assert conn.set(other, "fff") == b"STORED"
    expected = [
        (f"get {qname}", f"VALUE {qname} 0 3", b"aaa"),
        (f"get {qname}", f"VALUE {qname} 0 3", b"bbb"),
        (f"get {other}", f"VALUE {other} 0 3", b"fff"),
        (f"get {qname}", f"VALUE {qname} 0 4", b"cccc"),
        (f"get {qname}/t=1", f"VALUE {qname}/t=1 0 2", b"dd"),
        (f"get {qname}", f"VALUE {qname} 0 4", b"eeee"),
    ]
    for request, header, data in expected:
        conn.send(request + "\r\n")
        assert conn.line() == header.encode()
        assert conn.exact(len(data) + 2) == data + b"\r\n"
        assert conn.line() == b"END"


def test_block_lengths_are_read_afresh_when_they_change(conn, qname):
    """The framing keeps the last length it parsed (issue 28): other lengths, a bad one
    after a good one, and the good one again are all judged as such."""
    conn.send(
        f"set {qname} 0 0 3\r\nabc\r\nset {qname} 0 0 5\r\nhello\r\nset {qname} 0 0 3\r\nxyz\r\n"
    )
    assert [conn.line() for _ in range(3)] == [b"STORED"] * 3
    assert [conn.get(qname) for _ in range(3)] == [b"abc", b"hello", b"xyz"]
    conn.send(f"set {qname} 0 0 3x\r\nabc\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")
