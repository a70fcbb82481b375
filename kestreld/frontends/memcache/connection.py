"""One memcache client connection: framing in, replies out in request order, flow control.

Bytes go to the :class:`~kestreld.frontends.memcache.framing.Framing`, which hands each
complete request back here; the command table (passed in by the server, see
:mod:`kestreld.frontends.memcache.commands`) runs it against this connection's
:class:`~kestreld.session.session.Session` and appends its reply to ``out``.
Replies are written once per batch of requests.  A reply the journal must
have first (``STORED``, a confirm's) is a
:class:`~kestreld.session.reply.PendingReply` in ``out``: later replies queue
behind it, so replies always come back in request order.

No request is judged (the rest of the input stays buffered) while:

- the session waits (a get with ``/t=``, ``monitor``): later requests run, in
  order, after its reply;
- a request must see this connection's sets that are not acknowledged yet
  (a get after a set gets the item): ``held``;
- the client does not read its replies: the transport's buffer is full
  (``write_paused``) or more than :data:`OUTPUT_HOLD_LIMIT` bytes of replies
  are promised but not written yet (a client that pipelines plain gets and
  reads nothing stops being served);
- the connection is closing.

Reading from the socket pauses when too much input piles up meanwhile.

**Reading is shared between connections**: once :data:`SLICE_BYTES` were read since the
last pause (``unsliced``: a large item arriving), reading pauses until the loop's next turn
(``sliced``), so the other connections' requests are read between two slices of it.  A pause of its own
(``read_paused``, any reason above) outlasts the slice: the next turn resumes reading
only when nothing else paused it, and nothing else resumes it within the turn.

**Closing is one path** (:meth:`Connection.close`): ``quit``, ``shutdown``, a
fatal line, the idle timeout and a graceful stop all stop taking requests,
end a wait in progress (it is answered), send every reply already promised,
in order, and only then close; the session then gives its open reads back.
A close the client causes (reset, end of input) goes straight to
:meth:`Session.close <kestreld.session.session.Session.close>` in
``connection_lost``.
"""

from __future__ import annotations

import asyncio
import os
from typing import TYPE_CHECKING, Any

import structlog

from kestreld.frontends.core.held_put import HELD_BLOCK_BYTES, HeldPut, hold
from kestreld.frontends.core.limits import READ_SLICE_BYTES
from kestreld.frontends.memcache.codes import GO, KEEP, LATER, SKIP, STOP
from kestreld.frontends.memcache.direct_send import descriptor
from kestreld.frontends.memcache.framing import Command, Framing, Sink
from kestreld.frontends.memcache.replies import (
    BAD_DATA_CHUNK,
    CRLF,
    END,
    ERROR,
    STORED,
    VALUE_END,
    server_error,
    unsent,
    write_parts,
)
from kestreld.journal.clock import monotonic
from kestreld.loop.busy_poll import BusyPoll
from kestreld.session.fetch import BUSY, ITEM, LIMITED, MISS, REFUSED, Fetch
from kestreld.session.reply import PUT, PendingReply
from kestreld.session.session import Session

try:
    import cython
    from cython.cimports.kestreld.frontends.memcache.direct_send import send_now

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

if TYPE_CHECKING:
    from collections.abc import Callable

    from kestreld.state import ServerState


log = structlog.get_logger("kestreld.frontends")

#: Input held while a request waits, before reading from the socket pauses.
INPUT_PAUSE_LIMIT = 1024 * 1024

#: A set of at least this size may be held back (see block()).
PACED_BLOCK_BYTES = HELD_BLOCK_BYTES

#: Bytes read before this connection yields the rest of the loop's turn.
SLICE_BYTES = READ_SLICE_BYTES

#: Reply bytes produced before they are handed to the transport (back-pressure check).
OUTPUT_FLUSH_SIZE = 256 * 1024
#: Reply bytes promised but not written (held behind the journal) before requests pause.
OUTPUT_HOLD_LIMIT = 1024 * 1024

INTERNAL_ERROR = server_error("internal error")


class Connection(Sink):
    """The connection's state and logic; the event loop drives :class:`MemcacheConnection`.

    Compiled, this is a ``cdef`` class (connection.pxd: C fields, C calls to and from
    the framing), which cannot derive from ``asyncio.Protocol``: the thin subclass
    below mixes that in (asyncpg's pattern; uvloop only needs the methods).
    """

    __slots__ = (
        "server",
        "stats",
        "traffic",
        "session",
        "transport",
        "peer",
        "framing",
        "out",
        "out_size",
        "pending",
        "held",
        "closing",
        "closed",
        "eof",
        "write_paused",
        "read_paused",
        "sliced",
        "unsliced",
        "last_active",
        "put_name",
        "put_expire",
        "put_noreply",
        "value_key",
        "value_size",
        "value_header",
        "peers",
        "write_out",
        "fd",
        "spilled",
        "transport_closing",
        "poll",
        "held_put",
    )

    def __init__(self, server: ServerState, table: dict[bytes, Command], unknown: Command) -> None:
        self.server = server
        self.stats = server.stats
        self.traffic = server.stats.traffic  # bytes_read, bytes_written: C fields when compiled
        self.session = Session(server, self)
        self.transport: asyncio.Transport | None = None
        #: The transport's write, bound once (every reply goes through it).
        self.write_out: Callable[[bytes], None] | None = None
        #: The socket's descriptor when replies may be sent to it directly (compiled, a
        #: plain uvloop TCP or Unix transport); -1: every reply goes through the transport.
        self.fd = -1
        #: Bytes were handed to the transport, which may still hold some of them.
        self.spilled = False
        #: A large set held back while its queue writes another large one (see block()).
        self.held_put: HeldPut | None = None
        #: The transport's is_closing, bound once: a closing transport's descriptor may be
        #: closed already (and its number reused), so nothing is sent to it directly.
        self.transport_closing: Callable[[], bool] | None = None
        #: The server's open connections (the same set): one alone answers in its own read.
        self.peers: set[Any] = server.connections
        #: The server's busy poll: told when requests arrive and when they are answered.
        self.poll: BusyPoll = server.busy_poll
        self.peer = None
        self.framing = Framing(table, unknown, server.config.max_line_length)
        #: Replies in request order: bytes, or a PendingReply held until the journal has it.
        self.out: list[Any] = []
        self.out_size = 0  # item bytes in self.out (pending replies' parts included)
        self.pending = 0  # PendingReplies in self.out
        self.held = False  # a request waits for this connection's sets to be acknowledged
        self.closing = False  # no request is taken any more; close once replies are sent
        self.closed = False  # the transport is closed (or was never kept)
        self.eof = False  # the client half-closed: finish what it sent, then close
        self.write_paused = False
        self.read_paused = False  # paused for a reason of this connection's (see blocked())
        self.sliced = False  # paused after a large read, until the loop's next turn
        self.unsliced = 0  # bytes read since the last pause
        self.last_active = monotonic()
        #: The queue, expiry (ms) and noreply of a set whose data block is being read
        #: (three fields, not a tuple made and dropped per set).
        self.put_name: str | None = None
        self.put_expire = 0
        self.put_noreply = False
        # The last VALUE header sent (a consumer asks for one key, and items are often of
        # one size): reused while the key and the size are the same.
        self.value_key = b""
        self.value_size = -1
        self.value_header = b""

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.write_out = transport.write  # type: ignore[attr-defined]
        self.peer = transport.get_extra_info("peername")
        if COMPILED:
            self.fd = descriptor(transport)
            if self.fd >= 0:
                self.transport_closing = transport.is_closing
        server = self.server
        if self.too_many():
            log.warning("connection_refused", peer=self.peer, reason="too many connections")
            transport.write(server_error("too many connections"))  # type: ignore[attr-defined]
            self.closing = self.closed = True
            transport.close()
            return
        server.connection_opened(self)
        self.stats.total_connections += 1
        self.session.begin(self.peer)

    def too_many(self) -> bool:
        """This connection, just accepted, is one over ``max_connections`` (a worker's
        client connections count the box's: kestreld.workers.box_connections)."""
        server = self.server
        return server.clients() >= server.config.max_connections

    def connection_lost(self, exc: Exception | None) -> None:
        client_caused = not self.closing
        self.closing = self.closed = True
        self.framing.drop_input()
        self.server.connection_closed(self)
        if exc is not None:
            log.info("connection_error", peer=self.peer, error=str(exc))
        self.session.close(client_caused)

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.last_active = monotonic()
        self._continue()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.traffic.bytes_read += len(data)
        self.unsliced += len(data)
        if self.unsliced >= SLICE_BYTES:
            self._slice()  # before the returns below: a large item's bytes mostly take them
        self.last_active = now = monotonic()
        poll = self.poll
        poll.arrived(now)
        framing = self.framing
        if framing.holds_input():
            ready = framing.receive(data)
            if ready is None:
                return
        else:
            ready = data  # the usual case: whole requests in one packet, nothing held
        if self.blocked():
            framing.keep(ready)
            if len(ready) > INPUT_PAUSE_LIMIT:
                self._pause_reading()
            return
        # The requests of one read share their journal writes: the server's only client
        # (or the only one not waiting for an item) writes them (and answers) now, before
        # this callback returns; with other clients connected they go on the loop's next
        # turn, where those clients' requests join.
        tick = self.session.tick
        tick.hold()
        try:
            self.process(ready)
        finally:
            lone = len(self.peers) - tick.waiting <= 1
            tick.release(lone)
        # Answered: a lone client's next request is polled for a while (busy_poll_us).
        poll.served(lone)

    def _slice(self) -> None:
        """A slice was read: read nothing more of this client in this turn of the loop.

        The loop reads a socket again within its turn after a read that filled its
        buffer: without this, a whole 8 MiB item is read (and copied into its block)
        in one turn, while every other connection's requests wait."""
        self.unsliced = 0
        if self.sliced or self.read_paused or self.closed or self.transport is None:
            return  # already paused: whatever resumes it comes later than the next turn
        self.sliced = True
        self.transport.pause_reading()
        self.server.loop.call_soon(self._unslice)

    def _unslice(self) -> None:
        """The loop's next turn: read again, unless paused meanwhile for another reason
        (its own resume then reads again)."""
        self.sliced = False
        if not self.read_paused and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    def eof_received(self) -> bool | None:
        """The client sent its last byte (``nc -N``, ``shutdown(SHUT_WR)``).

        Every complete request it sent is still answered, acknowledgements of its
        sets included, and then the connection is closed.  Nobody may be
        listening any more, so nothing blocks from here on: a waiting get ends
        now with ``END`` (an item is never handed to a client that may be gone)
        and later gets do not wait.
        """
        self.eof = True
        if not self.closing:
            self.session.stop_waiting()  # a wait ends (answered END), then requests go on
            if self.session.waiting is None:
                self._finish_if_eof()
        return True  # keep the transport open for the replies; close() closes it

    # --- the gate ---------------------------------------------------------------------------

    def blocked(self) -> bool:
        """No request may be judged now (see the module docstring)."""
        return (
            self.session.waiting is not None
            or self.held
            or self.write_paused
            or self.closing
            or self.out_size > OUTPUT_HOLD_LIMIT
            or self.held_put is not None
        )

    def _finish_if_eof(self) -> None:
        """After a half-close (callers check ``eof``): close once every request is judged."""
        if not self.blocked():
            self.close()  # an incomplete request left in the framing is dropped

    def process(self, data: bytes) -> None:
        """Run every complete request in ``data``; the framing keeps the rest."""
        trace = self.session.trace
        if trace is None:
            self.framing.parse(self, data)
            self.flush_out()
        else:
            trace.running()  # the queue events of these requests name the client
            try:
                self.framing.parse(self, data)
                self.flush_out()
            finally:
                trace.idle()
        if self.eof:
            self._finish_if_eof()

    def resume(self) -> None:
        """Continue with buffered input after a wait, a hold or a write pause ended."""
        if self.held and not self.session.puts_pending():
            self.held = False
        if self.blocked():
            return
        if self.read_paused and self.transport is not None:
            self.read_paused = False
            if not self.sliced:  # else the slice's end resumes it, on the next turn
                self.transport.resume_reading()
        data = self.framing.take_input()
        if data:
            self.last_active = monotonic()
            self.process(data)
        else:
            self.flush_out()
            if self.eof:
                self._finish_if_eof()

    def _continue(self) -> None:
        """Something this connection waited for happened: go on, or finish closing."""
        if self.closing:
            self._drain()
        else:
            self.resume()

    # --- the framing's sink -----------------------------------------------------------------

    def request(self, command: Command, args: list[bytes], quiet: bool) -> int:
        """Run one request line; ``quiet`` (noreply) drops its reply, errors included."""
        session = self.session
        if (
            session.waiting is not None
            or self.held
            or self.write_paused
            or self.closing
            or self.out_size > OUTPUT_HOLD_LIMIT
        ):
            return LATER  # the gate, inline: this runs once per request
        if command.waits_for_sets and session.unacked and session.puts_pending():
            # This connection's sets are not acknowledged yet: what follows
            # must see them (a get after a set gets the item), so wait.
            self.held = True
            return LATER
        if session.trace is not None:
            session.trace.command(command.word)
        out = self.out
        mark = len(out) if quiet else 0
        try:
            if COMPILED:
                command.run_line(self, args)  # a C call (framing.py's Command)
            else:
                command.run(self, args)
        except Exception:  # a bug must cost one request, not the connection
            self._failed(args)
        if quiet:
            del out[mark:]  # no quiet command holds a PendingReply
        if self.out_size > OUTPUT_FLUSH_SIZE:
            self.flush_out()  # may pause us (pause_writing) before the next request
        if session.waiting is not None or self.closing or self.write_paused:
            return STOP  # nothing after it is looked at now (not even a line too long)
        return GO

    def block_header(self, command: Command, args: list[bytes], size: int, quiet: bool) -> int:
        """The line of a request with a data block: read the block (KEEP) or skip it."""
        if (
            self.session.waiting is not None
            or self.held
            or self.write_paused
            or self.closing
            or self.out_size > OUTPUT_HOLD_LIMIT
        ):
            return LATER
        trace = self.session.trace
        if trace is not None:
            trace.command(command.word)
        out = self.out
        mark = len(out) if quiet else 0
        try:
            if COMPILED:
                keep = command.accept_block(self, args, size)
            else:
                keep = command.accept(self, args, size)  # type: ignore[misc]
        except Exception:
            self._failed(args)
            keep = False
        if quiet:
            del out[mark:]
        return KEEP if keep else SKIP

    def block(self, command: Command, args: list[bytes], data: bytes, quiet: bool) -> int:
        """The data block of a kept request (``set``): it was accepted, so it always runs, a
        large one perhaps a little later (kestreld/frontends/core/held_put.py)."""
        if len(data) >= PACED_BLOCK_BYTES:
            held = hold(self.session, self.put_name, (command, args, data, quiet), self._turn)
            if held is not None:
                self.held_put = held
                return STOP
        return self._run_block(command, args, data, quiet)

    def _turn(self, held: HeldPut) -> None:
        """The held large set's turn: it runs, then what came after it."""
        if self.held_put is held and not self.closed:
            self.held_put = None
            self._run_block(*held.request)
            self.flush_out()
            self._continue()

    def _run_block(self, command: Command, args: list[bytes], data: bytes, quiet: bool) -> int:
        try:
            if COMPILED:
                command.run_block(self, args, data)
            else:
                command.run(self, args, data)
        except Exception:
            self._failed(args)
        if self.closing or self.write_paused:
            return STOP  # as after a line: nothing after it is looked at now
        return GO

    def bad_block(self, quiet: bool) -> None:
        if not quiet:
            self.out.append(BAD_DATA_CHUNK)

    def fatal(self, reply: bytes) -> None:
        """The stream cannot be followed any more (a line too long, an impossible length)."""
        self.out.append(reply)
        self.close()

    def _failed(self, args: list[bytes]) -> None:
        log.exception(
            "command_failed", peer=self.peer, command=args[0][:40].decode("ascii", "replace")
        )
        self.out.append(INTERNAL_ERROR)

    # --- what the command table calls -------------------------------------------------------

    def expect_put(self, name: str, expire: int, noreply: bool) -> None:
        """A ``set`` was accepted: its data block, read next, goes to ``name``."""
        self.put_name = name
        self.put_expire = expire
        self.put_noreply = noreply

    def take_put(self) -> str:
        """The queue of the ``set`` whose data block has arrived (see :meth:`expect_put`);
        its expiry and noreply stay in ``put_expire`` and ``put_noreply``."""
        name = self.put_name
        self.put_name = None
        return name  # type: ignore[return-value]

    def hold(self, reply: PendingReply) -> None:
        """Place a promised reply in the output: what follows waits until it is sent."""
        self.out.append(reply)
        self.pending += 1

    def answer_fetch(self, f: Fetch, single: bool) -> None:
        """Render what came of a fetch (:meth:`Session.fetch`, or a wait that ended).

        ``single``: the only key of its get, so this completes the reply (an item
        with its END, END, ERROR or an error line); a key of a multi-key get adds
        only its item.  The bytes go inside the fetch's held reply when it has
        one (a /close's or a plain get's confirm), so a failed confirm replaces
        all of them.
        """
        reply = f.reply
        if reply is not None:
            self.hold(reply)
            parts = reply.parts
        else:
            behind = f.behind
            if behind is not None and not behind.rendered:
                parts = behind.parts  # still behind its /close: goes out with it
            else:
                parts = self.out
        outcome = f.outcome
        if outcome == ITEM:
            item = f.item
            data = item.data
            size = len(data)
            if f.with_id:
                header = b"VALUE %s 0 %d %d\r\n" % (f.key, size, item.id)
            elif size == self.value_size and f.key == self.value_key:
                header = self.value_header
            else:
                header = b"VALUE %s 0 %d\r\n" % (f.key, size)
                self.value_key = f.key
                self.value_size = size
                self.value_header = header
            parts.extend((header, data, VALUE_END if single else CRLF))
            self.out_size += size
        elif not single:
            return
        elif outcome == MISS:
            parts.append(END)
        elif outcome == BUSY:
            parts.append(ERROR)
        elif outcome == REFUSED:  # the status or the connection count: the session says which
            parts.append(server_error(self.session.read_refusal() or "reads refused"))
        elif outcome == LIMITED:
            limit = self.server.config.max_queues
            parts.append(
                server_error(f"too many queues (max_queues = {limit}); {f.name} not created")
            )
        # WAIT: the reply follows in wait_ended; GONE: its failed /close is the reply.

    # --- what the session calls (its listener) ----------------------------------------------

    def replies_ready(self, ticket: Any = None) -> None:
        """A ticket of the session resolved (a put's, a confirm's): send what is ready."""
        if self.closed:
            return
        self.flush_out()
        if self.closing:
            self._drain()
        elif self.held or self.eof or self.read_paused or self.framing.holds_input():
            self.resume()  # requests waited for it (or for output room)

    def wait_ended(self, f: Fetch) -> None:
        """The session's wait ended: its reply, then the requests buffered behind it."""
        self.last_active = monotonic()  # idle from the reply on, not from the request
        self.answer_fetch(f, True)
        self.flush_out()
        self._continue()

    def authentication_ended(self, user: Any, answer: Any) -> None:
        """The session's password check ended (``user`` None: refused): ``answer``, the
        front end's own (kestreld/frontends/memcache/auth.py), renders it; then what was sent behind it."""
        self.last_active = monotonic()
        answer(self, user)
        self.flush_out()
        self._continue()

    def monitor_item(self, f: Fetch) -> None:
        """One item of a ``monitor``, opened for this client: sent as a get reply at once."""
        self.answer_fetch(f, True)
        self.flush_out()

    # --- output -------------------------------------------------------------------------

    def flush_out(self) -> None:
        """Write every reply that is ready, in order; a pending reply holds the rest."""
        out = self.out
        if not out or self.closed:
            return
        if not self.pending:
            if COMPILED:
                self.send_parts(out)
                out.clear()
                self.out_size = 0
                return
            if self.out_size > OUTPUT_FLUSH_SIZE:
                # An item's bytes are not joined into one more copy (milliseconds on the loop
                # for a few MiB): the transport writes the parts as they are (writev).
                self.traffic.bytes_written += write_parts(self.transport, out, OUTPUT_FLUSH_SIZE)
                out.clear()
                self.out_size = 0
                return
            data = b"".join(out)
            out.clear()
            self.out_size = 0
        else:
            first = out[0]
            if type(first) is not bytes:
                reply = first
                if not reply.done():
                    return  # the first reply waits for its ticket: nothing can go yet
            ready: list[bytes] = []
            i = 0
            for i, part in enumerate(out):  # noqa: B007
                if type(part) is bytes:
                    ready.append(part)
                    continue
                reply = part
                if not reply.done():
                    break
                self.pending -= 1
                error = reply.settle()
                if error is not None:
                    ready.append(server_error(error))
                    self.session.reply_failed(reply)
                elif reply.kind == PUT:
                    observe = self.session.gate.latency_observer
                    if observe is not None:
                        observe("set", monotonic() - reply.started())
                    ready.append(STORED)
                else:
                    ready.extend(reply.parts)
            else:
                i = len(out)
            if i == len(out):
                out.clear()  # the usual case; compiled, del out[:i] makes a slice object
            else:
                del out[:i]
            self.out_size = self._held_size() if out else 0
            if COMPILED:
                self.send_parts(ready)
                return
            if len(ready) > 2:  # an item (header, data, end) or more: maybe a large one
                self.traffic.bytes_written += write_parts(self.transport, ready, OUTPUT_FLUSH_SIZE)
                return
            data = b"".join(ready)
        # The plain build writes through the transport, as it always did (send_parts would
        # be one more Python call per flush, for nothing).
        if data:
            self.traffic.bytes_written += len(data)
            self.write_out(data)  # type: ignore[misc]

    def send_parts(self, parts: list[bytes]) -> None:
        """Hand reply bytes (``parts``, in order) to the client as one write.

        Compiled, on a socket it may send to itself (:meth:`sends_directly`): one
        ``send(2)``, or ``sendmsg(2)`` of the parts as they are (no joined copy of an
        item; kestreld/frontends/memcache/direct_send.py); what the socket does not
        take goes to the transport, and replies go through it from then on until it
        has written everything it holds.  Else the parts are joined once.
        """
        if COMPILED and parts and self.sends_directly():
            total = 0
            n = send_now(self.fd, parts, cython.address(total))
            self.traffic.bytes_written += total
            if n != total:
                # The rest goes to the transport as it is: an item's bytes are not joined.
                self.transport.writelines(unsent(parts, self._spill(n)))
            return
        data = b"".join(parts)
        if data:
            self.traffic.bytes_written += len(data)
            self.write_out(data)  # type: ignore[misc]

    def sends_directly(self) -> bool:
        """Replies may go to the socket now, not through the transport: compiled, a plain
        uvloop socket, the transport not closing and holding nothing.  Nothing is sent
        directly once it is closing: uvloop closes the descriptor at once on a fatal
        error, before ``connection_lost`` reaches us, and its number may already belong
        to another socket or file."""
        if self.fd < 0:
            return False
        if self.spilled:
            if self.transport.get_write_buffer_size():
                return False
            self.spilled = False
        return not self.transport_closing()

    def _spill(self, sent: int) -> int:
        """The socket took ``sent`` bytes of a reply, not all (``-errno``: none, an error):
        the rest, and what follows, go through the transport; returns the bytes sent."""
        if sent < 0:
            log.debug("send_failed", peer=self.peer, error=os.strerror(-sent))
            sent = 0
        self.spilled = True
        return sent

    def _held_size(self) -> int:
        size = 0
        for part in self.out:
            size += len(part) if type(part) is bytes else part.size()
        return size

    # --- closing: one path ----------------------------------------------------------------

    def close(self) -> None:
        """Close as the server decides to: take no more requests, answer a wait in
        progress, send every reply already promised, in order, then close."""
        if self.closing:
            return
        self.closing = True
        if self.read_paused is False and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()  # nothing more is read: nothing more is judged
        self.session.stop_waiting()  # answered END in wait_ended, which drains
        self._drain()

    def _drain(self) -> None:
        """Send what is ready; once nothing is promised any more, close."""
        self.flush_out()
        if self.closed or self.out or self.session.waiting is not None:
            return
        self.closed = True
        self.session.close(False)  # every promised reply is written: open reads go back
        if self.transport is not None:
            self.transport.close()

    def finished(self) -> bool:
        """True once closed with every written byte handed to the socket."""
        transport = self.transport
        return self.closed and (transport is None or not transport.get_write_buffer_size())

    def close_now(self) -> None:
        """The last step of a server stop: close at once, whatever is still pending."""
        self.closing = True
        self.flush_out()
        self.session.close(False)
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    def idle_for(self, now: float) -> float:
        """Seconds this connection has been truly idle (0: not idle).

        Idle means nothing buffered either way, nothing being answered and no
        wait in progress; each processed request and each resumed write counts
        as activity.
        """
        transport = self.transport
        if (
            self.closing
            or transport is None
            or self.out
            or self.held
            or self.write_paused
            or self.session.waiting is not None
            or self.framing.mid_request()
            or transport.get_write_buffer_size()
        ):
            return 0.0
        return now - self.last_active


class MemcacheConnection(Connection, asyncio.Protocol):
    """One client connection as the event loop sees it: an ``asyncio.Protocol``."""

    __slots__ = ()
