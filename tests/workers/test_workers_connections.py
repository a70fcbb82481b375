"""``max_connections`` on a box of two workers counts the box's clients, as one server
counts its own (kestreld/workers/box_connections.py), checked with raw memcache
connections: wherever the kernel lands a client, the one past the limit is refused."""

from __future__ import annotations

from kestreld_process import Conn, KestreldProcess
from worker_box import owned_by, until

WORKERS = 2
REFUSED = b"SERVER_ERROR too many connections"


def _box(make_server, config: str) -> KestreldProcess:
    return make_server(config=config, args=["--workers", str(WORKERS)])


def _open(server: KestreldProcess) -> tuple[Conn, str] | None:
    """A new client and the worker serving it; None when it was refused (and closed)."""
    conn = Conn(server.connect())
    conn.send(b"version\r\n")
    first = conn.line()
    if first == REFUSED:  # then closed (reset: the version sent was not read)
        conn.close()
        return None
    assert first.startswith(b"VERSION ")
    return conn, conn.stats()["worker"]


def test_the_client_past_max_connections_is_refused_wherever_it_lands(make_server):
    box = _box(make_server, "max_connections = 3\n")
    opened = [_open(box) for _ in range(12)]
    assert [c is not None for c in opened] == [True] * 3 + [False] * 9
    for conn, _ in filter(None, opened):
        assert conn.set("served", b"x") == b"STORED"


def test_a_client_that_leaves_lets_the_next_one_in(make_server):
    box = _box(make_server, "max_connections = 3\n")
    served = [_open(box) for _ in range(3)]
    assert _open(box) is None
    served[0][0].close()
    next_one = until(lambda: _open(box))  # kept: a client dropped here would leave
    assert next_one is not None
    assert _open(box) is None


def test_a_request_crossing_to_another_worker_on_a_full_box_is_served(make_server):
    # The channels between the workers are not clients: the owner takes them when full.
    box = _box(make_server, "max_connections = 2\n")
    clients = [_open(box) for _ in range(2)]
    assert _open(box) is None
    for conn, _ in clients:
        for index in range(WORKERS):
            queue = owned_by(index, "full")
            assert conn.set(queue, b"x") == b"STORED"
            assert conn.get(queue) == b"x"


def _one_on_worker_0_and_one_more(box: KestreldProcess) -> tuple[Conn, Conn]:
    """The box's two clients, the first on worker 0 (the kernel picks: retry)."""
    for _ in range(100):
        pair = [until(lambda: _open(box)) for _ in range(2)]
        assert None not in pair
        pair.sort(key=lambda served: served[1])
        if pair[0][1] == "0":
            return pair[0][0], pair[1][0]
        for conn, _ in pair:
            conn.close()
    raise AssertionError("no client landed on worker 0")


def test_a_client_handed_to_a_worker_of_a_full_box_is_served_and_counted_once(make_server):
    box = _box(make_server, "max_connections = 2\nworker_handoff = true\n")
    moving, other = _one_on_worker_0_and_one_more(box)
    there = owned_by(1, "there")
    assert moving.set(there, b"x") == b"STORED"
    stats = moving.stats()
    assert (stats["worker"], stats["handoffs"]) == ("1", "1")
    assert moving.get(there) == b"x"
    assert _open(box) is None
    # Counted once: one leaving lets exactly one in.
    other.close()
    next_one = until(lambda: _open(box))  # kept: a client dropped here would leave
    assert next_one is not None
    assert _open(box) is None
