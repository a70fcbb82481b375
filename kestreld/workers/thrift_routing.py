"""Kestrel's thrift front end under ``workers = N``: each call runs where its queue lives.

A call is judged where it landed: its frame walked and decoded, its client authenticated
(kestreld/frontends/thrift/connection.py does that before
:meth:`~ThriftConnection.run_call`), its queue name and role checked here.  One naming a
queue another worker owns is then sent, its frame as the client wrote it (its sequence
id too), over this connection's own connection to that worker's thrift channel
(kestreld/workers/wire_channels.py), whose ordinary thrift connection runs it with its
session: ``put``, ``get`` (with its timeout, or its ``auto_abort_msec``: the ids live at
the owner, and ``confirm`` / ``abort`` naming that queue reach them from any connection),
``peek``, ``flush_queue``, ``delete_queue``.  The client leaving closes the channel
connection: the reads a waiting ``get`` holds go back there.

``flush_all_queues`` and ``set_status`` run in every worker (the others first: a failure
is the client's reply); ``current_status`` and ``get_version`` are answered here.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from kestreld.frontends.thrift import codec
from kestreld.frontends.thrift.connection import _FROM_THRIFT, Call, CallError, ThriftConnection
from kestreld.security.policy import Role
from kestreld.workers.channel import ChannelCount
from kestreld.workers.wire_channels import (
    THRIFT,
    ChannelSide,
    ClientSide,
    WireUpstreams,
    read_frame,
)

#: Methods naming one queue (``queue_name``): the role each needs there.
QUEUE_METHODS = {
    "put": Role.WRITE,
    "get": Role.READ,
    "confirm": Role.READ,
    "abort": Role.READ,
    "peek": Role.READ,
    "flush_queue": Role.ADMIN,
    "delete_queue": Role.ADMIN,
}
#: Methods every worker runs.
EVERYWHERE = frozenset(("flush_all_queues", "set_status"))

_LENGTH = struct.Struct(">i")
_WORD = struct.Struct(">I")


def is_exception(reply: bytes) -> bool:
    """Is this framed reply (the owner's, strict binary protocol) an exception?"""
    return len(reply) >= 8 and _WORD.unpack_from(reply, 4)[0] & 0xFF == codec.EXCEPTION


def _gone(call: Call, index: int) -> bytes:
    message = f"worker {index} is not serving (it is restarting); try again"
    return codec.encode_exception(call.method, call.seqid, codec.INTERNAL_ERROR, message)


class RoutedThriftConnection(ClientSide, ThriftConnection):
    """A thrift client of a worker."""

    def __init__(self, server: Any) -> None:
        super().__init__(server)
        self.router = server.router
        self.upstreams = WireUpstreams(server.role.folder, THRIFT, 64 * 1024)

    async def run_call(self, call: Call, handler: Any, args: Any) -> None:
        method = call.method
        router = self.router
        role = QUEUE_METHODS.get(method)
        if role is not None:
            try:
                name = self.queue_name(args.queue_name, writing=method == "put")
                self.permit(role, name)
            except CallError:  # the handler answers it, as it would have here
                await super().run_call(call, handler, args)
                return
            owner = router._owner(name.encode())
            if owner >= 0 and owner != router.index:
                router.crossed += 1
                await self._forward(owner, call)
                return
        elif method in EVERYWHERE:
            await self._everywhere(call, handler, args)
            return
        router.local += 1
        await super().run_call(call, handler, args)

    async def _forward(self, owner: int, call: Call) -> None:
        frame = _LENGTH.pack(len(call.frame)) + call.frame
        upstream = await self.upstreams.to(owner)
        if call.mtype == codec.ONEWAY:
            if upstream is not None:
                upstream.send(frame)
            return
        if upstream is None:
            self.write(_gone(call, owner))
            return
        last = self.eof and not self.inbox  # the client's last call: no wait at the owner
        reply = await upstream.ask(frame, read_frame, last)
        self.write(reply if reply is not None else _gone(call, owner))

    async def _everywhere(self, call: Call, handler: Any, args: Any) -> None:
        """``flush_all_queues``, ``set_status``: the other workers, then this one."""
        try:
            self.permit(Role.ADMIN)
            if call.method == "set_status" and args.status not in _FROM_THRIFT:
                raise CallError(codec.PROTOCOL_ERROR, "status")
        except CallError:  # the handler answers it, as it would have here
            await super().run_call(call, handler, args)
            return
        frame = _LENGTH.pack(len(call.frame)) + call.frame
        for index in range(self.router.ownership.count):
            if index == self.router.index:
                continue
            upstream = await self.upstreams.to(index)
            if call.mtype == codec.ONEWAY:  # nothing is answered, by anyone
                if upstream is not None:
                    upstream.send(frame)
                continue
            reply = None if upstream is None else await upstream.ask(frame, read_frame)
            if reply is None or is_exception(reply):
                self.write(reply if reply is not None else _gone(call, index))
                return
        await super().run_call(call, handler, args)


class ThriftChannelConnection(ChannelSide, ThriftConnection):
    """The owner's end of another worker's thrift client: its ordinary thrift connection."""

    def __init__(self, server: Any, count: ChannelCount) -> None:
        self.count = count
        ThriftConnection.__init__(self, server)

    def identify(self, transport: Any) -> None:
        """Judged where the client landed (its certificate was that worker's to check)."""

    def permit(self, role: Role, queue: str | None = None) -> None:
        """Judged where the client landed."""


def thrift_channel(server: Any, count: ChannelCount) -> asyncio.Protocol:
    return ThriftChannelConnection(server, count)
