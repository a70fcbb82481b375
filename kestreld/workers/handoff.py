"""A client connection handed, socket and all, to the worker that owns its queue.

With ``worker_handoff = true``, a client connection whose request names a queue another
worker owns, while it holds nothing where it is (no open read, no wait, no reply pending,
no set unacknowledged, no read possibly open at an owner, not TLS, not handed before), is
moved to that owner instead of having the request forwarded: its socket is passed over a
Unix socket in the supervisor's private folder (``handoff-<i>.sock``, ``SCM_RIGHTS``)
with the bytes the client sent that were not run yet (the request itself first) and who
it authenticated as.  The owner adopts the socket as an ordinary client connection of its
own, feeding it those bytes first, as if they had just arrived: from then on the client's
requests for that queue are served where they land, at the cost of a local one.

Why it is safe: the connection held nothing here, so nothing is lost whatever happens to
the hand-off.  Its replies already written went to the kernel before the socket moved
(the hand-off waits until the transport's buffer is empty), so order is kept; and the
closing of this worker's transport sends nothing to the client (FIN or RST go out only
when the last descriptor of the socket is closed, and the one in flight still holds it).
A hand-off that cannot start (the owner is restarting) puts the bytes back: the request
is forwarded as without hand-off.  An owner that dies with the socket in flight closes it
with its own descriptors: the client sees its connection close, having held nothing.

Ping-pong is avoided by handing a connection at most once: a client that alternates
queues on two workers is handed on its first foreign request and forwarded from then on
for the other worker's queues, never bounced (see docs/operations.md for the figures).

A message on the hand-off socket (one connection per hand-off, closed after it): a 4-byte
big-endian header length, the header (JSON: ``user``, ``hash``, ``handoffs``,
``unread``: the length of what follows), then the unread bytes; the client's socket
travels with the first byte.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import struct
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("kestreld.workers")

#: How often a hand-off waiting for the client's replies to leave looks again (seconds),
#: and how many times: a client that does not read its replies is not moved, but served here.
DRAIN_POLL = 0.0005
DRAIN_POLLS = 2000
#: Hand-offs a connection may have: once (a client alternating queues is not bounced).
MAX_HANDOFFS = 1
_LENGTH = struct.Struct(">I")
#: A message header larger than this is not a hand-off's (the sender is broken).
MAX_HEADER = 64 * 1024


def handoff_path(folder: str, index: int) -> str:
    return os.path.join(folder, f"handoff-{index}.sock")


@dataclass(slots=True)
class Arrival:
    """What a handed connection brings: the bytes not yet run, who it is, how often it moved."""

    unread: bytes
    user: str | None = None
    password_hash: str | None = None
    handoffs: int = 1
    #: The user's roles and queue patterns as the sender judged them: a connection in
    #: progress keeps its user across a reload that changed or removed it, as it does in
    #: one process.
    roles: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ()


def holds_nothing(conn: Any, reading_elsewhere: bool) -> bool:
    """``conn`` may move: nothing of it stays behind here, or at an owner it used."""
    session = conn.session
    return (
        conn.pending == 0
        and not conn.held
        and not conn.closing
        and not conn.eof
        and not conn.write_paused
        and conn.held_put is None
        and session.waiting is None
        and not any(session.open_reads.values())
        and not session.puts_pending()
        and not reading_elsewhere
    )


def encode(arrival: Arrival) -> bytes:
    header = json.dumps(
        {
            "user": arrival.user,
            "hash": arrival.password_hash,
            "handoffs": arrival.handoffs,
            "roles": list(arrival.roles),
            "patterns": list(arrival.patterns),
            "unread": len(arrival.unread),
        }
    ).encode()
    return b"".join((_LENGTH.pack(len(header)), header, arrival.unread))


def decode(message: bytes) -> Arrival | None:
    """The arrival in a whole ``message``; None while it is not whole yet.  Raises
    ValueError for bytes that are not a hand-off's."""
    if len(message) < _LENGTH.size:
        return None
    (size,) = _LENGTH.unpack_from(message)
    if size > MAX_HEADER:
        raise ValueError("hand-off header too large")
    start = _LENGTH.size + size
    if len(message) < start:
        return None
    header = json.loads(message[_LENGTH.size : start])
    end = start + int(header["unread"])
    if len(message) < end:
        return None
    if len(message) > end:
        raise ValueError("bytes after the hand-off")
    return Arrival(
        message[start:end],
        header.get("user"),
        header.get("hash"),
        int(header["handoffs"]),
        tuple(header.get("roles", ())),
        tuple(header.get("patterns", ())),
    )


def principal_of(arrival: Arrival) -> Any:
    """The user a handed connection authenticated as, as its sender judged it (not looked
    up again: a reload since then changes new connections only); None for roles that are
    not a user's."""
    from kestreld.security.policy import Role, User

    try:
        roles = frozenset(Role(r) for r in arrival.roles)
    except ValueError:
        return None
    return User(arrival.user or "", arrival.password_hash or "", roles, arrival.patterns)


class Handoff:
    """One worker's hand-offs: those it sends, and the listener of those it receives."""

    def __init__(self, server: Any, folder: str, index: int) -> None:
        self.server = server
        self.folder = folder
        self.index = index
        self.listener: socket.socket | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sent = 0
        self.received = 0
        self.failed = 0

    # --- receiving ------------------------------------------------------------------------

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        path = handoff_path(self.folder, self.index)
        try:
            os.unlink(path)  # a dead predecessor's
        except FileNotFoundError:
            pass
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        sock.listen(4096)
        sock.setblocking(False)
        self.listener = sock
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        assert self.listener is not None and self.loop is not None
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                log.warning("handoff_accept_failed", error=str(e))
                return
            sock.setblocking(False)
            Incoming(self, sock).start(self.loop)

    def adopt(self, fd: int, arrival: Arrival) -> None:
        """Serve the client socket ``fd`` here, its unread bytes first."""
        from kestreld.workers.routing import RoutedConnection

        server = self.server
        self.received += 1
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            return
        sock.setblocking(False)
        table = server.commands
        user = None
        if arrival.user is not None and server.authenticator is not None:
            from kestreld.frontends.memcache.auth import table_for

            user = principal_of(arrival)
            if user is None:
                log.warning("handoff_bad_principal", user=arrival.user)
                sock.close()
                return
            table = table_for(user, server.commands)
        conn = RoutedConnection(server, table, _unknown())
        conn.session.principal = user
        conn.arrival = arrival
        assert self.loop is not None
        self.loop.create_task(self._connect(sock, conn))

    async def _connect(self, sock: socket.socket, conn: Any) -> None:
        assert self.loop is not None
        try:
            await self.loop.connect_accepted_socket(lambda: conn, sock)
        except OSError as e:
            log.info("handoff_adopt_failed", error=str(e))
            sock.close()

    # --- sending --------------------------------------------------------------------------

    def begin(self, conn: Any, owner: int, request: bytes) -> None:
        """Hand ``conn`` to ``owner``; ``request`` (its line, and block, as the client
        wrote it) was taken from its input and runs first there.  From now on this worker
        runs none of its requests (the framing keeps them) and reads nothing more."""
        conn.write_paused = True  # the gate: no request is judged here any more
        if not conn.read_paused and conn.transport is not None:
            conn.read_paused = True
            conn.transport.pause_reading()
        conn.handoffs = MAX_HANDOFFS  # whatever happens, it moves no more
        assert self.loop is not None
        self.loop.call_soon(self._send, conn, owner, request, 0)

    def _send(self, conn: Any, owner: int, request: bytes, polls: int) -> None:
        if conn.closed:
            return  # it went: nothing to hand
        transport = conn.transport
        if conn.out or transport.get_write_buffer_size():
            # Its earlier replies leave first, through this socket, in order.
            if polls < DRAIN_POLLS:
                assert self.loop is not None
                self.loop.call_later(DRAIN_POLL, self._send, conn, owner, request, polls + 1)
            else:
                unread = request + conn.framing.take_input()
                self._fall_back(conn, unread, owner, OSError("its replies are not being read"))
            return
        unread = request + conn.framing.take_input()
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        channel.setblocking(False)
        try:
            channel.connect(handoff_path(self.folder, owner))
        except OSError as e:
            channel.close()
            self._fall_back(conn, unread, owner, e)
            return
        principal = conn.session.principal
        arrival = Arrival(
            unread,
            None if principal is None else principal.name,
            None if principal is None else principal.password_hash,
            conn.handoffs,
            () if principal is None else tuple(sorted(r.value for r in principal.roles)),
            () if principal is None else principal.patterns,
        )
        message = encode(arrival)
        fd = os.dup(transport.get_extra_info("socket").fileno())
        try:
            sent = socket.send_fds(channel, [message], [fd])
        except OSError as e:
            os.close(fd)
            channel.close()
            self._fall_back(conn, unread, owner, e)
            return
        os.close(fd)  # the one in flight keeps the socket open
        self.sent += 1
        # Closes this worker's descriptor only: nothing reaches the client.
        transport.abort()
        if sent == len(message):
            channel.close()
        else:
            assert self.loop is not None
            Outgoing(channel, message[sent:]).start(self.loop)

    def _fall_back(self, conn: Any, unread: bytes, owner: int, error: OSError) -> None:
        """The owner cannot take it now: its input is put back and run here (forwarded)."""
        self.failed += 1
        log.info("handoff_failed", worker=owner, error=error.strerror or str(error))
        conn.framing.keep(unread)
        # (Above the transport's high-water mark, its resume_writing comes later all the same.)
        conn.write_paused = False
        conn.resume()

    def stats(self) -> list[tuple[str, object]]:
        return [("handoffs", self.sent), ("handoffs_received", self.received)]

    def close(self) -> None:
        if self.listener is not None:
            if self.loop is not None:
                self.loop.remove_reader(self.listener.fileno())
            self.listener.close()
            self.listener = None


class Incoming:
    """One hand-off being received: the bytes, and the client socket with the first."""

    def __init__(self, handoff: Handoff, sock: socket.socket) -> None:
        self.handoff = handoff
        self.sock = sock
        self.message = b""
        self.fds: list[int] = []
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_reader(self.sock.fileno(), self._readable)
        self._readable()  # usually all there already: adopted without another loop turn

    def _readable(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 256 * 1024, 4, socket.MSG_CMSG_CLOEXEC)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, fds = b"", []
        self.fds.extend(fds)
        self.message += data
        try:
            arrival = decode(self.message)
        except (ValueError, KeyError) as e:
            log.warning("handoff_malformed", error=str(e))
            arrival = None
            data = b""
        if arrival is not None and len(self.fds) == 1:
            self._end()
            self.handoff.adopt(self.fds.pop(), arrival)
            return
        if not data:  # the sender went before the hand-off was whole: the client closes
            self._end()
            for fd in self.fds:
                os.close(fd)

    def _end(self) -> None:
        assert self.loop is not None
        self.loop.remove_reader(self.sock.fileno())
        self.sock.close()


class Outgoing:
    """The rest of a long hand-off message (large unread bytes), written as it drains."""

    def __init__(self, sock: socket.socket, rest: bytes) -> None:
        self.sock = sock
        self.rest = rest
        self.loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        try:
            n = self.sock.send(self.rest)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            n = len(self.rest)  # the owner went: its end closes the client
        self.rest = self.rest[n:]
        if not self.rest:
            assert self.loop is not None
            self.loop.remove_writer(self.sock.fileno())
            self.sock.close()


def _unknown() -> Any:
    from kestreld.frontends.memcache.commands import UNKNOWN

    return UNKNOWN
