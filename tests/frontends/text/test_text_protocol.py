"""Kestrel's text protocol (docs/protocol.md), over raw sockets to a real kestreld."""

from __future__ import annotations

import time

import pytest
from kestrel_fronts import TextConn, start_fronts


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    proc = start_fronts(tmp_path_factory.mktemp("text") / "queues")
    yield proc
    proc.stop()


@pytest.fixture
def text(fronts):
    c = TextConn(fronts.text_port)
    yield c
    c.close()


def test_the_listening_event_names_every_front_end(fronts):
    [event] = fronts.events("listening")
    assert event["text"].endswith(f":{fronts.text_port}")
    assert event["thrift"].endswith(f":{fronts.thrift_port}")
    assert event["memcache"].endswith(f":{fronts.port}")


def test_put_stores_every_item_line_and_counts_them(text, qname):
    assert text.put(qname, "one", "two", "three") == b"+3"
    assert text.ask(f"get {qname}") == b":one"


def test_put_with_expiry_in_ms_expires_items(text, qname):
    text.send(f"put {qname} 100:\nsoon\n\n")
    assert text.line() == b"+1"
    time.sleep(0.3)
    assert text.ask(f"peek {qname}") == b"*"


def test_put_of_more_than_1024_items_is_refused_whole_and_the_stream_stays_in_step(text, qname):
    body = b"".join(b"x%d\n" % i for i in range(1025))
    text.send(f"put {qname}:\n".encode() + body + b"\n")
    assert text.line() == b"-Too many items in one put (at most 1024)."
    assert text.ask(f"peek {qname}") == b"*"
    assert text.put(qname, "after") == b"+1"


def test_put_of_more_than_64_mib_is_refused_whole_and_the_stream_stays_in_step(text, qname):
    item = b"x" * (16 * 1024 * 1024 - 16)  # each item within max_item_size, five past 64 MiB
    text.send(f"put {qname}:\n".encode() + (item + b"\n") * 5 + b"\n")
    assert text.line() == b"-Too many bytes in one put (at most 67108864)."
    assert text.ask(f"peek {qname}") == b"*"
    assert text.put(qname, "after") == b"+1"


def test_put_needs_a_queue_name_and_a_numeric_expiry(text, qname):
    text.send("put:\nitem\n\n")
    assert text.line() == b"-Queue name required."
    text.send(f"put {qname} soon:\nitem\n\n")
    assert text.line() == b"-Error parsing expiration time."
    assert text.ask(f"peek {qname}") == b"*"


def test_put_to_a_fanout_reader_is_refused(text, qname):
    text.send(f"put {qname}+r:\nitem\n\n")
    assert text.line().startswith(b"-Cannot put to a fanout reader")


def test_get_on_an_empty_queue_answers_star(text, qname):
    assert text.ask(f"get {qname}") == b"*"


def test_get_with_a_timeout_waits_for_an_item(text, fronts, qname):
    other = TextConn(fronts.text_port)
    try:
        text.send(f"get {qname} 5000\n")
        time.sleep(0.2)
        assert other.put(qname, "late") == b"+1"
        assert text.line() == b":late"
    finally:
        other.close()


def test_get_with_a_timeout_answers_star_when_it_runs_out(text, qname):
    started = time.monotonic()
    assert text.ask(f"get {qname} 200") == b"*"
    assert time.monotonic() - started >= 0.15


def test_get_with_a_bad_timeout_is_an_error(text, qname):
    assert text.ask(f"get {qname} soon") == b"-Error parsing timeout."


def test_get_needs_a_queue_name(text):
    assert text.ask("get") == b"-Queue name required."


def test_each_get_confirms_the_previous_one_on_that_queue(text, fronts, qname):
    assert text.put(qname, "a", "b") == b"+2"
    assert text.ask(f"get {qname}") == b":a"
    assert text.ask(f"get {qname}") == b":b"  # a is confirmed now
    text.close()
    # b was open when the connection went: it comes back; a does not.
    other = TextConn(fronts.text_port)
    try:
        assert other.ask(f"get {qname} 2000") == b":b"
        assert other.ask(f"get {qname}") == b"*"
    finally:
        other.close()


def test_a_disconnect_gives_the_open_item_back(fronts, qname):
    first = TextConn(fronts.text_port)
    assert first.put(qname, "held") == b"+1"
    assert first.ask(f"get {qname}") == b":held"
    first.close()
    second = TextConn(fronts.text_port)
    try:
        assert second.ask(f"get {qname} 2000") == b":held"
    finally:
        second.close()


def test_peek_shows_the_head_and_leaves_it(text, qname):
    assert text.put(qname, "head") == b"+1"
    assert text.ask(f"peek {qname}") == b":head"
    assert text.ask(f"peek {qname}") == b":head"
    assert text.ask(f"get {qname}") == b":head"


def test_confirm_closes_that_many_open_reads(text, fronts, qname):
    assert text.put(qname, "x") == b"+1"
    assert text.ask(f"get {qname}") == b":x"
    assert text.ask(f"confirm {qname} 1") == b"+1"
    text.close()
    other = TextConn(fronts.text_port)
    try:
        assert other.ask(f"peek {qname}") == b"*"  # confirmed: not given back
    finally:
        other.close()


def test_confirm_of_more_than_are_open_is_an_error(text, qname):
    assert text.ask(f"confirm {qname} 1") == b"-Not that many transactions open."
    assert text.ask(f"confirm {qname} 0") == b"+0"


def test_confirm_needs_a_queue_and_a_numeric_count(text, qname):
    assert text.ask(f"confirm {qname}") == b"-Queue name & count required."
    assert text.ask(f"confirm {qname} many") == b"-Error parsing count."


def test_monitor_streams_items_then_a_star(text, qname):
    assert text.put(qname, "m1", "m2") == b"+2"
    text.send(f"monitor {qname} 300\n")
    assert [text.line(), text.line(), text.line()] == [b":m1", b":m2", b"*"]
    assert text.ask(f"confirm {qname} 2") == b"+2"


def test_monitor_needs_a_timeout(text, qname):
    assert text.ask(f"monitor {qname}") == b"-Queue name & timeout required."


def test_flush_empties_the_queue(text, qname):
    assert text.put(qname, "a", "b") == b"+2"
    assert text.ask(f"flush {qname}") == b"+0"
    assert text.ask(f"peek {qname}") == b"*"


def test_delete_removes_the_queue(text, qname):
    assert text.put(qname, "a") == b"+1"
    assert text.ask(f"delete {qname}") == b"+0"
    assert text.ask(f"peek {qname}") == b"*"


def test_status_reads_and_sets_the_server_status(text, qname):
    assert text.ask("status") == b":UP"
    assert text.ask("status readonly") == b"+0"
    try:
        assert text.ask("status") == b":READONLY"
        assert text.put(qname, "refused") == b"-server is READONLY"
        assert text.ask("status sideways") == b"-Unknown status."
    finally:
        assert text.ask("status up") == b"+0"
    assert text.put(qname, "ok") == b"+1"


def test_version_answers_with_the_version(text):
    from kestreld import __version__

    assert text.ask("version") == b":" + __version__.encode()


def test_unknown_commands_are_errors_and_keep_the_connection(text, qname):
    assert text.ask("frobnicate now") == b"-Unknown command: frobnicate"
    assert text.ask("") == b"-Unknown command: "
    assert text.put(qname, "still here") == b"+1"


def test_crlf_line_ends_are_accepted(text, qname):
    text.send(f"put {qname}:\r\ncr\r\n\r\n")
    assert text.line() == b"+1"
    assert text.ask(f"get {qname}\r") == b":cr"


def test_quit_closes_the_connection(text):
    text.send("quit\n")
    assert text.closed()


def test_an_over_long_line_is_an_error_and_a_close(text):
    text.send(b"get " + b"q" * 10_000 + b"\n")
    assert text.line().startswith(b"-Request line too long")
    assert text.closed()


def test_shutdown_stops_the_server_gracefully(tmp_path):
    proc = start_fronts(tmp_path / "queues")
    c = TextConn(proc.text_port)
    try:
        assert c.ask("shutdown") == b"+0"
        assert proc.proc.wait(20) == 0
    finally:
        c.close()
        proc.stop()


def test_limits_apply_across_the_three_front_ends(tmp_path):
    from kestrel_fronts import thrift_client
    from thriftpy2.transport import TTransportException

    proc = start_fronts(tmp_path / "queues", 'max_connections = 2\nclient_timeout = "1s"\n')
    text = TextConn(proc.text_port)
    thrift = thrift_client(proc.thrift_port)
    try:
        assert thrift.get_version()
        third = TextConn(proc.text_port)
        assert third.line() == b"-Too many connections."
        assert third.closed()
        third.close()
        late = thrift_client(proc.thrift_port)
        with pytest.raises((TTransportException, ConnectionError)):
            late.get_version()
        late.close()
        # client_timeout: both idle connections are closed within a few seconds.
        assert text.closed(timeout=10)
    finally:
        text.close()
        thrift.close()
        proc.stop()


def test_acknowledged_puts_and_open_reads_survive_kill_9(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues")
    text = TextConn(proc.text_port)
    try:
        assert text.put(qname, "first", "second", "third") == b"+3"
        assert text.ask(f"get {qname}") == b":first"
        assert text.ask(f"get {qname}") == b":second"  # first is confirmed, durably
        proc.restart(crash=True)  # with second still open on this connection
    finally:
        text.close()
    text = TextConn(proc.text_port)
    try:
        assert text.ask(f"get {qname}") == b":second"  # it was open: it came back
        assert text.ask(f"get {qname}") == b":third"
    finally:
        text.close()
        proc.stop()


def test_an_acknowledged_flush_survives_kill_9(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues")
    text = TextConn(proc.text_port)
    try:
        assert text.put(qname, "a", "b", "c") == b"+3"
        assert text.ask(f"flush {qname}") == b"+0"
        proc.restart(crash=True)
    finally:
        text.close()
    text = TextConn(proc.text_port)
    try:
        assert text.ask(f"peek {qname}") == b"*"  # the flush was on disk before +0
    finally:
        text.close()
        proc.stop()
