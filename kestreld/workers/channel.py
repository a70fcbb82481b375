"""The local socket a worker serves its own queues on, to the other workers.

Each worker listens on ``worker-<i>.sock`` in the supervisor's private folder (mode
0700: only the server's own user reaches it).  What arrives there is what a client sent
to another worker for a queue this one owns; it is served by an ordinary memcache
connection with the unrouted command table, so the owner's session applies its rules,
and the reads opened there belong to that channel connection: one per client connection
of the forwarding worker, closed when that client leaves (its open reads come back in
order, as for any connection that drops).

One verb is the channel's own: ``put_item <queue> <error_count> <expire_ms> <bytes>``
and its block, the put of another worker's queue side (a punt, ``expire_to_queue``, an
alias's destination) with the item's fields a ``set`` has no words for: its error count
and its expiry to the millisecond.  ``STORED`` once the journal has it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from kestreld.frontends.memcache.codes import STORAGE
from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN, queue_name
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.frontends.memcache.framing import Command
from kestreld.frontends.memcache.replies import (
    BAD_COMMAND_LINE,
    BAD_QUEUE_NAME,
    NOT_STORED,
    STORED,
    server_error,
)
from kestreld.journal.clock import now_ms
from kestreld.journal.writer import JournalWriteError
from kestreld.queues.collection import NotOwned, TooManyQueues
from kestreld.queues.journaled_queue import QueueFull
from kestreld.session.reply import pending_put


def channel_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"worker-{index}.sock")


class ChannelCount:
    """The channel connections open now and ever: the workers' own, not clients', so they
    are neither counted as clients (``stats``, the admin port) nor refused by
    ``max_connections`` (:meth:`Server.clients` leaves them out)."""

    __slots__ = ("open", "total")

    def __init__(self) -> None:
        self.open = 0
        self.total = 0


def accept_put_item(conn: ChannelConnection, args: list[bytes], size: int) -> bool:
    """The line of a ``put_item``: True to read its block, False (answered) to skip it."""
    if len(args) != 5:
        conn.out.append(BAD_COMMAND_LINE)
        return False
    try:
        errors = int(args[2])
        expire = int(args[3])
    except ValueError:
        conn.out.append(BAD_COMMAND_LINE)
        return False
    name = queue_name(args[1])
    if name is None or "+" in name:
        conn.out.append(BAD_QUEUE_NAME)
        return False
    conn.expect_put(name, expire, False)
    conn.put_errors = errors
    return True


def cmd_put_item(conn: ChannelConnection, args: list[bytes], data: bytes) -> None:
    """Store the block of a ``put_item`` with its error count and expiry."""
    expire = conn.put_expire
    name = conn.take_put()
    try:
        batch = conn.server.queues.put(name, data, expire, now_ms(), conn.put_errors)
    except QueueFull:
        conn.out.append(NOT_STORED)
        return
    except (JournalWriteError, TooManyQueues, NotOwned, OSError) as e:
        conn.out.append(server_error(str(e)))
        return
    if batch is None or batch.done:
        error = None if batch is None else batch.error
        conn.out.append(STORED if error is None else server_error(error))
        return
    conn.hold(pending_put(batch))  # STORED once the journal has it
    batch.add_done_callback(conn.replies_ready)


def channel_commands(router: Any) -> dict[bytes, Command]:
    """The channel's table: the ordinary commands, their gets holding their reply until
    the punts they caused are stored (Router.run_waiting_for_moves), their deletes giving
    the box's ``max_queues`` budget back at once (Router.run_delete), their sets to an
    alias refused as NOT_STORED by another worker's full queue (Router.run_set), and
    ``put_item``."""
    table = dict(COMMANDS)
    for word in (b"get", b"gets"):
        original = COMMANDS[word]
        command = Command(word, None, shape=original.shape, waits_for_sets=original.waits_for_sets)
        command.run = lambda conn, args, c=original: router.run_waiting_for_moves(c, conn, args)
        table[word] = command
    original_delete = COMMANDS[b"delete"]
    delete = Command(
        b"delete",
        None,
        shape=original_delete.shape,
        noreply_after=original_delete.noreply_after,
        waits_for_sets=original_delete.waits_for_sets,
    )
    delete.run = lambda conn, args: router.run_delete(original_delete, conn, args)
    table[b"delete"] = delete
    original_set = COMMANDS[b"set"]
    table[b"set"] = Command(
        b"set",
        lambda conn, args, data: router.run_set(original_set, conn, args, data),
        shape=original_set.shape,
        noreply_after=original_set.noreply_after,
        accept=original_set.accept,
        waits_for_sets=False,
    )
    table[b"put_item"] = Command(
        b"put_item",
        cmd_put_item,
        shape=STORAGE,
        accept=accept_put_item,
        waits_for_sets=False,
    )
    return table


class ChannelConnection(MemcacheConnection):
    """A connection from another worker: never idle-closed (its client may be idle, and
    closing it would give that client's open reads back)."""

    __slots__ = ("count", "put_errors")

    def __init__(self, server: Any, count: ChannelCount, table: dict[bytes, Command]) -> None:
        super().__init__(server, table, UNKNOWN)
        self.count = count
        self.put_errors = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Counted before the limit is judged: the server's clients are its connections
        # less its channels, so this one is never refused, and no client is for it.
        self.count.open += 1
        self.count.total += 1
        super().connection_made(transport)
        self.stats.total_connections -= 1  # not a client accepted

    def connection_lost(self, exc: Exception | None) -> None:
        self.count.open -= 1  # first: the server judges its client count as this one leaves
        super().connection_lost(exc)

    def idle_for(self, now: float) -> float:
        return 0.0

    def too_many(self) -> bool:
        return False  # the workers' own, outside max_connections: its client was admitted


async def serve_channel(
    server: Any, path: str, count: ChannelCount, table: dict[bytes, Command]
) -> asyncio.AbstractServer:
    """Listen on ``path`` (a stale socket of a dead predecessor is removed first)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    loop = asyncio.get_running_loop()
    return await loop.create_unix_server(
        lambda: ChannelConnection(server, count, table), path, backlog=4096
    )
