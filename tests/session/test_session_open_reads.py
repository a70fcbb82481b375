"""A session's line of open reads per queue, around a /close/open that waits.

A consumer that confirms its read and waits for the next (``get q/close/open/t=``)
keeps its emptied line while it waits, for the item the wait brings; a wait that
ends without one leaves no empty line behind.  An in-process server on a loopback
port (so the session can be looked at), spoken to over a real socket.
"""

from __future__ import annotations

import asyncio


async def _call(reader, writer, request: bytes, ending: bytes) -> bytes:
    writer.write(request)
    await writer.drain()
    return await asyncio.wait_for(reader.readuntil(ending), 10)


def _lines(server, writer) -> dict:
    """The session's lines of open reads (queue: reads) of the connection ``writer`` is."""
    port = writer.get_extra_info("sockname")[1]
    (conn,) = [c for c in server.connections if c.peer[1] == port]
    return {r.full_name: len(reads) for r, reads in conn.session.open_reads.items()}


async def test_a_close_open_wait_keeps_one_read_or_no_line(served):
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        assert await _call(reader, writer, b"set q 0 0 1\r\na\r\n", b"\r\n") == b"STORED\r\n"
        got = await _call(reader, writer, b"get q/open\r\n", b"END\r\n")
        assert got.endswith(b"a\r\nEND\r\n")
        assert _lines(served, writer) == {"q": 1}
        # Confirms a, waits 50 ms, gets nothing: no empty line is left.
        assert await _call(reader, writer, b"get q/close/open/t=50\r\n", b"END\r\n") == b"END\r\n"
        assert _lines(served, writer) == {}
        # Opens b: one read.
        await _call(reader, writer, b"set q 0 0 1\r\nb\r\n", b"\r\n")
        got = await _call(reader, writer, b"get q/open\r\n", b"END\r\n")
        assert got.endswith(b"b\r\nEND\r\n")
        # Confirms b and waits; c arrives from another connection during the wait.
        writer.write(b"get q/close/open/t=5000\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        assert _lines(served, writer) == {"q": 0}  # kept while it waits
        r2, w2 = await asyncio.open_connection("127.0.0.1", served.port)
        try:
            assert await _call(r2, w2, b"set q 0 0 1\r\nc\r\n", b"\r\n") == b"STORED\r\n"
        finally:
            w2.close()
            await w2.wait_closed()
        got = await asyncio.wait_for(reader.readuntil(b"END\r\n"), 10)
        assert got.endswith(b"c\r\nEND\r\n")
        assert _lines(served, writer) == {"q": 1}
        # Confirms c with a plain /close: the line goes.
        assert await _call(reader, writer, b"get q/close\r\n", b"END\r\n") == b"END\r\n"
        assert _lines(served, writer) == {}
    finally:
        writer.close()
        await writer.wait_closed()
