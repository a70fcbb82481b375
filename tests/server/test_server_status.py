"""Kestrel 2.4's server statuses, without ZooKeeper: what each refuses, the grace period,
the status file, ``default_status`` and the connection limits."""

from __future__ import annotations

import socket
import time

import pytest
from kestreld_process import Conn
from waiting import wait_until

from kestreld.state import ServerStatus
from kestreld.status import StatusBoard


def command(proc, line: str) -> bytes:
    conn = Conn(proc.connect())
    try:
        conn.send(line + "\r\n")
        return conn.line()
    finally:
        conn.close()


def put(conn: Conn, data: bytes = b"x") -> bytes:
    return conn.set("jobs", data)


def get_or_error(conn: Conn) -> bytes | None:
    """The item of ``get jobs``, None for none, or the error line."""
    conn.send("get jobs\r\n")
    line = conn.line()
    if not line.startswith(b"VALUE "):
        return None if line == b"END" else line
    data = conn.exact(int(line.split()[3]) + 2)[:-2]
    assert conn.line() == b"END"
    return data


# --- the board (sans-IO) ------------------------------------------------------------------


def test_a_stricter_status_is_announced_at_once_and_enforced_after_the_grace_period():
    board = StatusBoard(ServerStatus.UP, grace_ms=5000)
    assert board.change(ServerStatus.READONLY, now=100.0)
    assert (board.announced, board.enforced, board.pending) == (
        ServerStatus.READONLY,
        ServerStatus.UP,
        ServerStatus.READONLY,
    )
    assert board.seconds_left(102.0) == pytest.approx(3.0)
    assert not board.expire(104.9)
    assert board.expire(105.0)
    assert (board.enforced, board.pending) == (ServerStatus.READONLY, None)


def test_a_looser_status_applies_at_once_and_cancels_a_pending_one():
    board = StatusBoard(ServerStatus.UP, grace_ms=5000)
    board.change(ServerStatus.QUIESCENT, now=0.0)
    board.change(ServerStatus.UP, now=1.0)
    assert (board.announced, board.enforced, board.pending) == (ServerStatus.UP,) * 2 + (None,)
    board = StatusBoard(ServerStatus.QUIESCENT, grace_ms=5000)
    board.change(ServerStatus.WRITEAVOID, now=0.0)
    assert board.enforced is ServerStatus.WRITEAVOID and board.pending is None


def test_a_second_stricter_status_restarts_the_grace_period():
    board = StatusBoard(ServerStatus.UP, grace_ms=2000)
    board.change(ServerStatus.WRITEAVOID, now=0.0)
    board.change(ServerStatus.READONLY, now=1.5)
    assert not board.expire(3.0)  # the newer change has its own 2 s
    assert board.expire(3.5) and board.enforced is ServerStatus.READONLY


def test_without_a_grace_period_every_status_applies_at_once():
    board = StatusBoard(ServerStatus.UP)
    board.change(ServerStatus.QUIESCENT, now=0.0)
    assert board.enforced is ServerStatus.QUIESCENT and board.pending is None


def test_statuses_are_ordered_and_name_their_server_sets():
    order = [
        ServerStatus.UP,
        ServerStatus.WRITEAVOID,
        ServerStatus.READONLY,
        ServerStatus.QUIESCENT,
    ]
    assert sorted(ServerStatus, key=lambda s: s.strictness) == order
    assert [s.in_read_set for s in order] == [True, True, True, False]
    assert [s.in_write_set for s in order] == [True, False, False, False]
    assert [s.refuses_writes for s in order] == [False, False, True, True]
    assert [s.refuses_reads for s in order] == [False, False, False, True]


# --- a running server ---------------------------------------------------------------------


def test_writeavoid_still_takes_writes_and_reads(make_server):
    proc = make_server()
    conn = Conn(proc.connect())
    conn.send("status WriteAvoid\r\n")
    assert conn.line() == b"END"
    conn.send("status\r\n")
    assert conn.line() == b"WRITEAVOID"
    assert put(conn) == b"STORED"
    assert conn.get("jobs") == b"x"
    assert conn.stats()["status"] == "WRITEAVOID"
    conn.close()


def test_readonly_refuses_writes_and_quiescent_reads_too(make_server):
    proc = make_server()
    conn = Conn(proc.connect())
    assert put(conn, b"kept") == b"STORED"
    conn.send("status readonly\r\n")
    assert conn.line() == b"END"
    assert put(conn) == b"SERVER_ERROR server is READONLY"
    conn.send("delete jobs\r\n")
    assert conn.line() == b"SERVER_ERROR server is READONLY"
    conn.send("status quiescent\r\n")
    assert conn.line() == b"END"
    conn.send("get jobs\r\n")
    assert conn.line() == b"SERVER_ERROR server is QUIESCENT"
    conn.send("status up\r\n")
    assert conn.line() == b"END"
    assert conn.get("jobs") == b"kept"
    conn.close()


def test_an_unknown_status_is_a_client_error_naming_the_choices(make_server):
    proc = make_server()
    assert command(proc, "status down") == (
        b"CLIENT_ERROR unknown status down (up, writeavoid, readonly or quiescent)"
    )
    assert command(proc, "status") == b"UP"


def test_the_grace_period_announces_first_and_refuses_later(make_server):
    proc = make_server('status_change_grace_period = "3s"\n')
    conn = Conn(proc.connect())
    conn.send("status readonly\r\n")
    assert conn.line() == b"END"
    started = time.monotonic()
    conn.send("status\r\n")
    reply = conn.line()
    assert reply.startswith(b"UP (pending READONLY in ") and reply.endswith(b"s)"), reply
    assert conn.stats()["status_pending"] == "READONLY"
    assert put(conn) == b"STORED"
    assert time.monotonic() - started < 3.0, "too slow a machine for this grace period"
    wait_until(lambda: put(conn) != b"STORED", "writes refused after the grace period")
    assert time.monotonic() - started >= 2.5  # the grace began just before ``started``
    conn.send("status\r\n")
    assert conn.line() == b"READONLY"
    # The log is read by a thread: the event can trail the reply.
    wait_until(lambda: proc.events("status_enforced"), "status_enforced logged")
    assert [e["status"] for e in proc.events("status_enforced")] == ["READONLY"]
    conn.close()


def test_the_status_survives_a_restart_in_the_status_file(make_server, tmp_path):
    status_file = tmp_path / "state" / "kestrel-status"
    proc = make_server(f'status_file = "{status_file}"\n')
    assert command(proc, "status readonly") == b"END"
    assert status_file.read_text() == "READONLY\n"
    proc.restart()
    assert command(proc, "status") == b"READONLY"


def test_default_status_applies_until_a_status_file_exists(make_server, tmp_path):
    proc = make_server('default_status = "quiescent"\n')
    assert command(proc, "status") == b"QUIESCENT"
    assert command(proc, "get jobs") == b"SERVER_ERROR server is QUIESCENT"
    assert command(proc, "status up") == b"END"
    proc.restart()
    assert command(proc, "status") == b"UP"  # the file now says so


def test_an_unreadable_status_file_falls_back_to_the_default_with_an_error(make_server, tmp_path):
    status_file = tmp_path / "status"
    status_file.write_text("SIDEWAYS\n")
    proc = make_server(f'status_file = "{status_file}"\ndefault_status = "readonly"\n')
    assert command(proc, "status") == b"READONLY"
    assert proc.events("status_file_unparsable")[0]["found"] == "SIDEWAYS"


def _connections(proc, n: int) -> list[socket.socket]:
    socks = [proc.connect() for _ in range(n)]
    wait_until(lambda: int(Conn(socks[0]).stats()["curr_connections"]) >= n, "connected")
    return socks


def test_above_the_write_limit_writes_are_refused(make_server):
    proc = make_server("connection_limit_refuse_writes = 2\n")
    socks = _connections(proc, 2)
    conn = Conn(socks[0])
    assert put(conn) == b"STORED"
    extra = _connections(proc, 3)[2]
    assert put(conn) == b"SERVER_ERROR too many connections for writes"
    assert conn.get("jobs") == b"x"  # reads are not limited
    extra.close()
    wait_until(lambda: put(conn) == b"STORED", "writes again below the limit")
    for s in socks:
        s.close()


def test_above_the_read_limit_reads_are_refused(make_server):
    proc = make_server("connection_limit_refuse_reads = 1\n")
    conn = Conn(proc.connect())
    assert put(conn) == b"STORED"
    assert conn.get("jobs") == b"x"
    assert put(conn) == b"STORED"
    other = proc.connect()
    wait_until(lambda: int(conn.stats()["curr_connections"]) >= 2, "two connections")
    conn.send("get jobs\r\n")
    assert conn.line() == b"SERVER_ERROR too many connections for reads"
    assert put(conn) == b"STORED"  # writes are not limited
    other.close()
    wait_until(lambda: get_or_error(conn) == b"x", "reads again below the limit")
    conn.close()
