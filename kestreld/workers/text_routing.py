"""Kestrel's text front end under ``workers = N``: each request runs where its queue lives.

A client's request is judged where it landed (authentication, roles: the ordinary
:class:`~kestreld.frontends.text.connection.TextConnection` does that before
:meth:`~TextConnection.run`); one naming a queue another worker owns is then sent, as
the client wrote it, over this connection's own connection to that worker's text channel
(kestreld/workers/wire_channels.py), whose ordinary text connection serves it with its
session: ``get`` with its implicit confirm, ``peek``, ``monitor`` (its items relayed as
they come), ``confirm``, ``flush``, ``delete``, ``put``.  The client leaving closes the
channel connection, and its open reads go back there, in order.

``status <word>`` is set in every worker (the others first: a refusal is the client's
reply); ``shutdown`` asks the supervisor, which stops every worker.  ``status``,
``version``, ``auth`` and ``quit`` are answered here.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Any

import structlog

from kestreld.frontends.text.connection import ZERO, TextConnection, error
from kestreld.frontends.text.parser import TextRequest
from kestreld.workers.channel import ChannelCount
from kestreld.workers.wire_channels import (
    TEXT,
    ChannelSide,
    ClientSide,
    WireUpstreams,
    read_line,
)

if TYPE_CHECKING:
    from kestreld.frontends.text.connection import Handler

log = structlog.get_logger("kestreld.workers")

#: Commands naming one queue in their first argument: run by its owner.
QUEUE_COMMANDS = frozenset((b"put", b"get", b"peek", b"monitor", b"confirm", b"flush", b"delete"))
#: A reply line that ends a ``monitor`` (``*``, or an error).
_MONITOR_END = (b"*\n", b"-")


def text_request(request: TextRequest) -> bytes:
    """The request's bytes as the client wrote them (one ``\\r`` before a ``\\n`` aside)."""
    line = b" ".join([request.command, *request.args])
    if request.items is None:
        return line + b"\n"
    return b"".join([line, b":\n", *(item + b"\n" for item in request.items), b"\n"])


def _gone(index: int) -> bytes:
    return error(f"Worker {index} is not serving (it is restarting); try again.")


class RoutedTextConnection(ClientSide, TextConnection):
    """A text client of a worker."""

    def __init__(self, server: Any) -> None:
        super().__init__(server)
        self.router = server.router
        config = server.config
        limit = max(config.max_line_length, config.default_queue.max_item_size) + 1024
        self.upstreams = WireUpstreams(server.role.folder, TEXT, limit)

    async def run(self, request: TextRequest, handler: Handler) -> None:
        command = request.command
        args = request.args
        router = self.router
        if command in QUEUE_COMMANDS and args:
            owner = router._owner(args[0])
            if owner >= 0 and owner != router.index:
                router.crossed += 1
                await self._forward(owner, request)
                return
        elif command == b"status" and args:
            await self._everywhere(request, handler)
            return
        elif command == b"shutdown":
            self._shutdown()
            return
        router.local += 1
        await handler(self, args, request.items)

    async def _forward(self, owner: int, request: TextRequest) -> None:
        """Run ``request`` at ``owner`` and write its reply (a monitor's lines as they come)."""
        upstream = await self.upstreams.to(owner)
        if upstream is None:
            self.write(_gone(owner))
            return
        last = self.eof and not self.inbox  # the client's last request: no wait at the owner
        reply = await upstream.ask(text_request(request), read_line, last)
        if request.command != b"monitor":
            self.write(reply if reply is not None else _gone(owner))
            return
        while reply is not None and not reply.startswith(_MONITOR_END):
            self.write(reply)
            reply = await upstream.read(read_line)
        self.write(reply if reply is not None else _gone(owner))

    async def _everywhere(self, request: TextRequest, handler: Handler) -> None:
        """``status <word>``: the other workers set it, then this one (and answers)."""
        sent = text_request(request)
        for index in range(self.router.ownership.count):
            if index == self.router.index:
                continue
            upstream = await self.upstreams.to(index)
            reply = None if upstream is None else await upstream.ask(sent, read_line)
            if reply != ZERO:
                self.write(reply if reply is not None else _gone(index))
                return
        await handler(self, request.args, request.items)

    def _shutdown(self) -> None:
        self.write(ZERO)
        self.close()
        log.info("shutdown_requested", reason="shutdown command (text protocol)")
        os.kill(os.getppid(), signal.SIGTERM)  # the supervisor stops every worker


class TextChannelConnection(ChannelSide, TextConnection):
    """The owner's end of another worker's text client: its ordinary text connection."""

    def __init__(self, server: Any, count: ChannelCount) -> None:
        self.count = count
        TextConnection.__init__(self, server)

    def permitted(self, command: bytes, role: Any, args: list[bytes]) -> bool:
        return True  # judged where the client landed


def text_channel(server: Any, count: ChannelCount) -> asyncio.Protocol:
    return TextChannelConnection(server, count)
