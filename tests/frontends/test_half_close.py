"""A client that half-closes (``nc -N``, ``shutdown(SHUT_WR)``) gets every reply.

``printf 'set q 0 0 5\\r\\nhello\\r\\nget q\\r\\n' | nc -N host port`` sends its
requests and the end of its stream together.  The server answers everything
it received, waits for its sets to be acknowledged (with ``sync_journal = 0``
that is after the fsync), then closes.  A blocking get never waits on such a
connection: its client may be gone, and an item must not go to nobody.
"""

from __future__ import annotations

import socket
import time

import pytest

SYNC_EVERY_WRITE = "sync_journal = 0\n"


def _half_close_exchange(srv, payload: bytes, timeout: float = 5.0) -> tuple[bytes, float]:
    """Send ``payload`` and the end of the stream; read until the server closes."""
    s = srv.connect()
    s.settimeout(timeout)
    started = time.monotonic()
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    return _read_until_closed(s), time.monotonic() - started


def _read_until_closed(s: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return out
            out += data
    finally:
        s.close()


@pytest.fixture
def sync_server(make_server):
    return make_server(SYNC_EVERY_WRITE)


def test_sets_and_gets_before_the_end_of_stream_all_get_their_replies(sync_server):
    out, _ = _half_close_exchange(
        sync_server,
        b"set hc 0 0 5\r\nhello\r\nset hc 0 0 5\r\nworld\r\nget hc\r\nversion\r\n",
    )
    assert out.startswith(b"STORED\r\nSTORED\r\nVALUE hc 0 5\r\nhello\r\nEND\r\nVERSION ")
    assert out.endswith(b"\r\n") and out.count(b"\r\n") == 6
    c = sync_server.client()
    assert c.get("hc") == b"world"


def test_many_pipelined_sets_then_end_of_stream_are_all_acknowledged(sync_server):
    n = 500
    payload = b"".join(b"set many 0 0 4\r\n%04d\r\n" % i for i in range(n))
    out, _ = _half_close_exchange(sync_server, payload)
    assert out == b"STORED\r\n" * n
    c = sync_server.client()
    assert [c.get("many") for _ in range(n)] == [b"%04d" % i for i in range(n)]


def test_a_waiting_get_ends_with_end_when_the_client_half_closes(make_server):
    srv = make_server()
    s = srv.connect()
    s.settimeout(5)
    s.sendall(b"get idlewait/t=10000\r\n")
    time.sleep(0.3)  # the get is waiting now
    started = time.monotonic()
    s.shutdown(socket.SHUT_WR)
    assert _read_until_closed(s) == b"END\r\n"
    assert time.monotonic() - started < 2, "the wait ended with the stream, not with /t="
    c = srv.client()
    c.set("idlewait", b"for somebody else")
    assert c.get("idlewait") == b"for somebody else", "the ended waiter took nothing"


def test_a_blocking_get_after_the_end_of_stream_does_not_wait(make_server):
    srv = make_server()
    out, took = _half_close_exchange(srv, b"get nothing/t=10000\r\nversion\r\n")
    assert out.startswith(b"END\r\nVERSION ")
    assert took < 2


def test_an_open_read_of_a_half_closed_client_goes_back_when_it_closes(make_server):
    srv = make_server()
    c = srv.client()
    # Acknowledged before another connection reads it: pymemcache's default noreply set
    # is ordered only on its own connection (with workers it may still be crossing).
    assert c.set("openhc", b"one", noreply=False)
    out, _ = _half_close_exchange(srv, b"get openhc/open\r\n")
    assert out == b"VALUE openhc/open 0 3\r\none\r\nEND\r\n"
    deadline = time.monotonic() + 5
    got = None
    while got is None and time.monotonic() < deadline:
        got = c.get("openhc")
        if got is None:
            time.sleep(0.05)
    assert got == b"one", "an unconfirmed read of a closed connection is given back"


def test_a_half_sent_set_at_the_end_of_stream_stores_nothing(make_server):
    srv = make_server()
    out, _ = _half_close_exchange(srv, b"set cut 0 0 10\r\nhello")
    assert out == b""
    assert srv.client().get("cut") is None


def test_monitor_on_a_half_closed_connection_does_not_wait(make_server):
    srv = make_server()
    c = srv.client()
    assert c.set("monhc", b"a", noreply=False)  # stored before the monitor looks
    out, took = _half_close_exchange(srv, b"monitor monhc 10 5\r\n")
    assert out == b"VALUE monhc 0 1\r\na\r\nEND\r\n"
    assert took < 2
