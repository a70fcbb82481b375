"""The framing knows every memcache command's shape: payloads are never commands.

Raw sockets against a real server process.  Every storage and meta command
carrying a payload that would be destructive as a command (``flush_all``,
``shutdown``, ``delete <q>``) leaves the queues and the server untouched.
"""

from __future__ import annotations

import socket
import time

import pytest
from kestreld_process import Conn

STORAGE_WORDS = ["add", "replace", "append", "prepend"]


def _requests_with_payload(word: str, key: str, payload: bytes) -> bytes:
    n = len(payload)
    if word == "cas":
        line = f"cas {key} 0 0 {n} 1\r\n"
    elif word == "ms":
        line = f"ms {key} {n}\r\n"
    else:
        line = f"{word} {key} 0 0 {n}\r\n"
    return line.encode() + payload + b"\r\n"


@pytest.mark.parametrize("word", STORAGE_WORDS + ["cas", "ms"])
@pytest.mark.parametrize("payload", ["flush_all", "shutdown", "delete {q}", "set {q} 0 0 1\r\nz"])
def test_a_payload_is_never_run_as_a_command(server, qname, word, payload):
    c = Conn(server.connect())
    assert c.set(qname, "keep") == b"STORED"
    data = payload.format(q=qname).encode()
    c.send(_requests_with_payload(word, "k", data) + b"version\r\n")
    assert c.line() == f"CLIENT_ERROR {word} is not supported by a queue server".encode()
    assert c.line().startswith(b"VERSION ")
    assert c.get(qname) == b"keep"
    assert c.get(qname) is None  # the "set" in the payload stored nothing
    assert server.proc.poll() is None
    assert Conn(server.connect()).stats()["curr_items"] is not None


@pytest.mark.parametrize("word", STORAGE_WORDS + ["cas"])
def test_noreply_storage_commands_answer_nothing(conn, qname, word):
    block = _requests_with_payload(word, "k", b"flush_all").replace(b"\r\n", b" noreply\r\n", 1)
    conn.send(block + b"version\r\n")
    assert conn.line().startswith(b"VERSION ")


def test_a_payload_split_across_packets_is_still_skipped(conn, qname):
    conn.set(qname, "keep")
    for part in (b"add k 0 0 9\r\nflu", b"sh_a", b"ll\r", b"\nversion\r\n"):
        conn.send(part)
        time.sleep(0.01)
    assert conn.line().startswith(b"CLIENT_ERROR add")
    assert conn.line().startswith(b"VERSION ")
    assert conn.get(qname) == b"keep"


@pytest.mark.parametrize(
    "request_line",
    [
        "incr k 1",
        "decr k 1",
        "touch k 10",
        "gat 0 k",
        "gats 0 k",
        "mg k v",
        "md k",
        "mn",
        "verbosity 1",
    ],
)
def test_other_memcached_commands_get_one_error_line(conn, request_line):
    conn.send(request_line + "\r\nversion\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR ")
    assert conn.line().startswith(b"VERSION ")


@pytest.mark.parametrize(
    "request_line",
    ["incr k 1 noreply", "decr k 1 noreply", "touch k 10 noreply", "verbosity 1 noreply"],
)
def test_noreply_on_unsupported_commands_answers_nothing(conn, request_line):
    conn.send(request_line + "\r\nversion\r\n")
    assert conn.line().startswith(b"VERSION ")


def test_noreply_on_queue_commands(conn, qname):
    conn.set(qname, "x")
    conn.send(
        f"delete {qname} noreply\r\nflush {qname} noreply\r\nflush_expired {qname} noreply\r\n"
        "flush_all_expired noreply\r\nversion\r\n"
    )
    assert conn.line().startswith(b"VERSION ")
    assert conn.get(qname) is None


def test_a_queue_named_noreply_is_a_queue(conn):
    conn.send("delete noreply\r\n")  # the key, not the option
    assert conn.line() == b"DELETED"


# --- noreply on refusals: no reply at all, errors included (memcached's rule) -----------------


def test_noreply_on_not_stored_is_silent(make_server):
    srv = make_server("max_item_size = 4\n")
    c = Conn(srv.connect())
    c.send("set q 0 0 9 noreply\r\nflush_all\r\nversion\r\n")
    assert c.line().startswith(b"VERSION ")


def test_noreply_on_a_full_queue_is_silent(make_server):
    srv = make_server("max_items = 1\n")
    c = Conn(srv.connect())
    assert c.set("q", "1") == b"STORED"
    c.send("set q 0 0 1 noreply\r\n2\r\nversion\r\n")
    assert c.line().startswith(b"VERSION ")
    assert c.get("q") == b"1"
    assert c.get("q") is None


def test_noreply_on_a_bad_name_is_silent(conn):
    conn.send("set ../x 0 0 1 noreply\r\nx\r\ndelete a/b noreply\r\nversion\r\n")
    assert conn.line().startswith(b"VERSION ")


def test_noreply_on_a_bad_data_chunk_is_silent(conn, qname):
    conn.send(f"set {qname} 0 0 2 noreply\r\nabcd\r\nversion\r\n")
    assert conn.line().startswith(b"VERSION ")
    assert conn.get(qname) is None


# --- lengths and terminators ------------------------------------------------------------------


@pytest.mark.parametrize("length", ["99999999999999999999", "-1", "2147483648", "0x10", "1e3"])
def test_an_impossible_length_is_answered_at_once_and_closes(server, length):
    c = Conn(server.connect())
    c.send(f"set q 0 0 {length}\r\n")
    assert c.line() == b"CLIENT_ERROR bad data chunk"
    assert c.closed()


def test_a_storage_line_without_a_length_is_answered_and_closes(server):
    c = Conn(server.connect())
    c.send("add k 0 0\r\nflush_all\r\n")
    assert c.line() == b"CLIENT_ERROR bad command line format"
    assert c.closed()


def test_lf_only_data_blocks_are_accepted_and_nothing_of_the_next_request_is_lost(conn, qname):
    conn.send(f"set {qname} 0 0 3\nabc\nset {qname} 0 0 2\nde\nget {qname}\n")
    assert conn.line() == b"STORED"
    assert conn.line() == b"STORED"
    assert conn.read_value() == b"abc"
    assert conn.get(qname) == b"de"


def test_lf_only_skipped_block_keeps_the_next_request(conn, qname):
    conn.set(qname, "x")
    conn.send(f"add k 0 0 9\nflush_all\nget {qname}\n")
    assert conn.line().startswith(b"CLIENT_ERROR add")
    assert conn.read_value() == b"x"


def test_a_block_with_a_bad_terminator_drops_the_rest_of_that_line(conn, qname):
    conn.send(f"set {qname} 0 0 3\r\nabcdef\r\nget {qname}\r\n")
    assert conn.line() == b"CLIENT_ERROR bad data chunk"
    assert conn.line() == b"END"


# --- get --------------------------------------------------------------------------------------


def test_multi_key_get_never_waits_and_creates_each_queue(conn, qname):
    conn.set(qname + "a", "1")
    started = time.monotonic()
    conn.send(f"get {qname}a {qname}b {qname}a\r\n")
    assert conn.until_end() == [f"VALUE {qname}a 0 1".encode(), b"1", b"END"]
    assert time.monotonic() - started < 5
    stats = conn.stats()
    assert f"queue_{qname}b_items" in stats


@pytest.mark.parametrize("options", ["/open", "/t=100"])
def test_open_or_timeout_with_several_keys_is_a_client_error(conn, qname, options):
    conn.set(qname, "1")
    conn.send(f"get {qname}{options} {qname}b\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR ")
    assert conn.get(qname) == b"1", "nothing was taken"


def test_peek_with_a_timeout_waits_for_an_item_and_leaves_it(server, qname):
    c = Conn(server.connect())
    started = time.monotonic()
    c.send(f"get {qname}/peek/t=3000\r\n")
    time.sleep(0.3)
    Conn(server.connect()).set(qname, "later")
    assert c.read_value() == b"later"
    assert 0.2 < time.monotonic() - started < 3
    assert c.get(qname) == b"later", "a peek leaves the item"


def test_peek_with_a_timeout_ends_at_its_time(conn, qname):
    started = time.monotonic()
    conn.send(f"get {qname}/peek/t=300\r\n")
    assert conn.line() == b"END"
    assert time.monotonic() - started >= 0.25


def test_input_is_paused_while_a_get_waits(server, qname):
    """Requests behind a waiting get stay unread: they run, in order, after its reply."""
    c = Conn(server.connect())
    c.send(f"get {qname}/t=2000\r\nset {qname} 0 0 4\r\nmine\r\nget {qname}\r\n")
    time.sleep(0.3)
    # The set behind the wait has not run: the queue is still empty for others.
    assert Conn(server.connect()).stats()[f"queue_{qname}_items"] == "0"
    Conn(server.connect()).set(qname, "other")
    assert c.read_value() == b"other"
    assert c.line() == b"STORED"
    assert c.read_value() == b"mine"


def test_confirm_with_a_bad_count_is_a_client_error(conn, qname):
    conn.set(qname, "x")
    assert conn.get(f"{qname}/open") == b"x"
    for count in ("-1", "two", "1.5"):
        conn.send(f"confirm {qname} {count}\r\n")
        assert conn.line() == b"CLIENT_ERROR bad count"
    conn.send(f"confirm {qname} 1\r\n")
    assert conn.line() == b"END"


def test_the_connection_survives_everything_above_and_a_bystander_is_served(server, qname):
    bystander = Conn(server.connect())
    c = Conn(server.connect())
    c.send(b"cas k 0 0 8 1\r\nshutdown\r\nms k 9\r\nflush_all\r\nmn\r\nversion\r\n")
    assert bystander.set(qname, "b") == b"STORED"
    assert c.line().startswith(b"CLIENT_ERROR cas")
    assert c.line().startswith(b"CLIENT_ERROR ms")
    assert c.line().startswith(b"CLIENT_ERROR mn")
    assert c.line().startswith(b"VERSION ")
    assert bystander.get(qname) == b"b"


def test_a_half_sent_skipped_block_holds_no_memory_and_the_reply_came_first(server):
    c = Conn(server.connect())
    c.send(b"append k 0 0 100000000\r\n")
    assert c.line().startswith(b"CLIENT_ERROR append")
    c.send(b"x" * (1 << 20))
    c.sock.settimeout(0.3)
    with pytest.raises((TimeoutError, socket.timeout)):
        c.line()


def test_reading_pauses_while_a_get_waits_and_resumes_after(server, qname):
    """Input piling up behind a waiting get is bounded: the server stops reading the socket."""
    c = Conn(server.connect())
    c.send(f"get {qname}/t=20000\r\n")
    time.sleep(0.2)
    request = f"set {qname}x 0 0 1000\r\n".encode() + b"p" * 1000 + b"\r\n"
    chunk = request * 64  # ~64 KiB
    c.sock.setblocking(False)
    sent = 0
    pending = memoryview(chunk)
    stalled_since = None
    while sent < 64 << 20:
        try:
            n = c.sock.send(pending)
        except BlockingIOError:
            if stalled_since is None:
                stalled_since = time.monotonic()
            elif time.monotonic() - stalled_since > 1.0:
                break  # the server stopped reading
            time.sleep(0.01)
            continue
        stalled_since = None
        sent += n
        pending = pending[n:] or memoryview(chunk)
    c.sock.setblocking(True)
    assert sent < 32 << 20, f"{sent} bytes taken behind a waiting get: reading never paused"
    Conn(server.connect()).set(qname, "wake")
    if len(pending) != len(chunk):
        c.sock.sendall(pending)  # the rest of the last chunk: whole requests only
        sent += len(pending)
    assert c.read_value() == b"wake"
    c.sock.settimeout(30)
    for _ in range(sent // len(request)):  # reading resumed: the buffered sets ran, in order
        assert c.line() == b"STORED"
