"""The connection core of the text and thrift front ends: one request at a time, in order.

Back-pressure lives here: the input bound (:data:`INBOX_PAUSE`, from
:mod:`kestreld.frontends.core.limits`), writes paused, the one close path; and the
read slice (``READ_SLICE_BYTES``): once that much was read since the last pause, reading
waits for the loop's next turn, so a large put or frame is read a slice per turn beside the
other clients.

Kestrel's text and thrift clients send a request and wait for its reply (a
Finagle client may pipeline, and is answered in order).  So these front ends
keep it simple: the bytes are parsed as they arrive (the subclass's
:meth:`RequestConnection.parse`), complete requests queue in ``inbox``, and one
task per connection runs them in order, awaiting whatever a request waits for
(an item, its journal batch, a confirm's durability) before its reply is
written and the next one runs.  The queue work is the
:class:`~kestreld.session.session.Session`'s; this class is its listener.

The connection shares the memcache connection's duties towards the server:
``max_connections``, ``client_timeout`` (:meth:`idle_for`), and the one close
path (:meth:`close`: the request in progress is answered, then the session
ends and the socket closes; :meth:`close_now` at the end of a server stop).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

import structlog

from kestreld.frontends.core.limits import READ_SLICE_BYTES, REQUESTS_AHEAD
from kestreld.session.fetch import WAIT, Fetch
from kestreld.session.session import Session

if TYPE_CHECKING:
    from kestreld.session.reply import PendingReply
    from kestreld.state import ServerState

log = structlog.get_logger("kestreld.frontends")

#: Requests held beyond the one running before reading from the socket pauses.
INBOX_PAUSE = REQUESTS_AHEAD


class RequestConnection(asyncio.Protocol):
    """One client of a request/reply front end; subclasses parse and handle requests."""

    #: The front end's name in logs ("text", "thrift").
    kind = ""

    def __init__(self, server: ServerState) -> None:
        self.server = server
        self.stats = server.stats
        self.session = Session(server, self)
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None
        self.inbox: deque[Any] = deque()
        self.task: asyncio.Task | None = None
        self.busy = False  # a request is running
        self.closing = False  # no new request runs; close once the current one is answered
        self.closed = False
        self.eof = False  # the client half-closed: answer what it sent, then close
        self.read_paused = False  # paused for a reason of this connection's
        self.sliced = False  # paused after a large read, until the loop's next turn
        self.unsliced = 0  # bytes read since the last pause
        self.write_paused = False
        self.last_active = time.monotonic()
        self._signal: asyncio.Future | None = None

    # --- what a front end provides ----------------------------------------------------------

    def parse(self, data: bytes) -> list[Any]:
        """Complete requests in the bytes that arrived (keeps the rest)."""
        raise NotImplementedError

    async def handle(self, request: Any) -> None:
        """Run one request and write its reply."""
        raise NotImplementedError

    def refusal(self) -> bytes:
        """What a connection over ``max_connections`` is told before it is closed."""
        return b""

    def too_many(self) -> bool:
        """This connection, just accepted, is one over ``max_connections`` (a worker's
        client connections count the box's: kestreld.workers.box_connections)."""
        server = self.server
        return server.clients() >= server.config.max_connections

    def internal_error(self, request: Any) -> None:
        """A request failed on a bug: answer it with the front end's error."""

    def mid_request(self) -> bool:
        """True while part of a request is buffered."""
        return False

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        server = self.server
        if self.too_many():
            log.warning("connection_refused", peer=self.peer, reason="too many connections")
            refusal = self.refusal()
            if refusal:
                transport.write(refusal)  # type: ignore[attr-defined]
            self.closing = self.closed = True
            transport.close()
            return
        server.connection_opened(self)
        self.stats.total_connections += 1
        self.session.begin(self.peer)  # the session trace starts (enable_session_trace)
        self.task = server.loop.create_task(self._run())

    def connection_lost(self, exc: Exception | None) -> None:
        client_caused = not self.closing
        self.closing = self.closed = True
        self.server.connection_closed(self)
        if exc is not None:
            log.info("connection_error", peer=self.peer, error=str(exc))
        self._end_session(client_caused)
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        self.stats.bytes_read += len(data)
        self.unsliced += len(data)
        if self.unsliced >= READ_SLICE_BYTES:
            self._slice()
        self.last_active = time.monotonic()
        if self.closing:
            return
        requests = self.parse(data)
        if requests:
            inbox = self.inbox
            inbox.extend(requests)
            self._poke()
            # One request may wait beyond the one being answered: a client that pipelines
            # more is paused (its bytes stay in the kernel), never buffered here.
            if len(inbox) + self.busy > INBOX_PAUSE:
                self._pause_reading()

    def eof_received(self) -> bool | None:
        """The client sent its last byte: what it sent is answered (no waits), then close."""
        self.eof = True
        self.session.stop_waiting()
        self._poke()
        return True

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self.last_active = time.monotonic()
        self._poke()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closed:
            self.read_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.read_paused and self.transport is not None and not self.closing:
            self.read_paused = False
            if not self.sliced:  # else the slice's end resumes it, on the next turn
                self.transport.resume_reading()

    def _slice(self) -> None:
        """A slice was read: read nothing more of this client in this turn of the loop (the
        loop reads a socket again within its turn after a read that filled its buffer)."""
        self.unsliced = 0
        if self.sliced or self.read_paused or self.closed or self.transport is None:
            return  # already paused: whatever resumes it comes later than the next turn
        self.sliced = True
        self.transport.pause_reading()
        self.server.loop.call_soon(self._unslice)

    def _unslice(self) -> None:
        """The loop's next turn: read again, unless paused meanwhile for another reason."""
        self.sliced = False
        if not self.read_paused and not self.closed and self.transport is not None:
            self.transport.resume_reading()

    # --- the request loop -------------------------------------------------------------------

    async def _run(self) -> None:
        inbox = self.inbox
        while True:
            while self.write_paused and not self.closed:
                await self.signalled()
            if self.closing or self.closed:
                break
            if not inbox:
                if self.eof:
                    break
                self._resume_reading()
                await self.signalled()
                continue
            request = inbox.popleft()
            self.busy = True
            if not inbox:
                self._resume_reading()  # room for the next request while this one runs
            trace = self.session.trace
            if trace is not None:
                trace.running()  # the queue events of this request name the client
            try:
                await self.handle(request)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug costs one request, not the connection
                log.exception("request_failed", peer=self.peer, front_end=self.kind)
                self.internal_error(request)
            finally:
                self.busy = False
                if trace is not None:
                    trace.idle()
            self.last_active = time.monotonic()
        self._finish()

    def _finish(self) -> None:
        """Every reply is written: the session ends, the socket closes."""
        if self.closed:
            return
        self.closing = self.closed = True
        self._end_session(False)
        if self.transport is not None:
            self.transport.close()

    def _end_session(self, client_caused: bool) -> None:
        self.session.close(client_caused)
        open_ids = getattr(self.server, "open_ids", None)
        if open_ids is not None:
            open_ids.session_ended(self.session)

    def signalled(self) -> asyncio.Future:
        """A future resolved at the next event for this connection (input, a resolved
        reply, a wait's end, writes resumed, close); callers re-check their condition."""
        if self._signal is None or self._signal.done():
            self._signal = self.server.loop.create_future()
        return self._signal

    def _poke(self) -> None:
        signal = self._signal
        if signal is not None and not signal.done():
            signal.set_result(None)

    def write(self, data: bytes) -> None:
        if data and not self.closed and self.transport is not None:
            self.stats.bytes_written += len(data)
            self.transport.write(data)

    # --- the session's listener -------------------------------------------------------------

    def replies_ready(self, ticket: Any = None) -> None:
        self._poke()

    def wait_ended(self, f: Fetch) -> None:
        self._poke()

    def monitor_item(self, f: Fetch) -> None:
        """One item of a monitor (front ends that monitor override this)."""

    def authentication_ended(self, user: Any, tag: Any) -> None:
        """The session's password check ended: ``tag`` (:meth:`authenticate`'s list) gets
        ``user`` (None: refused) and the request goes on."""
        tag.append(user)
        self._poke()

    # --- authentication (a server with an auth_file) ---------------------------------------

    def unauthenticated(self) -> bool:
        """True while this client must authenticate before anything else runs."""
        return self.server.authenticator is not None and self.session.principal is None

    def address(self) -> str | None:
        """The client's address, as failed attempts are counted and delayed by."""
        peer = self.peer
        if isinstance(peer, tuple) and peer:
            return str(peer[0])
        return None if peer is None else str(peer)

    async def authenticate(self, name: str | None, password: bytes, refusal: str = "") -> Any:
        """Check ``name``'s ``password`` as the session's wait (off the loop); the user,
        or None.  ``name`` None: a malformed attempt (``refusal`` says why), refused
        after the same delay as a wrong password."""
        ended: list[Any] = []
        if name is None:
            self.session.refuse_authentication(refusal, self.address(), ended)
        else:
            self.session.authenticate(name, password, self.address(), ended)
        while not ended and not self.closed:
            await self.signalled()
        return ended[0] if ended else None

    # --- session helpers --------------------------------------------------------------------

    def gone(self) -> bool:
        """True once the client sent its last byte or the connection is closing: a reply
        may never be read, so nothing that outlives the connection is handed to it."""
        return self.eof or self.closing

    async def settle(self, reply: PendingReply) -> str | None:
        """Wait until the journal has ``reply``'s request: None, or why it failed (undone)."""
        while not reply.done():
            await self.signalled()
        error = reply.settle()
        if error is not None:
            self.session.reply_failed(reply)
        return error

    async def fetch(self, f: Fetch) -> int:
        """One get through the session, waiting for its item if it waits; its outcome.

        A consumed item's confirm (``f.reply``) is left for the caller to settle.
        """
        session = self.session
        outcome = session.fetch(f, True)
        if outcome == WAIT:
            while session.wait_fetch is f:
                await self.signalled()
            outcome = f.outcome
        return outcome

    # --- the server's view ------------------------------------------------------------------

    def close(self) -> None:
        """Close as the server decides to: the request in progress is answered (a wait
        ends now), nothing after it runs, then the connection closes."""
        if self.closing:
            return
        self.closing = True
        self._pause_reading()
        self.session.stop_waiting()
        self.inbox.clear()
        if self.busy:
            self._poke()
        else:
            self._finish()

    def finished(self) -> bool:
        """True once closed with every written byte handed to the socket."""
        transport = self.transport
        return self.closed and (transport is None or not transport.get_write_buffer_size())

    def close_now(self) -> None:
        """The last step of a server stop: close at once, whatever is still pending."""
        self.closing = True
        self._end_session(False)
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.transport is not None and not self.closed:
            self.transport.abort()
        self.closed = True

    def idle_for(self, now: float) -> float:
        """Seconds this connection has been truly idle (0: not idle)."""
        transport = self.transport
        if (
            self.closing
            or transport is None
            or self.busy
            or self.inbox
            or self.write_paused
            or self.session.waiting is not None
            or self.mid_request()
            or transport.get_write_buffer_size()
        ):
            return 0.0
        return now - self.last_active


__all__ = ["INBOX_PAUSE", "RequestConnection"]
