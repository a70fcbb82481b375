"""What a worker process is told at birth, and what it adds to the server it runs.

The supervisor (supervisor.py) forks each worker with the listening sockets it bound
once (every worker accepts on the same sockets), the private folder of the channels,
and a pipe on which the worker says it serves.  The worker's :class:`Server` then loads
only the queues it owns, serves its channel to the other workers, and routes its clients'
requests (routing.py).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Any

from kestreld.workers.channel import (
    ChannelCount,
    channel_commands,
    channel_path,
    serve_channel,
)
from kestreld.workers.ownership import Ownership
from kestreld.workers.routing import Router


@dataclass(slots=True)
class WorkerRole:
    """Worker ``index`` of ``count``."""

    index: int
    count: int
    #: The listening sockets by front end ("memcache", ...), bound by the supervisor.
    sockets: dict[str, socket.socket]
    #: The supervisor's private folder (0700) of the workers' channel sockets.
    folder: str
    #: Written once the worker serves (the supervisor announces the box when all did).
    ready_fd: int = -1
    ownership: Ownership = field(init=False)
    channel_count: ChannelCount = field(default_factory=ChannelCount)
    channel: Any = None
    router: Router | None = None

    def __post_init__(self) -> None:
        self.ownership = Ownership(self.index, self.count)

    @property
    def serves_box(self) -> bool:
        """The admin port, the ZooKeeper membership and the status file are worker 0's."""
        return self.index == 0

    async def attach(self, server: Any) -> Router:
        """Serve this worker's channel and route ``server``'s memcache requests."""
        self.router = Router(server, self.ownership, self.folder)
        self.channel = await serve_channel(
            server,
            channel_path(self.folder, self.index),
            self.channel_count,
            channel_commands(self.router),
        )
        server.queues.relay_puts_to(self.router.put_elsewhere)
        return self.router

    def announce_ready(self) -> None:
        if self.ready_fd >= 0:
            try:
                os.write(self.ready_fd, b"R")
                os.close(self.ready_fd)
            except OSError:
                pass
            self.ready_fd = -1

    def stats(self) -> list[tuple[str, object]]:
        lines: list[tuple[str, object]] = [
            ("worker_channel_connections", self.channel_count.open),
            ("worker_channel_connections_total", self.channel_count.total),
        ]
        if self.router is not None:
            lines.extend(self.router.stats())
        return lines

    def close(self) -> None:
        if self.channel is not None:
            self.channel.close()
        if self.router is not None:
            self.router.close()
