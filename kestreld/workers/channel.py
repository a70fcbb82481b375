"""The local socket a worker serves its own queues on, to the other workers.

Each worker listens on ``worker-<i>.sock`` in the supervisor's private folder (mode
0700: only the server's own user reaches it).  What arrives there is what a client sent
to another worker for a queue this one owns; it is served by an ordinary memcache
connection with the unrouted command table, so the owner's session applies its rules,
and the reads opened there belong to that channel connection: one per client connection
of the forwarding worker, closed when that client leaves (its open reads come back in
order, as for any connection that drops).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN
from kestreld.frontends.memcache.connection import MemcacheConnection


def channel_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"worker-{index}.sock")


class ChannelCount:
    """The channel connections open now and ever (``stats`` leaves them out of the
    connection counts: they are the workers' own, not clients')."""

    __slots__ = ("open", "total")

    def __init__(self) -> None:
        self.open = 0
        self.total = 0


class ChannelConnection(MemcacheConnection):
    """A connection from another worker: never idle-closed (its client may be idle, and
    closing it would give that client's open reads back)."""

    __slots__ = ("count",)

    def __init__(self, server: Any, count: ChannelCount) -> None:
        super().__init__(server, COMMANDS, UNKNOWN)
        self.count = count

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.count.open += 1
        self.count.total += 1
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.count.open -= 1
        super().connection_lost(exc)

    def idle_for(self, now: float) -> float:
        return 0.0


async def serve_channel(server: Any, path: str, count: ChannelCount) -> asyncio.AbstractServer:
    """Listen on ``path`` (a stale socket of a dead predecessor is removed first)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(
        lambda: ChannelConnection(server, count), path, backlog=4096
    )
