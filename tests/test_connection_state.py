"""Per-connection state stays bounded over a long-lived connection.

An in-process server (started on a loopback port like any other) whose
connections are driven through in-memory transports, so the test can look at
a connection's own bookkeeping after thousands of requests.
"""

from __future__ import annotations

import asyncio

import pytest
from memory_transport import MemoryTransport

from kestreld.protocol.connection import MemcacheConnection
from kestreld.server import Server, build_server_config


@pytest.fixture
async def connected(tmp_path):
    """A connection of a started in-process server, and the transport it writes to."""
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    conn = MemcacheConnection(server)
    transport = MemoryTransport()
    conn.connection_made(transport)
    yield conn, transport
    await server.stop()


async def _tick() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_a_producer_that_only_sets_keeps_no_acknowledged_batches(connected):
    producer, transport = connected
    for i in range(3000):
        queue = b"a" if i % 3 else b"b"  # two journals: batches resolve in any order
        producer.data_received(b"set %s 0 0 4\r\n%04d\r\n" % (queue, i % 10000))
        await _tick()
    assert bytes(transport.data) == b"STORED\r\n" * 3000
    assert producer.unacked == [], "acknowledged batches are let go"
    assert producer.out == [] and producer.pending_batches == 0


async def test_pipelined_sets_then_a_get_still_wait_for_their_batch(connected):
    conn, transport = connected
    conn.data_received(b"set p 0 0 1\r\nx\r\nset p 0 0 1\r\ny\r\nget p\r\n")
    assert bytes(transport.data) == b"", "nothing before the batch is written"
    await _tick()
    assert bytes(transport.data) == b"STORED\r\nSTORED\r\nVALUE p 0 1\r\nx\r\nEND\r\n"
    assert conn.unacked == [] and not conn.held
