"""What a worker process is told at birth, and what it adds to the server it runs.

The supervisor (supervisor.py) forks each worker with the listening sockets it bound
once (every worker accepts on the same sockets), the private folder of the channels,
and a pipe on which the worker says it serves.  The worker's :class:`Server` then loads
only the queues it owns, serves its channel to the other workers, and routes its clients'
requests (routing.py).
"""

from __future__ import annotations

import asyncio
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from kestreld.frontends.memcache.framing import Command
from kestreld.workers.box_connections import BoxConnections
from kestreld.workers.channel import (
    ChannelCount,
    channel_commands,
    channel_path,
    serve_channel,
)
from kestreld.workers.handoff import Handoff
from kestreld.workers.ownership import Ownership
from kestreld.workers.queue_budget import BoxQueueCount
from kestreld.workers.routing import Router
from kestreld.workers.wire_channels import serve_wire_channels


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
    handoff: Handoff | None = None
    box_queues: BoxQueueCount | None = None
    box_connections: BoxConnections | None = None
    publishing: asyncio.Task | None = None
    #: The classes of this worker's text and thrift client connections, by front end.
    front_ends: dict[str, type] = field(default_factory=dict)
    wire_channels: list[asyncio.AbstractServer] = field(default_factory=list)

    #: How often a worker writes its queue count for the box's ``max_queues``.
    PUBLISH_INTERVAL = 1.0

    def __post_init__(self) -> None:
        self.ownership = Ownership(self.index, self.count)

    @property
    def serves_box(self) -> bool:
        """The admin port, the ZooKeeper membership and the status file are worker 0's
        (the admin port shows the box's figures: box_figures.py)."""
        return self.index == 0

    async def attach(self, server: Any) -> Router:
        """Serve this worker's channels and route ``server``'s requests."""
        # Before any client is accepted (a restarted worker's slot starts at zero).
        self.box_connections = BoxConnections(self.folder, self.index, self.count)
        self.router = Router(server, self.ownership, self.folder)
        table = channel_commands(self.router)
        if server.config.metrics_port is not None:  # worker 0 asks for them (admin port)
            from kestreld.workers.box_figures import cmd_figures

            table[b"figures"] = Command(b"figures", cmd_figures)
        self.channel = await serve_channel(
            server, channel_path(self.folder, self.index), self.channel_count, table
        )
        self.front_ends, self.wire_channels = await serve_wire_channels(
            server, self.index, self.folder, self.channel_count
        )
        server.queues.relay_puts_to(self.router.put_elsewhere)
        # Always listened for (a reload may turn worker_handoff on; another worker may hand).
        self.handoff = Handoff(server, self.folder, self.index)
        self.handoff.listen(asyncio.get_running_loop())
        self.router.handoff = self.handoff
        # Always (a reload may set max_queues): one small file, one write a second.
        self.box_queues = BoxQueueCount(self.folder, self.index, self.count)
        server.queues.box_queues = self.box_queues
        self.publishing = asyncio.get_running_loop().create_task(self._publish(server))
        return self.router

    async def _publish(self, server: Any) -> None:
        """This worker's queue count, written now and every second: what it deleted or
        expired frees the box's ``max_queues`` budget for every worker."""
        assert self.box_queues is not None
        while True:
            self.box_queues.publish(len(server.queues.queues))
            await asyncio.sleep(self.PUBLISH_INTERVAL)

    def clients(self, server: Any) -> int:
        """This worker's client connections (its channels are the workers' own)."""
        return len(server.connections) - self.channel_count.open

    def admits_client(self, server: Any) -> bool:
        """A client just accepted here is within the box's ``max_connections``."""
        assert self.box_connections is not None
        return self.box_connections.admit(self.clients(server), server.config.max_connections)

    def connections_changed(self, server: Any) -> None:
        """A connection closed here, or a handed one arrived (one admitted here was
        counted by :meth:`admits_client`)."""
        if self.box_connections is not None:
            self.box_connections.publish(self.clients(server))

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
        if self.publishing is not None:
            self.publishing.cancel()
        if self.box_queues is not None:
            self.box_queues.close()
            self.box_queues = None
        if self.box_connections is not None:
            self.box_connections.close()
            self.box_connections = None
        if self.channel is not None:
            self.channel.close()
        for channel in self.wire_channels:
            channel.close()
        if self.handoff is not None:
            self.handoff.close()
        if self.router is not None:
            self.router.close()
