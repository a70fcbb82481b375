"""A text or thrift client connection's connections to the owners of the queues it names.

Kestrel's text and thrift front ends run one request of a connection at a time
(kestreld/frontends/core/request_loop.py), so a crossed request is simple: its bytes, as
the client wrote them, go to the owner's channel for that wire format
(``worker-<i>.text.sock``, ``worker-<i>.thrift.sock``), where the owner's ordinary
connection of that front end serves them with its own session; the request's reply is
read back whole and written to the client, then the next request runs.  Replies stay in
request order by construction, and the reads opened at the owner belong to that channel
connection: closing it (the client left) gives them back in order, there.

A channel lost mid-request (the owner died) answers that request with ``None``; the
caller tells its client and the next request opens a new connection.
"""

from __future__ import annotations

import asyncio
import os
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from kestreld.workers.channel import ChannelCount

log = structlog.get_logger("kestreld.workers")

#: Wire formats with a channel of their own.
TEXT = "text"
THRIFT = "thrift"

_LENGTH = struct.Struct(">i")
#: What a read of a lost (or garbled) channel raises: EOFError covers a reply cut short.
_LOST = (OSError, EOFError, ValueError, asyncio.LimitOverrunError)

#: The owner's reply: read from the channel, or None when it was lost first.
ReadReply = Callable[[asyncio.StreamReader], Awaitable[bytes]]


def wire_channel_path(folder: str, index: int, wire: str) -> str:
    return os.path.join(folder, f"worker-{index}.{wire}.sock")


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """One text reply: a line ended by ``\\n``."""
    return await reader.readuntil(b"\n")


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """One thrift reply: a frame, its 4-byte length included."""
    head = await reader.readexactly(4)
    (size,) = _LENGTH.unpack(head)
    if size < 0:
        raise ValueError(f"frame of {size} bytes")
    return head + await reader.readexactly(size)


class WireUpstream:
    """One client connection's connection to worker ``index``'s channel of one wire format."""

    __slots__ = ("index", "path", "limit", "reader", "writer", "lost", "finished")

    def __init__(self, index: int, path: str, limit: int) -> None:
        self.index = index
        self.path = path
        #: The longest reply line read (a text item, a thrift frame).
        self.limit = limit
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.lost = False
        self.finished = False  # half-closed: the owner answers what it was sent, then closes

    async def open(self) -> bool:
        try:
            self.reader, self.writer = await asyncio.open_unix_connection(
                self.path, limit=self.limit
            )
        except OSError as e:
            log.warning("worker_unreachable", worker=self.index, error=e.strerror or str(e))
            self.lost = True
            return False
        return True

    async def ask(self, request: bytes, read: ReadReply, last: bool = False) -> bytes | None:
        """Send ``request`` and read its reply (None: the channel was lost first).
        ``last``: the client's last request, so the owner does not wait for an item."""
        if self.lost or self.finished or self.writer is None:
            return None
        try:
            self.writer.write(request)
        except OSError:
            self.close()
            return None
        if last:
            self.finish()
        return await self.read(read)

    async def read(self, read: ReadReply) -> bytes | None:
        """The next reply (the next line of a ``monitor``); None: the channel was lost."""
        if self.lost or self.reader is None:
            return None
        try:
            return await read(self.reader)
        except _LOST as e:
            log.warning("worker_channel_lost", worker=self.index, error=str(e) or type(e).__name__)
            self.close()
            return None

    def send(self, request: bytes) -> None:
        """Send a request that expects no reply (a thrift oneway call)."""
        if not (self.lost or self.finished) and self.writer is not None:
            self.writer.write(request)

    def finish(self) -> None:
        """The client sent its last request: a wait at the owner ends now, with its empty
        reply (the owner's connection does that on a half-close, as for a client's own)."""
        if self.lost or self.finished or self.writer is None:
            return
        self.finished = True
        try:
            self.writer.write_eof()
        except OSError:
            self.close()

    def close(self) -> None:
        """The client left: the owner's channel connection closes (its reads go back)."""
        self.lost = True
        if self.writer is not None:
            self.writer.close()


class WireUpstreams:
    """The upstreams of one client connection, by owner, opened on first use."""

    __slots__ = ("folder", "wire", "limit", "by_owner")

    def __init__(self, folder: str, wire: str, limit: int) -> None:
        self.folder = folder
        self.wire = wire
        self.limit = limit
        self.by_owner: dict[int, WireUpstream] = {}

    async def to(self, owner: int) -> WireUpstream | None:
        upstream = self.by_owner.get(owner)
        if upstream is not None and not upstream.lost:
            return upstream
        upstream = WireUpstream(owner, wire_channel_path(self.folder, owner, self.wire), self.limit)
        if not await upstream.open():
            self.by_owner.pop(owner, None)
            return None
        self.by_owner[owner] = upstream
        return upstream

    def finish(self) -> None:
        for upstream in self.by_owner.values():
            upstream.finish()

    def close(self) -> None:
        for upstream in self.by_owner.values():
            upstream.close()
        self.by_owner.clear()


class ClientSide:
    """What a client connection of a worker adds to its front end's ordinary connection
    (mixed in before it): the client's life reaches its connections to the owners, and
    it counts against the box's ``max_connections``."""

    server: Any
    upstreams: WireUpstreams
    inbox: Any
    eof: bool

    def eof_received(self) -> bool | None:
        keep = super().eof_received()  # type: ignore[misc]
        if not self.inbox:  # nothing left to send on: a wait at an owner ends now
            self.upstreams.finish()
        return keep

    def close(self) -> None:
        super().close()  # type: ignore[misc]
        self.upstreams.finish()  # a forwarded wait in progress is answered now

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)  # type: ignore[misc]
        self.upstreams.close()  # its reads at the owners go back

    def close_now(self) -> None:
        super().close_now()  # type: ignore[misc]
        self.upstreams.close()

    def too_many(self) -> bool:
        return not self.server.role.admits_client(self.server)


class ChannelSide:
    """What the owner's end of a text or thrift channel changes in its front end's
    ordinary connection (mixed in before it): the worker that forwarded the request
    judged the client's authentication and roles, so the channel is trusted; it is never
    idle-closed (its client may be idle, and closing it would give that client's open
    reads back); and ``stats`` leaves it out of the connection counts."""

    count: ChannelCount

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.count.open += 1
        self.count.total += 1
        super().connection_made(transport)  # type: ignore[misc]

    def connection_lost(self, exc: Exception | None) -> None:
        self.count.open -= 1
        super().connection_lost(exc)  # type: ignore[misc]

    def unauthenticated(self) -> bool:
        return False

    def idle_for(self, now: float) -> float:
        return 0.0

    def too_many(self) -> bool:
        return False  # the workers' own, outside max_connections: its client was admitted


async def serve_wire_channel(
    path: str, factory: Callable[[], asyncio.Protocol]
) -> asyncio.AbstractServer:
    """Listen on ``path`` (a stale socket of a dead predecessor is removed first)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(factory, path, backlog=4096)


async def serve_wire_channels(
    server: Any, index: int, folder: str, count: ChannelCount
) -> tuple[dict[str, type], list[asyncio.AbstractServer]]:
    """The text and thrift channels of worker ``index``, for the front ends the config
    turns on: the classes of this worker's client connections by front end, and the
    channels' servers."""
    config = server.config
    classes: dict[str, type] = {}
    servers: list[asyncio.AbstractServer] = []
    if config.text_port:  # imported only when on, as the front ends themselves
        from kestreld.workers.text_routing import RoutedTextConnection, text_channel

        classes[TEXT] = RoutedTextConnection
        path = wire_channel_path(folder, index, TEXT)
        servers.append(await serve_wire_channel(path, lambda: text_channel(server, count)))
    if config.thrift_port:
        from kestreld.workers.thrift_routing import RoutedThriftConnection, thrift_channel

        classes[THRIFT] = RoutedThriftConnection
        path = wire_channel_path(folder, index, THRIFT)
        servers.append(await serve_wire_channel(path, lambda: thrift_channel(server, count)))
    return classes, servers
