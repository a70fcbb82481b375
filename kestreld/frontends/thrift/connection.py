"""Kestrel's thrift interface (port 2229: framed transport, binary protocol) on the session.

Each frame is a 4-byte big-endian length and one binary-protocol message.  A
frame over :func:`~kestreld.frontends.thrift.codec.max_frame_size` or with an
unreadable message header closes the connection (there is nothing to answer:
no method, no sequence id); a malformed argument struct, wrong argument types
or an unknown method (Finagle's ``__can__finagle__trace__v3__`` probe) are
answered with an application exception and the connection goes on.  A call
is decoded whole before anything runs, so a bad frame never applies half a
``put``.

``get`` with ``auto_abort_msec > 0`` opens its items in this session, then
hands them to the server-wide :class:`~kestreld.session.open_ids.OpenIds`:
they survive the client, any connection confirms or aborts them by id, and
the auto-abort timer gives back what is not confirmed in time.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import structlog

from kestreld import __version__
from kestreld.frontends.core.request_loop import RequestConnection
from kestreld.frontends.thrift import codec
from kestreld.journal.clock import now_ms
from kestreld.names import split_queue_name
from kestreld.security.policy import Role
from kestreld.security.tls import peer_certificate_name
from kestreld.session.errors import NotStored, PutFailed, QueueRefused, SessionError
from kestreld.session.fetch import ITEM, LIMITED, REFUSED, Fetch
from kestreld.state import ServerStatus

if TYPE_CHECKING:
    from kestreld.session.reply import PendingReply
    from kestreld.state import ServerState

log = structlog.get_logger("kestreld.frontends")

_LENGTH = struct.Struct(">i")
#: Kestrel's status enum <-> kestreld's statuses (kestreld never is NOT_CONFIGURED).
_TO_THRIFT = {
    ServerStatus.UP: codec.kestrel.Status.UP,
    ServerStatus.READONLY: codec.kestrel.Status.READ_ONLY,
    ServerStatus.QUIESCENT: codec.kestrel.Status.QUIESCENT,
}
_FROM_THRIFT = {v: k for k, v in _TO_THRIFT.items()}
# Kestrel's thrift Status has no WRITEAVOID: it serves reads and writes, as UP does.
_TO_THRIFT[ServerStatus.WRITEAVOID] = codec.kestrel.Status.UP
_Item = codec.kestrel.Item
_QueueInfo = codec.kestrel.QueueInfo


class CallError(Exception):
    """A call answered with an application exception of ``kind``."""

    def __init__(self, kind: int, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Call:
    """One framed message: checked, not decoded yet."""

    __slots__ = ("frame", "method", "mtype", "seqid")

    def __init__(self, frame: bytes) -> None:
        self.frame = frame
        self.method = ""
        self.mtype = 0
        self.seqid = 0

    def read_header(self, method: str, mtype: int, seqid: int) -> None:
        """The message header, once the frame's walk has read it."""
        self.method = method
        self.mtype = mtype
        self.seqid = seqid


class ThriftConnection(RequestConnection):
    """One thrift client."""

    kind = "thrift"

    def __init__(self, server: ServerState) -> None:
        super().__init__(server)
        self.buf = bytearray()
        self.lost_step = False  # a frame over the bound: the stream cannot be followed
        self.max_frame = codec.max_frame_size(server.config.default_queue.max_item_size)
        #: Why this client is refused every call (a server with an auth_file), or "".
        self.refused = ""

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if not self.closed and self.server.authenticator is not None:
            self.identify(transport)

    def identify(self, transport: Any) -> None:
        """Kestrel's IDL has no call to authenticate with: a client proves who it is by
        its verified TLS client certificate, whose common name is a user of the auth file."""
        if not self.server.config.tls_verify_client:
            self.refused = (
                "authentication required: the thrift port authenticates by TLS client "
                "certificate (tls_verify_client), which is off"
            )
            return
        name = peer_certificate_name(transport)
        user = self.server.authenticator.auth.user(name) if name else None  # type: ignore[union-attr]
        if user is None:
            self.refused = f"authentication required: no user of the auth file named {name!r}"
            log.warning("thrift_client_refused", peer=self.peer, certificate_name=name)
            self.session.stats.auth_failures += 1
            return
        self.session.admit(user)

    # --- framing --------------------------------------------------------------------------

    def parse(self, data: bytes) -> list[Any]:
        if self.lost_step:
            return []
        buf = self.buf
        buf += data
        calls: list[Any] = []
        pos = 0
        end = len(buf)
        while end - pos >= 4:
            (size,) = _LENGTH.unpack_from(buf, pos)
            if size < 0 or size > self.max_frame:
                calls.append(f"frame of {size} bytes (at most {self.max_frame})")
                buf.clear()
                self.lost_step = True  # the close follows once the calls before it are answered
                return calls
            if end - pos - 4 < size:
                break
            calls.append(Call(bytes(buf[pos + 4 : pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return calls

    def mid_request(self) -> bool:
        return bool(self.buf)

    def internal_error(self, request: Any) -> None:
        if isinstance(request, Call) and request.method and request.mtype != codec.ONEWAY:
            self.write(
                codec.encode_exception(
                    request.method, request.seqid, codec.INTERNAL_ERROR, "internal error"
                )
            )

    # --- calls ----------------------------------------------------------------------------

    async def handle(self, call: Any) -> None:
        if call.__class__ is str:  # a frame that cannot be followed: nothing to answer
            log.warning("thrift_frame_refused", peer=self.peer, problem=call)
            self.close()
            return
        try:
            call.read_header(*codec.check_message(call.frame)[:3])
        except codec.BadArguments as e:
            call.read_header(e.method, e.mtype, e.seqid)
            self._answer_error(call, codec.PROTOCOL_ERROR, f"malformed arguments: {e}")
            return
        except codec.BadFrame as e:
            log.warning("thrift_frame_refused", peer=self.peer, problem=str(e))
            self.close()
            return
        if call.mtype not in (codec.CALL, codec.ONEWAY):
            self._answer_error(call, codec.INVALID_MESSAGE_TYPE, "expected a call")
            return
        if self.unauthenticated():
            self._answer_error(call, codec.UNKNOWN, self.refused or "authentication required")
            return
        handler = _METHODS.get(call.method)
        trace = self.session.trace
        if trace is not None:
            trace.command(str(call.method)[:60].encode("ascii", "replace"))
        if handler is None:
            self._answer_error(call, codec.UNKNOWN_METHOD, f"unknown method {call.method[:60]}")
            return
        try:
            args = codec.decode_args(call.frame, call.method)
        except Exception as e:  # the walk passed; the codec may still refuse (bad UTF-8)
            self._answer_error(call, codec.PROTOCOL_ERROR, f"cannot decode arguments: {e}")
            return
        await self.run_call(call, handler, args)

    async def run_call(self, call: Call, handler: Any, args: Any) -> None:
        """Run a decoded call of a known method here and answer it.  (A worker of
        ``workers = N`` sends one naming another worker's queue there.)"""
        try:
            value = await handler(self, args)
        except CallError as e:
            self._answer_error(call, e.kind, str(e))
            return
        except SessionError as e:
            self._answer_error(call, codec.INTERNAL_ERROR, str(e))
            return
        if call.mtype == codec.CALL:
            self.write(codec.encode_reply(call.method, call.seqid, value))

    def _answer_error(self, call: Call, kind: int, message: str) -> None:
        if call.mtype != codec.ONEWAY:
            self.write(codec.encode_exception(call.method, call.seqid, kind, message))

    # --- argument checks ------------------------------------------------------------------

    def permit(self, role: Role, queue: str | None = None) -> None:
        """Raise a CallError unless this client may act with ``role`` on ``queue``."""
        if not self.session.permit(role, queue):
            raise CallError(codec.UNKNOWN, f"permission denied: needs the {role.value} role")

    def queue_name(self, raw: Any, writing: bool = False) -> str:
        if isinstance(raw, bytes):
            raw = raw.decode("ascii", "replace")
        if not isinstance(raw, str) or not raw:
            raise CallError(codec.PROTOCOL_ERROR, "queue_name (a string) is required")
        if split_queue_name(raw) is None:
            raise CallError(codec.PROTOCOL_ERROR, f"illegal queue name {raw[:60]!r}")
        if writing and "+" in raw:
            raise CallError(codec.PROTOCOL_ERROR, "cannot put to a fanout reader")
        return raw


def _too_many_queues(conn: ThriftConnection, name: str) -> str:
    return f"too many queues (max_queues = {conn.server.config.max_queues}); {name} not created"


def _int(value: Any, name: str) -> int:
    if value is None:
        return 0
    if not isinstance(value, int) or isinstance(value, bool):
        raise CallError(codec.PROTOCOL_ERROR, f"{name} must be an integer")
    return value


def _ids(value: Any) -> set[int]:
    if value is None:
        return set()
    if not isinstance(value, set | frozenset | list) or not all(isinstance(i, int) for i in value):
        raise CallError(codec.PROTOCOL_ERROR, "ids must be a set of i64")
    return set(value)


def _open_ids(conn: ThriftConnection) -> Any:
    return conn.server.open_ids  # type: ignore[attr-defined]


# --- methods ------------------------------------------------------------------------------


async def put(conn: ThriftConnection, args: Any) -> int:
    """Items stored, in order, stopping at the first refused; after their journal batch."""
    name = conn.queue_name(args.queue_name, writing=True)
    conn.permit(Role.WRITE, name)
    items = args.items
    if items is None:
        items = []
    if not isinstance(items, list) or not all(isinstance(i, bytes) for i in items):
        raise CallError(codec.PROTOCOL_ERROR, "items must be a list of binary")
    expiration = _int(args.expiration_msec, "expiration_msec")
    session = conn.session
    session.check_writable()
    expire = now_ms() + expiration if expiration > 0 else 0
    conn.stats.cmd_set += len(items)
    accepted: list[PendingReply | None] = []
    for data in items:
        try:
            session.admit_put(name, len(data))
            accepted.append(session.put(name, data, expire, True))
        except QueueRefused:
            if not accepted:
                raise CallError(codec.INTERNAL_ERROR, _too_many_queues(conn, name)) from None
            break
        except (NotStored, PutFailed):
            break
    stored = 0
    failed = False
    for reply in accepted:
        if reply is not None and await conn.settle(reply) is not None:
            failed = True
        if not failed:
            stored += 1
    return stored


async def get(conn: ThriftConnection, args: Any) -> list:
    """Up to max_items items; with a timeout, waits until max_items or the time is up."""
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.READ, name)
    max_items = _int(args.max_items, "max_items")
    timeout = _int(args.timeout_msec, "timeout_msec")
    auto_abort = _int(args.auto_abort_msec, "auto_abort_msec")
    session = conn.session
    loop = conn.server.loop
    deadline = loop.time() + timeout / 1000 if timeout > 0 else 0.0
    opening = auto_abort > 0
    # A get that may wait holds what it takes as open reads until it answers, then
    # confirms them: a client that leaves meanwhile gets nothing taken for it (the
    # session's close gives them back at once).  So it returns at most max_open_reads.
    room = session.max_open_reads() - session.open_count(name)
    holding = bool(deadline) and not opening and room > 0  # max_open_reads 0: consumed
    if opening:
        limit = session.max_open_reads() - _open_ids(conn).count(session, name)
    elif holding:
        limit = room
    else:
        limit = max_items
    held = 0
    items: list[bytes] = []
    confirms: list[PendingReply] = []
    while len(items) < min(max_items, limit):
        f = Fetch()
        f.name = name
        f.open = opening or holding
        if deadline:
            f.timeout = max(0, int((deadline - loop.time()) * 1000))
        outcome = await conn.fetch(f)
        if outcome == REFUSED:
            if items:
                break
            raise CallError(codec.INTERNAL_ERROR, conn.session.read_refusal() or "reads refused")
        if outcome == LIMITED:
            raise CallError(codec.INTERNAL_ERROR, _too_many_queues(conn, name))
        if outcome != ITEM:
            break
        items.append(f.item.data)  # type: ignore[union-attr]
        if holding:
            held += 1
        if f.reply is not None:
            confirms.append(f.reply)
    if opening:
        if conn.gone():
            # The client left during the wait: an id it never receives is never left
            # open; the session's close gives these reads back at once.
            return []
        # Handed over newest first: the session's reads of this queue are these items.
        # (open_transaction_timeout may have given some back meanwhile: not ours now).
        reads = [session.hand_over(name) for _ in range(session.open_count(name))]
        reads.reverse()
        open_ids = _open_ids(conn)
        return [
            _Item(data=read.item.data, id=open_ids.adopt(read, name, session, auto_abort))
            for read in reads
        ]
    if held:
        if conn.gone():
            return []  # the client left during the wait: the held reads go back
        still = session.open_count(name)
        if still < held:
            # open_transaction_timeout gave the oldest back during the wait: not ours now.
            items = items[held - still :]
            held = still
    if held:
        reply = session.confirm(name, held)
        if reply is not None and await conn.settle(reply) is not None:
            session.abort(name, held)  # not durable: none of them is handed out
            items = items[held:]
    kept = []
    for data in items:
        kept.append(_Item(data=data, id=0))
    for reply in confirms:
        if await conn.settle(reply) is not None:
            # Its item went back to the head: it is not handed out.
            kept = [i for i in kept if i.data is not reply.taken.data]  # type: ignore[union-attr]
    return kept


async def confirm(conn: ThriftConnection, args: Any) -> int:
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.READ, name)
    return await _open_ids(conn).confirm(name, _ids(args.ids))


async def abort(conn: ThriftConnection, args: Any) -> int:
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.READ, name)
    return _open_ids(conn).abort(name, _ids(args.ids))


async def peek(conn: ThriftConnection, args: Any) -> Any:
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.READ, name)
    f = Fetch()
    f.name = name
    f.peek = True
    outcome = await conn.fetch(f)
    if outcome == REFUSED:
        raise CallError(codec.INTERNAL_ERROR, conn.session.read_refusal() or "reads refused")
    if outcome == LIMITED:
        raise CallError(codec.INTERNAL_ERROR, _too_many_queues(conn, name))
    stats = conn.session.queue_stats(name)
    return _QueueInfo(
        head_item=f.item.data if outcome == ITEM else None,  # type: ignore[union-attr]
        items=stats.get("items", 0),
        bytes=stats.get("bytes", 0),
        journal_bytes=stats.get("logsize", 0),
        age=stats.get("age", 0),
        waiters=stats.get("waiters", 0),
        open_transactions=stats.get("open_transactions", 0),
    )


async def flush_queue(conn: ThriftConnection, args: Any) -> None:
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.ADMIN, name)
    await _durable(conn, conn.session.flush(name))


async def flush_all_queues(conn: ThriftConnection, args: Any) -> None:
    conn.permit(Role.ADMIN)
    await _durable(conn, conn.session.flush_all())


async def _durable(conn: ThriftConnection, reply: PendingReply | None) -> None:
    """Return once the journal has a flush (its ``READ_HEAD`` jump), as memcache's ``END``."""
    if reply is not None:
        failure = await conn.settle(reply)
        if failure is not None:
            raise CallError(codec.INTERNAL_ERROR, f"flush failed: {failure}")


async def delete_queue(conn: ThriftConnection, args: Any) -> None:
    name = conn.queue_name(args.queue_name)
    conn.permit(Role.ADMIN, name)
    conn.session.delete(name)


async def current_status(conn: ThriftConnection, args: Any) -> int:
    return _TO_THRIFT[conn.server.status]


async def set_status(conn: ThriftConnection, args: Any) -> None:
    conn.permit(Role.ADMIN)
    status = _FROM_THRIFT.get(args.status)
    if status is None:
        raise CallError(codec.PROTOCOL_ERROR, "status must be UP, READ_ONLY or QUIESCENT")
    conn.server.set_status(status)


async def get_version(conn: ThriftConnection, args: Any) -> str:
    return __version__


_METHODS = {
    "put": put,
    "get": get,
    "confirm": confirm,
    "abort": abort,
    "peek": peek,
    "flush_queue": flush_queue,
    "flush_all_queues": flush_all_queues,
    "delete_queue": delete_queue,
    "current_status": current_status,
    "set_status": set_status,
    "get_version": get_version,
}

__all__ = ["ThriftConnection"]
