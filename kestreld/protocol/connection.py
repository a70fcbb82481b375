"""One client connection: flow control and reply ordering.

Bytes go to the :class:`~kestreld.protocol.framing.Framing`, which hands each
complete request back here; the command table
(:mod:`kestreld.protocol.commands`) runs it and appends its reply to ``out``.
Replies are written once per batch of requests.  A ``set`` is acknowledged
only when its journal batch is written (or fsynced, with ``sync_journal = 0``):
its reply waits in ``out`` as the pending batch and later replies queue behind
it, so replies always come back in request order.  A confirm (``/close``,
``confirm``, a plain get) is held the same way, as a
:class:`~kestreld.protocol.confirm_reply.ConfirmReply` on its progress batch.

Parsing stops (the rest of the input stays buffered) while:

- a request waits (a get with ``/t=``, ``monitor``): ``waiting``;
- a request must see this connection's sets that are not acknowledged yet
  (a get after a set gets the item): ``held``;
- the client does not read its replies (``pause_writing``): ``write_paused``;
- the connection is closing: ``closing``.

Reading from the socket pauses when too much input piles up meanwhile, so
nothing is buffered without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

# The module, not its names: compiled, commands cimports this module's Connection, so
# whichever of the two loads first finds the other only partly initialised.
from kestreld.protocol import commands
from kestreld.protocol.confirm_reply import ConfirmReply
from kestreld.protocol.framing import GO, KEEP, LATER, SKIP, Command, Framing, Sink
from kestreld.protocol.replies import BAD_DATA_CHUNK, STORED, server_error

if TYPE_CHECKING:
    from kestreld.queues.reader import OpenRead, Reader
    from kestreld.state import ServerState

log = structlog.get_logger("kestreld.protocol")

#: Input held while a request waits, before reading from the socket pauses.
INPUT_PAUSE_LIMIT = 1024 * 1024
#: Reply bytes produced before they are handed to the transport (back-pressure check).
OUTPUT_FLUSH_SIZE = 256 * 1024

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
        "transport",
        "peer",
        "framing",
        "out",
        "out_size",
        "pending_batches",
        "unacked",
        "held",
        "waiting",
        "closing",
        "eof",
        "stopping",
        "write_paused",
        "read_paused",
        "last_active",
        "open_reads",
        "put_target",
        "waiting_reply",
        "confirm_ticket",
        "trace",
    )

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.stats = server.stats
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self.framing = Framing(commands.COMMANDS, commands.UNKNOWN, server.config.max_line_length)
        #: Replies in request order: bytes, a set's pending journal batch, or a ConfirmReply.
        self.out: list[Any] = []
        self.out_size = 0  # large reply bytes in self.out
        self.pending_batches = 0
        self.unacked: list[Any] = []  # batches holding this connection's sets, not yet resolved
        self.held = False  # a request waits for those sets
        self.waiting: asyncio.Future | None = None
        self.closing = False
        self.eof = False  # the client half-closed: finish what it sent, then close
        self.stopping = False  # the server is shutting down (closing_soon)
        self.write_paused = False
        self.read_paused = False
        self.last_active = time.monotonic()
        #: Reads opened by this connection (``get q/open``), oldest first per reader.
        self.open_reads: dict[Reader, deque[OpenRead]] = {}
        #: (queue, expiry ms, noreply) of a set whose data block is being read.
        self.put_target: tuple[str, int, bool] | None = None
        #: The held reply of a ``/close`` whose get now waits for an item (it goes out with it).
        self.waiting_reply: ConfirmReply | None = None
        self.confirm_ticket: Any = None  # the last confirm batch this connection listens to
        #: The session's trace (kestreld.stats.trace.TracedSession) with enable_session_trace.
        self.trace: Any = None

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        server = self.server
        if len(server.connections) >= server.config.max_connections:
            log.warning("connection_refused", peer=self.peer, reason="too many connections")
            transport.write(server_error("too many connections"))  # type: ignore[attr-defined]
            self.closing = True
            transport.close()
            return
        server.connections.add(self)
        self.stats.total_connections += 1
        if server.session_trace is not None:  # [trace hook 1: session start]
            self.trace = server.session_trace.start(self.peer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if exc is not None:
            log.info("connection_error", peer=self.peer, error=str(exc))
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()
        given_back = self.release_open_reads()
        if self.trace is not None:  # [trace hook 2: session end]
            self.trace.end(given_back)

    def closing_soon(self) -> None:
        """The server is stopping: take no new request, but still send pending replies."""
        self.stopping = True
        self.waiting = self.waiting or self.server.loop.create_future()
        if self.transport is not None and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def release_open_reads(self) -> int:
        """Every open read goes back to the head of its queue, in original order; how many."""
        reads, self.open_reads = self.open_reads, {}
        count = 0
        for reader, queue in reads.items():
            count += len(queue)
            reader.abort(list(queue))
        return count

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self.resume()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.stats.bytes_read += len(data)
        self.last_active = time.monotonic()
        framing = self.framing
        if framing.buf or framing.skip or framing.chunks is not None:
            ready = framing.receive(data)
            if ready is None:
                return
        else:
            ready = data  # the usual case: whole requests in one packet, nothing held
        if self.waiting is not None or self.held or self.write_paused or self.closing:
            framing.buf = ready
            if len(ready) > INPUT_PAUSE_LIMIT:
                self._pause_reading()
            return
        self.process(ready)

    def eof_received(self) -> bool | None:
        """The client sent its last byte (``nc -N``, ``shutdown(SHUT_WR)``).

        Every complete request it sent is still answered, acknowledgements of its
        sets included, and then the connection is closed.  Nobody may be
        listening any more, so nothing blocks from here on: a waiting get ends
        now with ``END`` (an item is never handed to a client that may be gone)
        and later gets do not wait.
        """
        self.eof = True
        if self.stopping:
            return True  # the shutdown sends what is pending and closes
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.cancel()  # its callback replies END (or ends the monitor) and resumes
        else:
            self._finish_if_eof()
        return True  # keep the transport open for the replies; _finish_if_eof closes it

    # --- the gate ---------------------------------------------------------------------------

    def blocked(self) -> bool:
        """No request may run now: one waits, sets are unacknowledged, output is paused, closing."""
        return self.waiting is not None or self.held or self.write_paused or self.closing

    def _finish_if_eof(self) -> None:
        """After a half-close (callers check ``eof``): close once every request has its reply."""
        if not self.blocked() and not self.pending_batches:
            self.close_after_reply()  # an incomplete request left in the framing is dropped

    def process(self, data: bytes) -> None:
        """Run every complete request in ``data``; the framing keeps the rest."""
        trace = self.trace
        if trace is not None:  # [trace hook 3: queue events carry the client]
            trace.running()
        try:
            self.framing.parse(self, data)
            self.flush_out()
        finally:
            if trace is not None:
                trace.idle()
        if self.eof:
            self._finish_if_eof()

    def resume(self) -> None:
        """Continue with buffered input after a wait or a write pause ended."""
        if self.blocked():
            return
        if self.read_paused and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        framing = self.framing
        data, framing.buf = framing.buf, b""
        if data:
            self.process(data)
        else:
            self.flush_out()
            if self.eof:
                self._finish_if_eof()

    # --- the framing's sink -----------------------------------------------------------------

    def request(self, command: Command, args: list[bytes], quiet: bool) -> int:
        """Run one request line; ``quiet`` (noreply) drops its reply, errors included."""
        if self.waiting is not None or self.held or self.write_paused or self.closing:
            return LATER  # the gate, inline: this runs once per request
        if self.unacked and command.waits_for_sets and self._unacked_pending():
            # This connection's sets are not acknowledged yet: what follows
            # must see them (a get after a set gets the item), so wait.
            self.held = True
            return LATER
        if self.trace is not None:  # [trace hook 4: count the command]
            self.trace.command(command.word)
        out = self.out
        mark = len(out) if quiet else 0
        try:
            command.run(self, args)
        except Exception:  # a bug must cost one request, not the connection
            self._failed(args)
        if quiet:
            del out[mark:]
        if self.out_size > OUTPUT_FLUSH_SIZE:
            self.flush_out()  # may pause us (pause_writing) before the next request
        return GO

    def block_header(self, command: Command, args: list[bytes], size: int, quiet: bool) -> int:
        """The line of a request with a data block: read the block (KEEP) or skip it."""
        if self.waiting is not None or self.held or self.write_paused or self.closing:
            return LATER
        if self.trace is not None:  # [trace hook 4: count the command]
            self.trace.command(command.word)
        out = self.out
        mark = len(out) if quiet else 0
        try:
            keep = command.accept(self, args, size)  # type: ignore[misc]
        except Exception:
            self._failed(args)
            keep = False
        if quiet:
            del out[mark:]
        return KEEP if keep else SKIP

    def block(self, command: Command, args: list[bytes], data: bytes, quiet: bool) -> int:
        """The data block of a kept request (``set``): it was accepted, so it always runs."""
        try:
            command.run(self, args, data)
        except Exception:
            self._failed(args)
        return GO

    def bad_block(self, quiet: bool) -> None:
        if not quiet:
            self.out.append(BAD_DATA_CHUNK)

    def fatal(self, reply: bytes) -> None:
        """The stream cannot be followed any more (a line too long, an impossible length)."""
        self.out.append(reply)
        self.close_after_reply()

    def _failed(self, args: list[bytes]) -> None:
        log.exception(
            "command_failed", peer=self.peer, command=args[0][:40].decode("ascii", "replace")
        )
        self.out.append(INTERNAL_ERROR)

    # --- output -------------------------------------------------------------------------

    def flush_out(self) -> None:
        """Write every reply that is ready, in order; a pending set's reply holds the rest."""
        out = self.out
        if not out or self.transport is None:
            return
        self.out_size = 0
        if not self.pending_batches:
            data = b"".join(out)
            out.clear()
        elif out[0].__class__ is not bytes and not out[0].done:
            return  # the first reply waits for its batch: nothing can go yet
        else:
            ready: list[bytes] = []
            i = 0
            for i, part in enumerate(out):  # noqa: B007
                if part.__class__ is bytes:
                    ready.append(part)
                elif part.done:
                    self.pending_batches -= 1
                    if part.__class__ is ConfirmReply:
                        ready.append(part.render())
                        if part.failed:
                            commands.undo_confirm(self, part)
                        continue
                    observe = self.server.latency_observer
                    if observe is not None:
                        observe("set", time.perf_counter() - part.started)
                    ready.append(STORED if part.error is None else server_error(part.error))
                else:
                    break
            else:
                i = len(out)
            del out[:i]
            data = b"".join(ready)
        if data and not self.closing:
            self.stats.bytes_written += len(data)
            self.transport.write(data)

    def hold_reply(self, ticket: Any, reader: Reader) -> ConfirmReply:
        """A reply that goes out once ``ticket`` (a confirm's progress batch) resolves."""
        reply = ConfirmReply(ticket, reader)
        self.out.append(reply)
        self.pending_batches += 1
        if not ticket.done and self.confirm_ticket is not ticket:
            self.confirm_ticket = ticket  # one callback per batch, however many replies
            ticket.add_done_callback(self._on_confirmed)
        return reply

    def _on_confirmed(self, batch: Any) -> None:
        self.flush_out()
        if self.eof:
            self._finish_if_eof()

    def watch_batch(self, batch: Any) -> None:
        """A set of this connection waits for ``batch``: later requests wait with it."""
        unacked = self.unacked
        if not unacked or unacked[-1] is not batch:
            unacked.append(batch)
            batch.add_done_callback(self._on_batch)

    def _unacked_pending(self) -> bool:
        """Prune acknowledged batches; True while one of this connection's sets is pending."""
        self.unacked = [b for b in self.unacked if not b.done]
        return bool(self.unacked)

    def _on_batch(self, batch: Any) -> None:
        unacked = self.unacked
        if len(unacked) == 1 and unacked[0] is batch:
            unacked.clear()  # the usual case: this connection's only pending batch
        else:
            self._unacked_pending()  # batches of several queues resolve in any order
        self.flush_out()
        if self.held and not self.unacked:
            self.held = False
            self.resume()
        elif self.eof:
            self._finish_if_eof()

    def close_after_reply(self) -> None:
        self.flush_out()
        self.closing = True
        if self.transport is not None:
            self.transport.close()


class MemcacheConnection(Connection, asyncio.Protocol):
    """One client connection as the event loop sees it: an ``asyncio.Protocol``."""

    __slots__ = ()
