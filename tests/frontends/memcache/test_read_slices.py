"""Reading is sliced: a connection that read a slice reads again on the loop's next turn.

The event loop reads a socket again within one turn after every read that filled its buffer,
so without a slice a client's whole 8 MiB item is read in one turn while every other client
waits.  Once a connection has read ``READ_SLICE_BYTES`` since its last pause, reading pauses
until the loop's next turn (kestreld/frontends/core/limits.py).  That pause is one of its own: it never resumes a
connection paused for another reason (replies not read, closing), and nothing resumes it
before the next turn.

In process, an in-memory transport records ``pause_reading`` / ``resume_reading``, so the
turns are counted exactly; over real sockets to a real kestreld, large items read over many
turns and the requests behind them keep their bytes and their order.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time

import pytest
from waiting import until

from kestreld.frontends.core.limits import READ_SLICE_BYTES
from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.frontends.text.connection import TextConnection
from kestreld.testing.memory_transport import MemoryTransport
from kestreld.testing.process import Conn

MiB = 1024 * 1024

#: A slice of a large set's block, not complete yet: what a large item's bytes look like.
LARGE_READ = b"set big 0 0 %d\r\n" % (4 * READ_SLICE_BYTES) + b"x" * READ_SLICE_BYTES


def _item(n: int, size: int) -> bytes:
    """``size`` bytes that differ from item to item and from place to place."""
    seed = hashlib.sha256(str(n).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


async def _turns(n: int) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


@pytest.fixture
def connected(served):
    """A memcache connection of an in-process server, and the transport it reads from."""
    conn = MemcacheConnection(served, COMMANDS, UNKNOWN)
    transport = MemoryTransport()
    conn.connection_made(transport)
    return conn, transport


# --- the memcache front end, turn by turn ----------------------------------------------------


async def test_a_large_read_pauses_reading_until_the_loops_next_turn(connected):
    conn, transport = connected
    conn.data_received(LARGE_READ)
    assert not transport.reading, "nothing more is read in this turn"
    await _turns(1)
    assert transport.reading
    assert not conn.sliced and not conn.read_paused


async def test_a_read_of_small_requests_does_not_pause_reading(connected):
    conn, transport = connected
    conn.data_received(b"set q 0 0 2\r\nhi\r\n" * 100)
    assert transport.reading and not conn.sliced
    await _turns(1)
    assert bytes(transport.data) == b"STORED\r\n" * 100


async def test_reads_that_add_up_to_a_slice_pause_reading_until_the_next_turn(connected):
    conn, transport = connected
    piece = 256000  # uvloop's read buffer: the loop reads again after a full one
    conn.data_received(b"set big 0 0 %d\r\n" % (8 * READ_SLICE_BYTES))
    for _ in range(READ_SLICE_BYTES // piece):
        assert transport.reading
        conn.data_received(b"x" * piece)
    conn.data_received(b"x" * piece)
    assert not transport.reading, "a slice was read in this turn"
    await _turns(1)
    assert transport.reading


async def test_a_connection_paused_for_back_pressure_is_not_resumed_by_its_slice(connected):
    """The client reads no replies (the transport passed its high-water mark) in the turn of
    a large read: the next turn leaves it paused; resuming writes resumes reading."""
    conn, transport = connected
    conn.data_received(LARGE_READ)
    conn.pause_writing()
    await _turns(3)
    assert not transport.reading and conn.read_paused
    conn.resume_writing()
    assert transport.reading and not conn.read_paused


async def test_a_pause_that_ends_within_the_turn_of_a_slice_reads_again_on_the_next(connected):
    conn, transport = connected
    conn.data_received(LARGE_READ)
    conn.pause_writing()
    conn.resume_writing()
    assert not transport.reading, "the slice still holds for this turn"
    await _turns(1)
    assert transport.reading


async def test_a_connection_closing_after_a_large_read_is_not_read_again(connected):
    conn, transport = connected
    conn.data_received(LARGE_READ)
    conn.close()
    await _turns(3)
    assert not transport.reading and transport.closed


async def test_a_large_block_read_over_many_turns_is_stored_whole(connected):
    conn, transport = connected
    item = _item(0, 3 * READ_SLICE_BYTES + 7)
    request = b"set q 0 0 %d\r\n%s\r\nget q\r\n" % (len(item), item)
    for at in range(0, len(request), READ_SLICE_BYTES):
        assert transport.reading
        conn.data_received(request[at : at + READ_SLICE_BYTES])
        await _turns(1)
    expected = b"STORED\r\nVALUE q 0 %d\r\n%s\r\nEND\r\n" % (len(item), item)
    await until(lambda: len(transport.data) >= len(expected), "the replies")
    assert bytes(transport.data) == expected


# --- the text front end (kestreld/frontends/core/request_loop.py, as the thrift one) ---------


async def test_a_text_clients_large_read_pauses_reading_until_the_loops_next_turn(served):
    conn = TextConnection(served)
    transport = MemoryTransport()
    conn.connection_made(transport)
    conn.data_received(b"put q:\n" + b"x" * READ_SLICE_BYTES)  # its item line goes on
    assert not transport.reading
    await _turns(1)
    assert transport.reading
    conn.close_now()


async def test_a_text_client_paused_for_pipelining_is_not_resumed_by_its_slice(served):
    """Requests beyond the one running pause reading (INBOX_PAUSE): at every turn the
    transport reads exactly when no such pause holds, until every request is answered."""
    conn = TextConnection(served)
    transport = MemoryTransport()
    conn.connection_made(transport)
    count = READ_SLICE_BYTES // len(b"peek q\n") + 1  # in one read
    conn.data_received(b"peek q\n" * count)
    assert not transport.reading
    assert conn.read_paused, "more requests than the inbox holds"
    deadline = time.monotonic() + 30
    while len(transport.data) < 2 * count:
        await _turns(1)
        assert transport.reading == (not conn.read_paused)
        assert time.monotonic() < deadline, "every request answered"
    assert bytes(transport.data) == b"*\n" * count
    await _turns(1)
    assert transport.reading and not conn.read_paused
    conn.close_now()


# --- a real kestreld --------------------------------------------------------------------------


def test_large_items_pipelined_on_one_connection_are_stored_whole_and_in_order(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    items = [_item(n, 4 * MiB + n) for n in range(3)]
    c.send(b"".join(b"set q 0 0 %d\r\n%s\r\n" % (len(item), item) for item in items))
    assert [c.line() for _ in items] == [b"STORED"] * 3
    assert [c.get("q") for _ in range(4)] == [*items, None]


def test_small_requests_pipelined_behind_a_large_set_are_answered_in_order(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    c.set("q", "first")
    item = _item(7, 8 * MiB)
    c.send(
        b"get q\r\nset q 0 0 %d\r\n%s\r\n" % (len(item), item)
        + b"set q 0 0 5\r\nsmall\r\nget q\r\nget q\r\nget q\r\nversion\r\n"
    )
    assert c.read_value() == b"first"
    assert [c.line(), c.line()] == [b"STORED", b"STORED"]
    assert [c.read_value(), c.read_value(), c.read_value()] == [item, b"small", None]
    assert c.line().startswith(b"VERSION ")


def test_small_sets_beside_a_stream_of_large_ones_are_all_stored_in_order(make_server):
    """Another client's 8 MiB sets are read a slice per turn while this one sets small
    items: every one is acknowledged and comes back in order, the large ones whole."""
    srv = make_server()
    big = Conn(srv.connect())
    small = Conn(srv.connect())
    items = [_item(20 + n, 8 * MiB) for n in range(4)]
    flood = b"".join(b"set big 0 0 %d\r\n%s\r\n" % (len(item), item) for item in items)
    sender = threading.Thread(target=big.send, args=(flood,), daemon=True)
    sender.start()
    sets = 0
    while sets < 2000 and (sender.is_alive() or sets < 100):
        assert small.set("small", b"%06d" % sets) == b"STORED"
        sets += 1
    sender.join(30)
    assert [big.line() for _ in items] == [b"STORED"] * len(items)
    assert [small.get("small") for _ in range(sets + 1)] == [b"%06d" % i for i in range(sets)] + [
        None
    ]
    assert [big.get("big") for _ in range(len(items) + 1)] == [*items, None]
