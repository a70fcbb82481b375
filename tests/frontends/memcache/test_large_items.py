"""Large items: streamed in as they arrive, written off the event loop, intact after restarts.

An 8 MiB item is copied into its bytes as its packets arrive and written to the journal by
a worker thread (kestreld/journal/large_write.py); what the server acknowledged is in the
journal, in order, whatever a crash interrupts.
"""

from __future__ import annotations

import hashlib
import socket
import time

from kestreld.testing.process import Conn

MiB = 1024 * 1024


def _item(n: int, size: int = 8 * MiB) -> bytes:
    """``size`` bytes that differ from item to item and from place to place."""
    seed = hashlib.sha256(str(n).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def _send_slowly(sock: socket.socket, data: bytes, piece: int, pause: float) -> None:
    for i in range(0, len(data), piece):
        sock.sendall(data[i : i + piece])
        time.sleep(pause)


def test_large_item_sent_in_slow_pieces_is_stored_intact(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    item = _item(1)
    request = b"set big 0 0 %d\r\n" % len(item) + item + b"\r\n"
    _send_slowly(c.sock, request, 300 * 1024, 0.01)
    assert c.line() == b"STORED"
    assert c.get("big") == item


def test_large_item_survives_a_restart(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    items = [_item(n) for n in range(3)]
    for item in items:
        _send_slowly(c.sock, b"set big 0 0 %d\r\n" % len(item) + item + b"\r\n", MiB, 0.005)
        assert c.line() == b"STORED"
    c.close()
    srv.restart()
    c = Conn(srv.connect())
    assert [c.get("big") for _ in range(4)] == [*items, None]


def test_large_items_read_back_from_the_journal_past_max_memory_size_are_whole(make_server):
    """Past ``max_memory_size`` items are read back from the journal (its data read alone,
    kestreld/journal/segment.py): each large one whole, small ones beside them, in order."""
    srv = make_server('max_memory_size = "1MiB"')
    c = Conn(srv.connect())
    expected = []
    for n in range(3):
        item = _item(20 + n)
        c.send(b"set behind 0 0 %d\r\n" % len(item) + item + b"\r\n")
        assert c.line() == b"STORED"
        assert c.set("behind", f"small {n}") == b"STORED"
        expected += [item, f"small {n}".encode()]
    assert [c.get("behind") for _ in range(len(expected) + 1)] == [*expected, None]


def test_small_sets_between_large_ones_keep_their_order(make_server):
    srv = make_server()
    big = Conn(srv.connect())
    small = Conn(srv.connect())
    expected = []
    for n in range(3):
        item = _item(n, 2 * MiB)
        big.send(b"set q 0 0 %d\r\n" % len(item) + item + b"\r\n")
        small.set("q", f"small {n}")  # may be written before or behind the large one
        assert big.line() == b"STORED"
        expected += [item, f"small {n}".encode()]
    srv.restart()
    c = Conn(srv.connect())
    got = [c.get("q") for _ in range(len(expected) + 1)]
    assert got[-1] is None
    assert sorted(got[:-1]) == sorted(expected), "nothing lost, nothing torn"
    assert [g for g in got if g and g.startswith(b"small")] == [b"small 0", b"small 1", b"small 2"]


def test_kill_9_while_a_large_item_is_written_loses_only_that_item(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    for i in range(5):
        assert c.set("q", f"acked {i}") == b"STORED"
    item = _item(7, 16 * MiB - 1024)
    c.send(b"set q 0 0 %d\r\n" % len(item) + item + b"\r\n")
    srv.restart(crash=True)  # no STORED was read: the large item was never acknowledged
    c = Conn(srv.connect())
    got = [c.get("q") for _ in range(7)]
    assert got[:5] == [f"acked {i}".encode() for i in range(5)]
    assert got[5] in (item, None), "the unacknowledged item is whole or absent, never torn"
    assert got[6] is None


def test_kill_9_in_the_middle_of_a_large_item_arriving_keeps_what_was_acknowledged(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    for i in range(3):
        assert c.set("q", f"acked {i}") == b"STORED"
    item = _item(9)
    c.send(b"set q 0 0 %d\r\n" % len(item) + item[: len(item) // 2])
    time.sleep(0.2)
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert [c.get("q") for _ in range(4)] == [*(f"acked {i}".encode() for i in range(3)), None]


def test_large_item_acknowledged_after_fsync_survives_kill_9(make_server):
    srv = make_server("sync_journal = 0\n")
    c = Conn(srv.connect())
    item = _item(11)
    assert c.set("q", item) == b"STORED"
    assert c.set("q", "after") == b"STORED"
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert [c.get("q") for _ in range(3)] == [item, b"after", None]


def test_large_sets_beside_small_ones_on_one_queue_are_all_stored(make_server):
    srv = make_server()
    big = Conn(srv.connect())
    small = Conn(srv.connect())
    item = _item(5, MiB)
    request = b"set q 0 0 %d\r\n" % len(item) + item + b"\r\n"
    big.send(request * 6)  # pipelined: a later one may wait for the small sets' turn
    small_sets = 0
    for _ in range(6):
        while b"\r\n" not in big.buf:
            assert small.set("q", "small") == b"STORED"
            small_sets += 1
            big.sock.settimeout(0.001)
            try:
                big._fill()
            except TimeoutError:
                pass
            big.sock.settimeout(10)
        assert big.line() == b"STORED"
    got = [small.get("q") for _ in range(small_sets + 7)]
    assert got.count(item) == 6
    assert got.count(b"small") == small_sets
    assert got[-1] is None


def test_large_sets_from_several_connections_at_once_are_all_stored_in_each_ones_order(
    make_server,
):
    """While one connection's large item is written, the others' large sets are held back
    (kestreld/frontends/core/held_put.py) and run on their turn: none is lost or torn."""
    srv = make_server()
    conns = [Conn(srv.connect()) for _ in range(3)]
    items = {i: [_item(10 * i + k, 3 * MiB) for k in range(2)] for i in range(3)}
    for i, c in enumerate(conns):
        c.send(b"".join(b"set q 0 0 %d\r\n" % len(it) + it + b"\r\n" for it in items[i]))
    for c in conns:
        assert [c.line(), c.line()] == [b"STORED", b"STORED"]
    got = [conns[0].get("q") for _ in range(7)]
    assert got[-1] is None and sorted(got[:6]) == sorted(it for i in items for it in items[i])
    for i in items:  # each connection's items come back in the order it sent them
        assert got.index(items[i][0]) < got.index(items[i][1])


def test_kill_9_while_a_large_item_is_written_keeps_the_small_sets_stored_beside_it(make_server):
    """Small sets that got STORED while a large record was being written (they went to the
    next segment) survive a crash in the middle of it; the large item is whole or absent."""
    srv = make_server()
    big = Conn(srv.connect())
    small = Conn(srv.connect())
    item = _item(12, 16 * MiB - 1024)
    big.send(b"set q 0 0 %d\r\n" % len(item) + item + b"\r\n")
    stored = []
    for i in range(200):
        assert small.set("q", f"small {i}") == b"STORED"
        stored.append(f"small {i}".encode())
    srv.restart(crash=True)
    c = Conn(srv.connect())
    got = [c.get("q") for _ in range(len(stored) + 2)]
    assert [g for g in got if g and g.startswith(b"small")] == stored
    assert got.count(item) <= 1
    assert all(g is None or g == item or g.startswith(b"small") for g in got), "nothing torn"
    assert got[-1] is None


def test_large_set_before_a_half_close_is_answered(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    item = _item(6, 2 * MiB)
    c.send(b"set q 0 0 %d\r\n" % len(item) + item + b"\r\n")
    c.sock.shutdown(socket.SHUT_WR)
    assert c.line() == b"STORED"
    c = Conn(srv.connect())
    assert c.get("q") == item
