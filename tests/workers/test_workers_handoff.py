"""``worker_handoff = true``: a client connection that names another worker's queue while
it holds nothing is handed, socket and all, to that worker (kestreld/workers/handoff.py),
checked from outside with raw memcache connections on a box of two workers."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest
from kestreld_process import Conn, KestreldProcess
from worker_box import owned_by, until

WORKERS = 2


def _box(make_server, config: str = "worker_handoff = true\n") -> KestreldProcess:
    return make_server(config=config, args=["--workers", str(WORKERS)])


@pytest.fixture
def box(make_server) -> KestreldProcess:
    return _box(make_server)


@pytest.fixture
def here() -> str:
    """A queue of worker 0, where the tests' connections land."""
    return owned_by(0, "here")


@pytest.fixture
def there() -> str:
    """A queue of worker 1."""
    return owned_by(1, "there")


def _on_worker(server: KestreldProcess, index: int, login: bytes | None = None) -> Conn:
    """A connection worker ``index`` accepted (the kernel picks: open a few, keep one).
    ``login``: the auth ``set``'s token, sent first."""
    for _ in range(100):
        batch = [Conn(server.connect()) for _ in range(8)]
        found = None
        for conn in batch:
            if login is not None:
                conn.send(b"set auth 0 0 %d\r\n%s\r\n" % (len(login), login))
                assert conn.line() == b"STORED"
            if found is None and conn.stats()["worker"] == str(index):
                found = conn
            else:
                conn.close()
        if found is not None:
            return found
        time.sleep(0.01)
    pytest.fail(f"no connection landed on worker {index}")


def test_a_connection_naming_another_workers_queue_moves_to_that_worker(box, there):
    conn = _on_worker(box, 0)
    assert conn.set(there, b"x") == b"STORED"
    stats = conn.stats()
    assert stats["worker"] == "1"
    assert stats["handoffs"] == "1"
    assert stats["worker_requests_crossed"] == "0"
    assert conn.get(there) == b"x"


def test_a_handed_connection_is_counted_once_on_the_box(box, there):
    conn = _on_worker(box, 0)
    before = int(conn.stats()["total_connections"])
    assert conn.set(there, b"x") == b"STORED"
    stats = conn.stats()
    assert stats["curr_connections"] == "1"
    assert int(stats["total_connections"]) == before


def test_pipelined_requests_across_the_hand_off_are_answered_in_order(box, here, there):
    conn = _on_worker(box, 0)
    # One write: a local get (answered before the move), then the request that moves the
    # connection, and requests behind it that travel unread with the socket.
    conn.send(
        f"get {here}\r\nset {there} 0 0 2\r\nt1\r\nset {there} 0 0 2\r\nt2\r\n"
        f"get {there}\r\nset {here} 0 0 2\r\nh1\r\nget {there}\r\nget {here}\r\n"
        f"get {there}\r\n"
    )
    assert conn.read_value() is None
    assert conn.line() == b"STORED"
    assert conn.line() == b"STORED"
    assert conn.read_value() == b"t1"
    assert conn.line() == b"STORED"  # here's, sent back to worker 0 from worker 1
    assert conn.read_value() == b"t2"
    assert conn.read_value() == b"h1"
    assert conn.read_value() is None
    assert conn.stats()["worker"] == "1"


def test_a_connection_moves_only_once_its_earlier_replies_have_left(box, here, there):
    big = b"p" * 3_000_000
    writer = _on_worker(box, 0)
    writer.send(f"set {here} 0 0 {len(big)}\r\n".encode() + big + b"\r\n")
    assert writer.line() == b"STORED"
    conn = _on_worker(box, 0)
    conn.send(f"get {here}/peek\r\nget {there}\r\n")
    time.sleep(0.2)  # not read yet: the peek's reply waits in the worker's buffers
    assert conn.read_value() == big
    assert conn.read_value() is None
    assert conn.stats()["worker"] == "1"


def test_a_large_set_behind_the_moving_request_arrives_whole(box, there):
    conn = _on_worker(box, 0)
    big = b"b" * 300_000
    conn.send(f"get {there}\r\nset {there} 0 0 {len(big)}\r\n".encode() + big + b"\r\n")
    assert conn.read_value() is None
    assert conn.line() == b"STORED"
    assert conn.get(there) == big


def test_a_handed_connection_keeps_its_authentication_and_roles(make_server, there, tmp_path):
    from kestreld.security import hash_password

    users = tmp_path / "users"
    users.write_text(f"reader:{hash_password('r', log2_n=4)}:read\n")
    box = _box(make_server, f'worker_handoff = true\nauth_file = "{users}"\n')
    conn = _on_worker(box, 0, login=b"reader r")
    assert conn.get(there) is None  # moves it
    assert conn.stats()["worker"] == "1"
    assert conn.get(there) is None  # still authenticated
    assert conn.set(there, b"y") == b"CLIENT_ERROR permission denied"  # still a reader


def test_a_connection_whose_user_a_reload_removed_goes_on_when_it_moves(
    make_server, there, tmp_path
):
    """As in one process: a reload changes who may log in, not connections in progress."""
    from kestreld.security import hash_password

    users = tmp_path / "users"
    users.write_text(f"alice:{hash_password('a', log2_n=4)}:read,write,admin\n")
    box = _box(make_server, f'worker_handoff = true\nauth_file = "{users}"\n')
    conn = _on_worker(box, 0, login=b"alice a")
    users.write_text(f"bob:{hash_password('b', log2_n=4)}:read\n")
    conn.send(b"reload\r\n")
    assert conn.line() == b"Reloaded config."
    assert conn.set(there, b"x") == b"STORED"  # moves it, still alice with her roles
    assert conn.stats()["worker"] == "1"
    assert conn.get(there) == b"x"


def test_a_reliable_read_opened_after_the_hand_off_comes_back_on_disconnect(box, there):
    producer = Conn(box.connect())
    for item in (b"a", b"b"):
        assert producer.set(there, item) == b"STORED"
    reader = _on_worker(box, 0)
    assert reader.get(f"{there}/open") == b"a"
    assert reader.stats()["worker"] == "1"
    reader.close()
    assert until(lambda: producer.get(f"{there}/peek") == b"a")
    assert [producer.get(there), producer.get(there)] == [b"a", b"b"]


def test_a_client_alternating_queues_is_answered_and_moves_once(box, here, there):
    conn = _on_worker(box, 0)
    for i in range(20):
        for name in (here, there):
            assert conn.set(name, f"{name}-{i}") == b"STORED"
    for i in range(20):
        for name in (here, there):
            assert conn.get(name) == f"{name}-{i}".encode()
    stats = conn.stats()
    assert stats["handoffs"] == "1"
    # here's requests after the move, asked from worker 1: all but the first set.
    assert int(stats["worker_requests_crossed"]) == 39


def test_a_connection_holding_an_open_read_is_forwarded_not_moved(box, here, there):
    producer = _on_worker(box, 0)  # here's own: it does not move either
    assert producer.set(here, b"h") == b"STORED"
    conn = _on_worker(box, 0)
    assert conn.get(f"{here}/open") == b"h"
    assert conn.set(there, b"x") == b"STORED"
    stats = conn.stats()
    assert stats["worker"] == "0"
    assert stats["handoffs"] == "0"
    conn.close()  # its read goes back where it was opened
    assert until(lambda: producer.get(f"{here}/peek") == b"h")


def test_a_hand_off_to_a_worker_that_is_down_is_forwarded_instead(box, here, there):
    conn = _on_worker(box, 0)
    os.kill(box.worker_pids()[1], signal.SIGKILL)
    assert until(lambda: box.events("worker_died"))
    conn.send(f"get {there}\r\n")
    reply = conn.line()  # forwarded to the dead worker, or handed to its successor
    assert reply == b"END" or reply.startswith(b"SERVER_ERROR worker 1 is not serving"), reply
    assert conn.get(here) is None  # the connection serves on, wherever it is


def test_without_worker_handoff_requests_are_forwarded_as_before(make_server, there):
    box = _box(make_server, "worker_handoff = false\n")
    conn = _on_worker(box, 0)
    assert conn.set(there, b"x") == b"STORED"
    assert conn.get(there) == b"x"
    stats = conn.stats()
    assert stats["worker"] == "0"
    assert stats["handoffs"] == "0"
    assert stats["worker_requests_crossed"] == "2"


def test_a_handed_connection_whose_client_never_reads_is_paused_not_read_whole(box, there):
    """Its first requests pause it at the owner (their replies wait for the client), and
    the owner keeps it paused: it does not read and hold all the client sends."""
    Conn(box.connect()).set(there, "x" * 1_000_000)
    sock = _on_worker(box, 0).sock
    sock.settimeout(0.2)
    requests = f"get {there}/peek\r\n".encode() * 100
    sent = 0
    with contextlib.suppress(TimeoutError, BlockingIOError):
        for _ in range(20_000):
            sock.send(requests)
            sent += len(requests)
    assert sent < 20_000 * len(requests), "the owner read everything a non-reader sent"
    assert int(Conn(box.connect()).stats()["handoffs"]) >= 1
