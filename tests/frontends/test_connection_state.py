"""Per-connection state stays bounded over a long-lived connection.

An in-process server (started on a loopback port like any other).  Most tests
drive a connection through an in-memory transport, so they can look at its own
bookkeeping after thousands of requests; that transport never pushes back, so
flow control is tested through a real loopback socket.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
from waiting import until

from kestreld.frontends.memcache import connection as connection_module
from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.server import Server, build_server_config
from kestreld.testing.memory_transport import MemoryTransport


@pytest.fixture
async def connected(tmp_path):
    """A connection of a started in-process server, and the transport it writes to."""
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    conn = MemcacheConnection(server, COMMANDS, UNKNOWN)
    transport = MemoryTransport()
    conn.connection_made(transport)
    yield conn, transport
    await server.stop()


async def test_replies_to_a_transport_that_is_not_a_plain_socket_go_through_it(connected):
    """Only a plain uvloop socket is written to directly: an in-memory transport (as a TLS
    one, whose socket carries records) gets every reply through its own ``write``."""
    conn, transport = connected
    assert conn.fd == -1
    conn.data_received(b"set q 0 0 2\r\nhi\r\nget q\r\n")
    await _tick()
    assert bytes(transport.data) == b"STORED\r\nVALUE q 0 2\r\nhi\r\nEND\r\n"


async def _tick() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_producer_that_only_sets_keeps_no_acknowledged_batches(connected):
    producer, transport = connected
    for i in range(3000):
        queue = b"a" if i % 3 else b"b"  # two journals: batches resolve in any order
        producer.data_received(b"set %s 0 0 4\r\n%04d\r\n" % (queue, i % 10000))
        await _tick()
        assert len(producer.session.unacked) <= 2, "acknowledged batches are let go"
    assert bytes(transport.data) == b"STORED\r\n" * 3000
    assert not producer.session.puts_pending() and producer.session.unacked == []
    assert producer.out == [] and producer.pending == 0


PIPELINED = b"set p 0 0 1\r\nx\r\nset p 0 0 1\r\ny\r\nget p\r\n"
PIPELINED_REPLIES = b"STORED\r\nSTORED\r\nVALUE p 0 1\r\nx\r\nEND\r\n"


async def test_pipelined_sets_then_a_get_still_wait_for_their_batch(connected):
    """With other clients connected, a read's journal write waits for the loop's next turn
    (their requests join it): nothing is answered before it."""
    conn, transport = connected
    other = MemcacheConnection(conn.server, COMMANDS, UNKNOWN)
    other.connection_made(MemoryTransport())
    conn.data_received(PIPELINED)
    assert bytes(transport.data) == b"", "nothing before the batch is written"
    assert conn.server.queues.tick.scheduled
    await _tick()
    assert bytes(transport.data) == PIPELINED_REPLIES
    assert conn.session.unacked == [] and not conn.held
    other.connection_lost(None)


async def test_a_lone_clients_read_is_written_and_answered_before_its_callback_returns(
    connected,
):
    """The server's only client: nobody could share its write, so the read's records are
    written at the end of its read, then its replies go, in order, at once."""
    conn, transport = connected
    assert len(conn.server.connections) == 1
    conn.data_received(PIPELINED)
    assert bytes(transport.data) == PIPELINED_REPLIES
    assert conn.session.unacked == [] and not conn.held and conn.pending == 0
    queue = conn.server.queues.queues["p"]
    segment = queue.journal.segments[-1]
    assert segment.visible == segment.size, "acknowledged: on disk first"
    assert not conn.server.queues.tick.scheduled and not conn.server.queues.tick.writers


async def test_a_client_that_does_not_read_is_paused_on_a_real_socket(tmp_path):
    """Replies back up -> the server stops writing, then stops reading; both resume."""
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    try:
        item = b"i" * 16384
        # Each request is a line padded to 8000 bytes with spaces (legal): 8 MB of requests
        # asking for 16 MB of replies, far more than the socket buffers hold.
        request = b"get big/peek" + b" " * 7986 + b"\r\n"
        count = 1000
        sock = socket.create_connection(("127.0.0.1", server.port))
        set_big = b"set big 0 0 %d\r\n%s\r\n" % (len(item), item)
        sock.sendall(set_big)
        await until(lambda: len(server.connections) == 1, "the connection is accepted")
        conn = next(iter(server.connections))
        sender = threading.Thread(target=sock.sendall, args=(request * count,), daemon=True)
        sender.start()
        await until(lambda: conn.write_paused, "writing paused (the client reads nothing)")
        await until(lambda: conn.read_paused, "reading paused (input backs up)")
        for _ in range(30):  # a pause that does nothing would read on meanwhile
            await asyncio.sleep(0.01)
        assert conn.read_paused and conn.write_paused
        assert len(conn.framing.buf) <= connection_module.INPUT_PAUSE_LIMIT + 512 * 1024
        assert conn.transport.get_write_buffer_size() <= 1024 * 1024
        assert conn.stats.bytes_read < len(request) * count

        # Now the client reads: every reply arrives, whole and in order, and both resume.
        expected = (
            b"STORED\r\n" + b"VALUE big/peek 0 %d\r\n%s\r\nEND\r\n" % (len(item), item) * count
        )
        received = bytearray()

        def read_all() -> None:
            sock.settimeout(60)
            while len(received) < len(expected):
                chunk = sock.recv(1 << 20)
                if not chunk:
                    break
                received.extend(chunk)

        await asyncio.get_running_loop().run_in_executor(None, read_all)
        sender.join(10)
        assert received == expected
        await until(lambda: not conn.read_paused and not conn.write_paused, "resumed")
        assert conn.stats.bytes_read == len(request) * count + len(set_big)
        sock.close()
    finally:
        await server.stop()


async def test_clients_waiting_for_an_item_are_counted_until_every_kind_of_end(tmp_path):
    """A producer whose only peers wait for items writes its sets at once (the journal tick
    counts waiting clients: they send nothing that could join the write); each end of a wait
    (an item, the timeout, the client leaving) takes it off the count."""
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    tick = server.queues.tick
    try:
        consumer_r, consumer_w = await asyncio.open_connection("127.0.0.1", server.port)
        producer_r, producer_w = await asyncio.open_connection("127.0.0.1", server.port)
        consumer_w.write(b"get q/t=5000\r\n")
        await until(lambda: tick.waiting == 1, "the consumer's wait is counted")
        assert len(server.connections) - tick.waiting == 1  # the producer is alone
        producer_w.write(b"set q 0 0 2\r\nhi\r\n")
        assert await producer_r.readline() == b"STORED\r\n"
        assert await consumer_r.readline() == b"VALUE q/t=5000 0 2\r\n"
        assert await consumer_r.readline() == b"hi\r\n"
        assert await consumer_r.readline() == b"END\r\n"
        await until(lambda: tick.waiting == 0, "an item ended the wait")
        consumer_w.write(b"get q/t=50\r\n")
        assert await consumer_r.readline() == b"END\r\n"
        await until(lambda: tick.waiting == 0, "the timeout ended the wait")
        leaving_r, leaving_w = await asyncio.open_connection("127.0.0.1", server.port)
        leaving_w.write(b"get q/t=5000\r\n")
        await until(lambda: tick.waiting == 1, "the second consumer's wait is counted")
        leaving_w.close()
        await until(lambda: tick.waiting == 0, "leaving ended the wait")
        for w in (consumer_w, producer_w):
            w.close()
    finally:
        await server.stop()
    assert tick.waiting == 0


async def test_a_consumer_served_by_a_put_runs_its_next_requests_after_the_put_is_offered(
    tmp_path,
):
    """A waiting get served by a put is answered once the put was offered to every reader
    of its queue, and the requests its client sent behind the get run then.  Those may add
    readers to that very queue: never in the middle of the offers (the item reaches each
    reader that existed exactly once, and none made after it)."""
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    tick = server.queues.tick
    try:
        streams = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
        (a_r, a_w), (b_r, b_w), (p_r, p_w) = streams
        for name, (r, w) in (("a", streams[0]), ("b", streams[1])):
            w.write(b"get q+%s\r\n" % name.encode())  # the readers exist, empty
            assert await r.readline() == b"END\r\n"
        a_w.write(b"get q+a/t=5000\r\nget q+late1\r\n")
        b_w.write(b"get q+b/t=5000\r\nget q+late2\r\n")
        await until(lambda: tick.waiting == 2, "both consumers wait")
        p_w.write(b"set q 0 0 2\r\nhi\r\n")
        assert await p_r.readline() == b"STORED\r\n"
        for name, late, r in (("a", b"late1", a_r), ("b", b"late2", b_r)):
            assert await r.readline() == b"VALUE q+%s/t=5000 0 2\r\n" % name.encode()
            assert await r.readline() == b"hi\r\n"
            assert await r.readline() == b"END\r\n"
            assert await r.readline() == b"END\r\n", late  # a reader made after the put
        queue = server.queues.queues["q"]
        assert sorted(queue.readers) == ["", "a", "b", "late1", "late2"]  # "": the queue's own
        assert [queue.readers[name].items for name in sorted(queue.readers)] == [1, 0, 0, 0, 0]
        p_w.write(b"set q 0 0 3\r\nbye\r\n")
        assert await p_r.readline() == b"STORED\r\n"
        for name in ("a", "b", "late1", "late2"):  # every reader gets the next item once
            a_w.write(b"get q+%s\r\n" % name.encode())
            assert await a_r.readline() == b"VALUE q+%s 0 3\r\n" % name.encode()
            assert await a_r.readline() == b"bye\r\n"
            assert await a_r.readline() == b"END\r\n"
        for _, w in streams:
            w.close()
    finally:
        await server.stop()


def test_replies_that_back_up_on_a_real_server_arrive_whole_and_in_order(make_server):
    """A real kestreld (uvloop; compiled, replies are sent to the socket directly while
    the transport holds nothing): a client asks for far more than the socket buffers
    hold and reads nothing, so the replies back up into the transport; then it reads.
    Every item arrives once, whole and in queue order, and the connection goes on
    answering afterwards (replies sent directly again once the transport drained)."""
    server = make_server()
    size, count = 16384, 400  # 6.5 MB of replies
    sock = server.connect()
    sock.settimeout(30)
    items = [b"%06d" % i + b"v" * (size - 6) for i in range(count)]
    sock.sendall(b"".join(b"set q 0 0 %d\r\n%s\r\n" % (size, item) for item in items))
    stored = b""
    while len(stored) < 8 * count:
        stored += sock.recv(65536)
    assert stored == b"STORED\r\n" * count
    sender = threading.Thread(target=sock.sendall, args=(b"get q\r\n" * count,), daemon=True)
    sender.start()
    time.sleep(1.0)  # the server writes until the socket is full, then buffers
    expected = b"".join(b"VALUE q 0 %d\r\n%s\r\nEND\r\n" % (size, item) for item in items)
    received = bytearray()
    while len(received) < len(expected):
        chunk = sock.recv(1 << 20)
        assert chunk, "closed early"
        received.extend(chunk)
    sender.join(10)
    assert received == expected
    for i in range(3):
        sock.sendall(b"set q 0 0 2\r\nz%d\r\nget q\r\n" % i)
        reply = b""
        while not reply.endswith(b"END\r\n"):
            reply += sock.recv(65536)
        assert reply == b"STORED\r\nVALUE q 0 2\r\nz%d\r\nEND\r\n" % i
    sock.close()
