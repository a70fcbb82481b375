"""A bug in a command handler costs that one request, never the connection.

An in-process server on a loopback port (so the table entry can be made to
fail), spoken to over a real socket.
"""

from __future__ import annotations

import asyncio

from kestreld.frontends.memcache.commands import COMMANDS
from kestreld.frontends.memcache.framing import Command


def _broken(conn, args) -> None:
    raise RuntimeError("a bug")


async def test_a_handler_exception_is_server_error_and_the_connection_lives(served, monkeypatch):
    monkeypatch.setattr(COMMANDS[b"stats"], "run", _broken)
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(b"set q 0 0 1\r\nx\r\nstats\r\nget q\r\nstats noreply\r\nversion\r\n")
        await writer.drain()
        lines = [await asyncio.wait_for(reader.readline(), 10) for _ in range(6)]
        assert lines[:5] == [
            b"STORED\r\n",
            b"SERVER_ERROR internal error\r\n",
            b"VALUE q 0 1\r\n",
            b"x\r\n",
            b"END\r\n",
        ]
        assert lines[5].startswith(b"SERVER_ERROR internal error")  # no noreply on stats
        assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"VERSION ")
    finally:
        writer.close()


async def test_a_failing_set_header_skips_its_block(served, monkeypatch):
    # The table's own set calls its handlers directly (compiled, a C call): a set whose
    # accept fails is a plain Command put in its place.
    good = COMMANDS[b"set"]
    broken = Command(
        b"set",
        good.run,
        shape=good.shape,
        noreply_after=good.noreply_after,
        accept=lambda conn, args, size: 1 / 0,
        waits_for_sets=good.waits_for_sets,
    )
    monkeypatch.setitem(COMMANDS, b"set", broken)
    reader, writer = await asyncio.open_connection("127.0.0.1", served.port)
    try:
        writer.write(b"set q 0 0 9\r\nflush_all\r\nversion\r\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.readline(), 10) == b"SERVER_ERROR internal error\r\n"
        assert (await asyncio.wait_for(reader.readline(), 10)).startswith(b"VERSION ")
    finally:
        writer.close()
