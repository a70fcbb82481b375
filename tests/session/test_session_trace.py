"""Kestrel's session trace (``enable_session_trace``): an event per client session start
and end, and the client's address on the queue events a session causes."""

from __future__ import annotations

import time

import pytest
from kestreld_process import Conn


def wait_for_events(proc, name: str, count: int = 1, timeout: float = 10.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = proc.events(name)
        if len(found) >= count:
            return found
        time.sleep(0.02)
    raise AssertionError(f"no {name} event in the log: {proc.log_lines[-10:]}")


# One process's trace: with workers, the queue's owner traces a client's crossed requests.
@pytest.mark.one_process
def test_a_session_logs_its_start_and_end_with_what_it_did(make_server):
    proc = make_server("enable_session_trace = true\n")
    c = Conn(proc.connect())
    client = f"127.0.0.1:{c.sock.getsockname()[1]}"
    started = wait_for_events(proc, "session_started")[-1]
    assert started["client"] == client
    for i in range(3):
        assert c.set("traced", f"v{i}") == b"STORED"
    assert c.get("traced") == b"v0"
    c.send("get traced/open\r\n")
    assert c.read_value() == b"v1"
    c.send("get traced/peek\r\n")
    assert c.read_value() == b"v2"
    c.close()
    ended = wait_for_events(proc, "session_ended")[-1]
    assert ended["session"] == started["session"]
    assert ended["client"] == client
    assert ended["commands"] == "get=3,set=3"
    assert ended["items_taken"] == 2  # a peek takes nothing
    assert ended["open_reads_given_back"] == 1


# One process's trace: with workers, the queue's owner traces a client's crossed requests.
@pytest.mark.one_process
def test_queue_create_delete_and_flush_events_carry_the_client(make_server):
    proc = make_server("enable_session_trace = true\n")
    c = Conn(proc.connect())
    client = f"127.0.0.1:{c.sock.getsockname()[1]}"
    assert c.set("made", "x") == b"STORED"
    c.send("flush made\r\n")
    assert c.line() == b"END"
    c.send("delete made\r\n")
    assert c.line() == b"DELETED"
    c.close()
    for name in ("queue_created", "queue_flushed", "queue_deleted"):
        event = wait_for_events(proc, name)[-1]
        assert event["client"] == client, event
        assert event["queue"] == "made"
    # and events outside a session's requests do not
    assert "client" not in proc.events("listening")[-1]


def test_without_the_trace_sessions_are_not_logged(make_server):
    proc = make_server("")
    c = Conn(proc.connect())
    assert c.set("untraced", "x") == b"STORED"
    c.close()
    time.sleep(0.2)
    assert proc.events("session_started") == [] and proc.events("session_ended") == []
    assert "client" not in proc.events("queue_created")[-1]


# One process's trace: with workers, the queue's owner traces a client's crossed requests.
@pytest.mark.one_process
def test_a_shutdown_ends_every_traced_session_with_its_open_reads(make_server):
    proc = make_server("enable_session_trace = true\n")
    c = Conn(proc.connect())
    assert c.set("held", "x") == b"STORED"
    c.send("get held/open\r\n")
    assert c.read_value() == b"x"
    proc.stop()
    ended = wait_for_events(proc, "session_ended")[-1]
    assert ended["open_reads_given_back"] == 1
    c.close()


@pytest.mark.one_process
def test_text_and_thrift_sessions_are_traced_too(tmp_path):
    from kestrel_fronts import TextConn, start_fronts, thrift_client

    proc = start_fronts(tmp_path / "queues", "enable_session_trace = true\n")
    try:
        text = TextConn(proc.text_port)
        text.send(b"put traced:\nt1\nt2\n\n")
        assert text.line() == b"+2"
        text.send(b"get traced\n")
        assert text.line() == b":t1"
        text.close()
        ended = wait_for_events(proc, "session_ended")[-1]
        assert ended["commands"] == "get=1,put=1"
        assert ended["items_taken"] == 1
        assert ended["open_reads_given_back"] == 1  # a text get is an open read
        client = thrift_client(proc.thrift_port)
        assert client.put("traced", [b"t3"], 0) == 1
        client.close()
        ended = wait_for_events(proc, "session_ended", count=2)[-1]
        assert ended["commands"] == "put=1"
        started = proc.events("session_started")
        assert len(started) == 2 and {e["session"] for e in started} == {
            e["session"] for e in proc.events("session_ended")
        }
    finally:
        proc.stop()
