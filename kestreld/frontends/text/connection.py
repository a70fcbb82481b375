"""Kestrel's text protocol (port 2222) on the queue session.

Replies are one line each: ``+<count>``, ``-<error>``, ``:<item>`` or ``*``
(no item), ended by a bare ``\\n``.  Every fetch is transactional, as in
Kestrel: ``get`` (and ``peek``, ``monitor``) first confirms the reads this
session still holds on that queue, then opens the next; a disconnect gives
open reads back.  The parser is :mod:`kestreld.frontends.text.parser`; the
queue work is the session's.  docs/protocol.md has the commands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kestreld import __version__
from kestreld.frontends.core.request_loop import RequestConnection
from kestreld.frontends.text.parser import TextError, TextParser, TextRequest
from kestreld.journal.clock import now_ms
from kestreld.names import split_queue_name
from kestreld.security.authenticator import parse_token
from kestreld.security.policy import Role
from kestreld.session.errors import NotStored, PutFailed, QueueRefused, SessionError
from kestreld.session.fetch import BUSY, ITEM, LIMITED, REFUSED, Fetch
from kestreld.state import ServerStatus

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from kestreld.session.reply import PendingReply
    from kestreld.state import ServerState

    #: A command's handler: (connection, arguments, a put's items).
    Handler = Callable[["TextConnection", list[bytes], list[bytes] | None], Awaitable[None]]

NO_ITEM = b"*\n"
ZERO = b"+0\n"
UNAUTHENTICATED = b"-Unauthenticated.\n"
PERMISSION_DENIED = b"-Permission denied.\n"
AUTH_FAILED = b"-Authentication failed.\n"
#: The longest relative time (ms) a request may give: about 24 days.
_MAX_MS = (1 << 31) - 1


def error(message: str) -> bytes:
    return b"-" + message.encode("ascii", "replace") + b"\n"


def count(n: int) -> bytes:
    return b"+%d\n" % n


def item_line(data: bytes) -> bytes:
    return b":" + data + b"\n"


class TextConnection(RequestConnection):
    """One text-protocol client."""

    kind = "text"

    def __init__(self, server: ServerState) -> None:
        super().__init__(server)
        config = server.config
        self.parser = TextParser(config.max_line_length, config.default_queue.max_item_size)

    def parse(self, data: bytes) -> list[TextRequest | TextError]:
        return self.parser.feed(data)

    def mid_request(self) -> bool:
        return self.parser.pending > 0 or self.parser.put is not None

    def refusal(self) -> bytes:
        return error("Too many connections.")

    def internal_error(self, request: object) -> None:
        self.write(error("Internal error."))

    async def handle(self, request: TextRequest | TextError) -> None:
        if request.__class__ is TextError:
            self.write(error(request.message))  # type: ignore[union-attr]
            if request.fatal:  # type: ignore[union-attr]
                self.close()
            return
        command = request.command  # type: ignore[union-attr]
        args = request.args  # type: ignore[union-attr]
        if command not in _UNLOCKED and self.unauthenticated():
            # A put's item lines were read with it: the stream stays in step.
            self.write(UNAUTHENTICATED)
            return
        handler = _COMMANDS.get(command)
        trace = self.session.trace
        if trace is not None:
            trace.command(command[:40])
        if handler is None:
            word = command[:40].decode("ascii", "replace")
            self.write(error(f"Unknown command: {word}"))
            return
        role = _ROLES.get(command)
        if role is not None and not self.permitted(command, role, args):
            self.write(PERMISSION_DENIED)
            return
        await self.run(request, handler)  # type: ignore[arg-type]

    async def run(self, request: TextRequest, handler: Handler) -> None:
        """Run a request this client may send (its auth and role judged) and answer it.
        (A worker of ``workers = N`` sends one naming another worker's queue there.)"""
        await handler(self, request.args, request.items)

    def permitted(self, command: bytes, role: Role, args: list[bytes]) -> bool:
        """May this client run ``command`` (which needs ``role``) with ``args``?"""
        if command in _SERVER_WIDE:
            if not args and command == b"status":
                return True  # reading the status needs no role
            return self.session.permit(role, None)
        queue = args[0].decode("ascii", "replace") if args else None
        return self.session.permit(role, queue)

    def monitor_item(self, f: Fetch) -> None:
        self.write(item_line(f.item.data))  # type: ignore[union-attr]

    # --- helpers ------------------------------------------------------------------------

    def queue_arg(self, args: list[bytes]) -> str | None:
        """The queue name of a request, or None (the error is written)."""
        if not args:
            self.write(error("Queue name required."))
            return None
        try:
            name = args[0].decode("ascii")
        except UnicodeDecodeError:
            name = ""
        if split_queue_name(name) is None:
            self.write(error("Illegal queue name."))
            return None
        return name

    async def close_previous(self, name: str) -> bool:
        """Confirm the reads this session holds on ``name`` (a fetch's implicit confirm);
        False (the error written) if that could not be made durable."""
        session = self.session
        held = session.open_count(name)
        if not held:
            return True
        reply = session.confirm(name, held)
        if reply is None:
            return True
        failure = await self.settle(reply)
        if failure is not None:
            self.write(error(f"Confirm failed: {failure}"))
            return False
        return True


def _millis(raw: bytes) -> int | None:
    """A relative time in ms (a non-negative integer that fits an i32), or None."""
    if not raw.isdigit():
        return None
    value = int(raw)
    return value if value <= _MAX_MS else None


# --- commands -------------------------------------------------------------------------------


async def cmd_put(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``put <queue> [expiry_ms]:`` and item lines: ``+<stored>``."""
    name = conn.queue_arg(args)
    if name is None:
        return
    if "+" in name:
        conn.write(error("Cannot put to a fanout reader; write to the queue."))
        return
    expire = 0
    if len(args) > 1:
        ms = _millis(args[1])
        if ms is None:
            conn.write(error("Error parsing expiration time."))
            return
        if ms:
            expire = now_ms() + ms
    session = conn.session
    try:
        session.check_writable()
    except SessionError as e:
        conn.write(error(str(e)))
        return
    stats = conn.stats
    stored = 0
    refused = ""
    pending: list[PendingReply] = []
    for data in items or ():
        stats.cmd_set += 1
        try:
            session.admit_put(name, len(data))
            reply = session.put(name, data, expire, True)
        except NotStored:
            continue  # Kestrel's text put counts what was stored and goes on
        except QueueRefused as e:
            refused = str(e)
            break
        except PutFailed:
            break
        if reply is None:
            stored += 1
        else:
            pending.append(reply)
    for reply in pending:
        if await conn.settle(reply) is None:
            stored += 1
    if refused and not stored:
        conn.write(error(_too_many_queues(conn, name)))
        return
    conn.write(count(stored))


def _too_many_queues(conn: TextConnection, name: str) -> str:
    return f"Too many queues (max_queues = {conn.server.config.max_queues}); {name} not created."


async def _fetch(conn: TextConnection, args: list[bytes], peek: bool) -> None:
    name = conn.queue_arg(args)
    if name is None:
        return
    timeout = 0
    if len(args) > 1:
        ms = _millis(args[1])
        if ms is None:
            conn.write(error("Error parsing timeout."))
            return
        timeout = ms
    if not await conn.close_previous(name):
        return
    f = Fetch()
    f.name = name
    f.timeout = timeout
    f.key = args[0]
    f.open = not peek
    f.peek = peek
    outcome = await conn.fetch(f)
    if outcome == ITEM:
        conn.write(item_line(f.item.data))  # type: ignore[union-attr]
    elif outcome == REFUSED:
        conn.write(error(conn.session.read_refusal() or "reads refused"))
    elif outcome == BUSY:
        limit = conn.session.max_open_reads()
        conn.write(error(f"Too many open transactions; limit={limit}"))
    elif outcome == LIMITED:
        conn.write(error(_too_many_queues(conn, name)))
    else:
        conn.write(NO_ITEM)


async def cmd_get(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``get <queue> [timeout_ms]``: ``:<item>`` (opened) or ``*``."""
    await _fetch(conn, args, False)


async def cmd_peek(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``peek <queue> [timeout_ms]``: ``:<item>`` (left at the head) or ``*``."""
    await _fetch(conn, args, True)


async def cmd_monitor(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``monitor <queue> <timeout_ms>``: ``:<item>`` lines as items arrive, then ``*``."""
    if len(args) < 2:
        conn.write(error("Queue name & timeout required."))
        return
    name = conn.queue_arg(args)
    if name is None:
        return
    timeout = _millis(args[1])
    if timeout is None:
        conn.write(error("Error parsing timeout."))
        return
    if not await conn.close_previous(name):
        return
    f = Fetch()
    f.name = name
    f.key = args[0]
    session = conn.session
    try:
        started = session.monitor(f, timeout / 1000, session.max_open_reads())
    except QueueRefused:
        conn.write(error(_too_many_queues(conn, name)))
        return
    except SessionError as e:
        conn.write(error(str(e)))
        return
    if not started:  # no reader (an alias, an unknown queue not created): nothing to wait for
        conn.write(NO_ITEM)
        return
    while session.wait_fetch is f:
        await conn.signalled()
    conn.write(NO_ITEM)


async def cmd_confirm(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``confirm <queue> <count>``: the oldest ``count`` open reads: ``+<count>``."""
    if len(args) < 2:
        conn.write(error("Queue name & count required."))
        return
    name = conn.queue_arg(args)
    if name is None:
        return
    if not args[1].isdigit():
        conn.write(error("Error parsing count."))
        return
    wanted = int(args[1])
    session = conn.session
    if wanted > session.open_count(name):
        conn.write(error("Not that many transactions open."))
        return
    if wanted:
        reply = session.confirm(name, wanted)
        if reply is not None:
            failure = await conn.settle(reply)
            if failure is not None:
                conn.write(error(f"Confirm failed: {failure}"))
                return
    conn.write(count(wanted))


async def cmd_flush(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``flush <queue>``: ``+0`` once the flush (a ``READ_HEAD`` jump) is on disk."""
    await _drop(conn, args, flush=True)


async def cmd_delete(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``delete <queue>``: ``+0``."""
    await _drop(conn, args, flush=False)


async def _drop(conn: TextConnection, args: list[bytes], flush: bool) -> None:
    name = conn.queue_arg(args)
    if name is None:
        return
    try:
        reply = conn.session.flush(name) if flush else conn.session.delete(name)
    except SessionError as e:
        conn.write(error(str(e)))
        return
    if reply is not None:  # acknowledged once the journal has it, as memcache's flush
        failure = await conn.settle(reply)
        if failure is not None:
            conn.write(error(f"Flush failed: {failure}"))
            return
    conn.write(ZERO)


async def cmd_status(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``status``: ``:<UP|WRITEAVOID|READONLY|QUIESCENT>`` (and a pending one during a grace
    period); ``status <word>`` sets it: ``+0``."""
    server = conn.server
    if not args:
        conn.write(item_line(server.describe_status().encode()))
        return
    try:
        status = ServerStatus(args[0].decode("ascii", "replace").upper())
    except ValueError:
        conn.write(error("Unknown status."))
        return
    server.set_status(status)
    conn.write(ZERO)


async def cmd_auth(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``auth <user> <password>``: ``+1`` (authenticated) or ``-Authentication failed.``.

    The check runs off the event loop as the session's wait; a refusal is
    delayed when this address keeps failing.  Without an auth file: ``+0``.
    """
    if conn.server.authenticator is None:
        conn.write(ZERO)
        return
    token = parse_token(b" ".join(args)) if len(args) == 2 else None
    if token is None:
        user = await conn.authenticate(None, b"", "bad auth request format")
    else:
        user = await conn.authenticate(token[0], token[1])
    conn.write(b"+1\n" if user is not None else AUTH_FAILED)


async def cmd_version(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``version``: ``:<version>``."""
    conn.write(item_line(__version__.encode()))


async def cmd_quit(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``quit``: close the connection (no reply)."""
    conn.close()


async def cmd_shutdown(conn: TextConnection, args: list[bytes], items: list[bytes] | None) -> None:
    """``shutdown``: ``+0``, then the server stops gracefully."""
    conn.write(ZERO)
    conn.close()
    conn.server.request_shutdown("shutdown command (text protocol)")


_COMMANDS = {
    b"auth": cmd_auth,
    b"put": cmd_put,
    b"get": cmd_get,
    b"peek": cmd_peek,
    b"monitor": cmd_monitor,
    b"confirm": cmd_confirm,
    b"flush": cmd_flush,
    b"delete": cmd_delete,
    b"status": cmd_status,
    b"version": cmd_version,
    b"quit": cmd_quit,
    b"shutdown": cmd_shutdown,
}

#: What an unauthenticated client may send (a server with an auth_file).
_UNLOCKED = frozenset((b"auth", b"quit"))
#: The role each command needs (a server with an auth_file); unlisted: none.
_ROLES = {
    b"put": Role.WRITE,
    b"get": Role.READ,
    b"peek": Role.READ,
    b"monitor": Role.READ,
    b"confirm": Role.READ,
    b"flush": Role.ADMIN,
    b"delete": Role.ADMIN,
    b"status": Role.ADMIN,  # setting it; reading it needs none
    b"shutdown": Role.ADMIN,
}
#: Commands that act on the whole server: the role without a queue-pattern limit.
_SERVER_WIDE = frozenset((b"status", b"shutdown"))

__all__ = ["TextConnection"]
