"""One client's queue session: what it has open, what it is owed, what it waits for.

Design.  Kestrel put a ``KestrelHandler`` under each front end (memcache,
text, thrift); this is that layer.  A front end parses requests and renders
replies; everything a client holds lives here, so every way a connection
ends finds it in one place:

- **open reads** (``get q/open``, ``monitor``): per reader, oldest first.
  They are given back when the session closes, however it closes, and leave
  it when ``open_transaction_timeout`` gives them back first
  (:meth:`Session.open_read_timed_out`, called by the queues' sweep through
  :attr:`OpenRead.owner <kestreld.queues.reader.OpenRead>`).
- **the wait** (a get with a timeout, a monitor): at most one; while it runs
  the front end judges no later request (replies stay in request order).
- **put tickets**: the journal batches of this session's puts not yet
  acknowledged; a later fetch must see them (:meth:`Session.puts_pending`).
- **pending replies** (:class:`~kestreld.session.reply.PendingReply`): a put's
  or a confirm's acknowledgement, promised and held in the front end's output
  until the journal has it.  When a ticket resolves the session tells its
  listener (``replies_ready``); a failed confirm is undone by
  :meth:`Session.reply_failed`.

The listener is the front end's connection.  It implements
``replies_ready(ticket)`` (a ticket of this session resolved: send what is
ready; called even after the session closed), ``wait_ended(fetch)`` and
``monitor_item(fetch)``
(plain method calls, no protocol class imported here).  :meth:`Session.close`
is the one way a session ends; the front end calls it once it has sent every
promised reply (a close it initiates) or at once (the client went away);
either way open reads go back to their queues.

Requests are refused by raising :mod:`kestreld.session.errors` exceptions
(rare paths) or, for a fetch, by its outcome (the hot path raises nothing).
**Authentication** (a server with an ``auth_file``): :meth:`Session.authenticate`
checks a user's password as the session's wait (off the event loop; a failure
is delayed per client address) and ends with the listener's
``authentication_ended(user, tag)``; :attr:`Session.principal` is then the
:class:`~kestreld.security.policy.User` (None: nobody yet), and
:meth:`Session.permit` says whether it may act with a role on a queue.  Front
ends decide which of their requests need which role (``read``: fetches;
``write``: puts; ``admin``: flush, delete, status, reload, shutdown).
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import structlog

from kestreld.journal.clock import monotonic, now_ms
from kestreld.queues.blocking import Waiter
from kestreld.queues.collection import TooManyQueues
from kestreld.queues.journaled_queue import JournalWriteError, QueueFull
from kestreld.security.policy import Role
from kestreld.session.errors import (
    NoOpenRead,
    NotStored,
    NotWritable,
    PutFailed,
    QueueRefused,
)
from kestreld.session.fetch import BUSY, GONE, ITEM, LIMITED, MISS, REFUSED, WAIT, Fetch
from kestreld.session.reply import PendingReply, pending_confirm, pending_put

if TYPE_CHECKING:
    from kestreld.queues.item import QueueItem
    from kestreld.queues.reader import OpenRead, Reader
    from kestreld.session.trace import TracedSession
    from kestreld.state import ServerState

log = structlog.get_logger("kestreld.session")


__all__ = ["Session"]


class Session:
    """The queue side of one client, whatever its wire protocol."""

    __slots__ = (
        "server",
        "queues",
        "tick",
        "gate",
        "stats",
        "traffic",
        "listener",
        "ready",
        "open_reads",
        "spare_reads",
        "waiting",
        "wait_fetch",
        "_wait_done_bound",
        "unacked",
        "confirm_ticket",
        "no_wait",
        "closed",
        "principal",
        "authenticating",
        "trace",
    )

    def __init__(self, server: ServerState, listener: Any) -> None:
        self.server = server
        self.queues = server.queues
        #: The server's journal tick: a front end holds it while it runs the requests of one
        #: read, so their writes go out together (kestreld/journal/tick.py).
        self.tick = server.queues.tick
        #: The server's gate: what it refuses now, who observes latencies (one per server).
        self.gate = server.gate
        self.stats = server.stats
        self.traffic = server.stats.traffic  # per-request counters (C fields when compiled)
        #: The front end: ``replies_ready(ticket)``, ``wait_ended(fetch)``, ``monitor_item(fetch)``.
        self.listener = listener
        #: ``listener.replies_ready(ticket)``, bound once: the callback of every ticket.
        self.ready = listener.replies_ready
        #: Reads this session opened, oldest first per reader.
        self.open_reads: dict[Reader, list[OpenRead]] = {}
        #: An emptied line of open reads, kept for the next one opened (a /close/open
        #: empties its line and fills it again).
        self.spare_reads: list[OpenRead] | None = None
        #: The wait in progress (a get's Waiter, a monitor's or a password check's task).
        self.waiting: Waiter | asyncio.Task | None = None
        self.wait_fetch: Fetch | None = None
        self._wait_done_bound = self._wait_done  # the callback of every wait, bound once
        #: Journal batches holding this session's puts, not yet resolved.
        self.unacked: list[Any] = []
        self.confirm_ticket: Any = None  # the last confirm batch listened to (one callback each)
        self.no_wait = False  # nobody may be listening: fetches do not wait
        self.closed = False
        #: Who the client authenticated as (a kestreld.security User; None: nobody yet).
        self.principal: Any = None
        self.authenticating = False  # the wait is a password check (not ended by stop_waiting)
        #: This session's :class:`~kestreld.session.trace.TracedSession` with
        #: ``enable_session_trace`` (from :meth:`begin`); None otherwise, and then
        #: tracing costs one ``is not None`` check where it would count.
        self.trace: TracedSession | None = None

    def begin(self, peer: Any) -> None:
        """The front end accepted its client (``peer``: the socket's peer address): with
        the session trace on,
        the session's trace starts (``session_started``).  Front ends count each
        command they dispatch with ``trace.command(word)`` and run a batch of requests
        between ``trace.running()`` and ``trace.idle()`` (queue events name the client)."""
        tracer = self.server.session_trace
        if tracer is not None:
            self.trace = tracer.start(peer)

    # --- identity and status checks ------------------------------------------------------

    def authenticate(self, name: str, password: bytes, peer: str | None, tag: Any) -> None:
        """Check ``name``'s ``password`` (the auth file's users) as this session's wait.

        The listener's ``authentication_ended(user, tag)`` follows: ``user`` is
        the :class:`~kestreld.security.policy.User`, now :attr:`principal`, or
        None when refused (unknown user, wrong password: logged with ``peer``,
        counted, and delayed when ``peer`` keeps failing).  ``tag`` is the
        front end's own, handed back.  Unlike a get's wait, a half-close does
        not end it: the requests behind it are still answered.
        """
        check = self.server.authenticator.authenticate(name, password, peer)
        self._authenticate(check, tag)

    def admit(self, user: Any) -> None:
        """The client proved it is ``user`` another way (a verified TLS client
        certificate naming a user of the auth file): it is :attr:`principal` at once."""
        self.stats.auth_successes += 1
        self.principal = user

    def refuse_authentication(self, reason: str, peer: str | None, tag: Any) -> None:
        """A malformed attempt (``reason``): counted and delayed as a wrong password is,
        then ``authentication_ended(None, tag)``."""
        self._authenticate(self.server.authenticator.refused(peer, None, reason), tag)

    def _authenticate(self, check: Any, tag: Any) -> None:
        task = self.server.loop.create_task(check)
        self.waiting = task
        self.authenticating = True
        task.add_done_callback(lambda t: self._authenticated(t, tag))

    def _authenticated(self, task: asyncio.Task, tag: Any) -> None:
        if self.waiting is task:
            self.waiting = None
            self.authenticating = False
        user = None
        if not task.cancelled():
            if task.exception() is not None:
                log.error("authentication_failed", error=str(task.exception()))
            else:
                user = task.result()  # None from refuse_authentication
        if user is None:
            self.stats.auth_failures += 1
        else:
            self.stats.auth_successes += 1
            self.principal = user
        if not self.closed:
            self.listener.authentication_ended(user, tag)

    def permit(self, role: Any, queue: str | None = None) -> bool:
        """May this client act with ``role`` (a kestreld.security Role) on ``queue`` (None:
        the whole server)?  Always, without an auth file.

        Judged on the queues the request reaches: writing to an alias needs ``role`` on
        the alias and on every one of its destinations (a user who may not write to a
        queue cannot reach it through an alias); a fanout reader ``q+r`` is judged by
        its own name.
        """
        if self.server.authenticator is None:
            return True
        principal = self.principal
        if principal is None or not principal.permits(role, queue):
            return False
        if queue is not None and role is Role.WRITE:
            alias = self.queues.aliases.get(queue)
            if alias is not None:
                return all(principal.permits(role, name) for name in alias.destinations)
        return True

    # The server keeps why it refuses writes and fetches now (its status in force, or
    # more connections than connection_limit_refuse_writes / _reads) in its gate, so a
    # request reads one C field: see kestreld/session/gate.py.

    def check_writable(self) -> None:
        """Raise :class:`NotWritable` if the server refuses writes now (READONLY,
        QUIESCENT, or more connections than ``connection_limit_refuse_writes``)."""
        refusal = self.gate.writes_refused
        if refusal is not None:
            raise NotWritable(refusal)

    def check_readable(self) -> None:
        """Raise :class:`NotWritable` if the server refuses fetches now (QUIESCENT, or
        more connections than ``connection_limit_refuse_reads``)."""
        refusal = self.gate.reads_refused
        if refusal is not None:
            raise NotWritable(refusal)

    def read_refusal(self) -> str | None:
        """Why fetches are refused now (a REFUSED fetch's reason), or None."""
        return self.gate.reads_refused

    def max_open_reads(self) -> int:
        """How many reads of one queue this session may hold open."""
        return self.server.config.max_open_reads

    def waits(self) -> bool:
        """True while a wait (a get with a timeout, a monitor) is in progress."""
        return self.waiting is not None

    # --- put -------------------------------------------------------------------------------

    def admit_put(self, name: str, size: int) -> None:
        """Before a put's data is read: raise :class:`NotWritable` or :class:`NotStored`
        (larger than the queue's ``max_item_size``) if it cannot be stored."""
        server = self.server
        refusal = self.gate.writes_refused
        if refusal is not None:
            raise NotWritable(refusal)
        # The queue's own copy of its max_item_size (kept current by reloads) saves a lookup.
        queue = self.queues.queues.get(name)
        if queue is not None:
            if size > queue.max_item_size:
                raise NotStored("item too large")
        elif size > server.config.queue(name).max_item_size:
            raise NotStored("item too large")

    def put(self, name: str, data: bytes, expire: int, want_reply: bool) -> PendingReply | None:
        """Add an item to queue ``name`` (``expire``: ms since the epoch, 0 for never).

        Returns None when it is acknowledged already (or no reply is wanted),
        else the reply to hold until the journal has it.  Raises
        :class:`QueueRefused` (a new queue beyond ``max_queues``, a PutFailed),
        :class:`NotStored` (the queue is full) or :class:`PutFailed`.
        Later fetches of this session wait for it (:meth:`puts_pending`).
        """
        try:
            batch = self.queues.put(name, data, expire, now_ms())
        except QueueFull:
            raise NotStored("queue full") from None
        except TooManyQueues as e:
            self.stats.queue_create_refusals += 1
            raise QueueRefused(str(e)) from None
        except JournalWriteError as e:
            raise PutFailed(str(e)) from None
        except OSError as e:
            log.error("put_failed", queue=name, error=str(e))
            raise PutFailed(f"journal write failed: {e.strerror}") from None
        if batch is None:
            return None
        if batch.done:
            if batch.error is not None:
                raise PutFailed(batch.error)
            return None
        unacked = self.unacked
        if not unacked or unacked[-1] is not batch:
            if unacked:
                oldest = unacked[0]
                if oldest.done:
                    if len(unacked) == 1:
                        unacked.clear()  # the usual case: the last put's batch, resolved
                    else:
                        unacked = self.unacked = [b for b in unacked if not b.done]
            unacked.append(batch)
            batch.add_done_callback(self.ready)
            if batch.behind is not None:
                # Behind a large write: STORED may go out before the batch resolves.
                batch.add_stored_callback(self.ready)
        if not want_reply:
            return None
        return pending_put(batch)

    def puts_pending(self) -> bool:
        """True while one of this session's puts is not acknowledged yet (acknowledged
        tickets are let go here and at the next put)."""
        unacked = self.unacked
        if unacked:
            if len(unacked) == 1:
                if unacked[0].done:
                    unacked.clear()  # the usual case: this session's only batch
            else:
                self.unacked = unacked = [b for b in unacked if not b.done]
        return bool(unacked)

    # --- fetch -----------------------------------------------------------------------------

    def fetch(self, f: Fetch, single: bool) -> int:
        """Run one get: its /abort, its /close, then its fetch; returns ``f.outcome``.

        ``single``: the only key of its request, which may wait (a key of a
        multi-key get never waits and never answers BUSY: it just has no item).
        Afterwards ``f.item`` is the item (ITEM), ``f.reply`` a reply the front
        end must place now (its /close's confirm, or a plain get's), and WAIT
        means the listener's ``wait_ended(f)`` follows.  QUIESCENT refuses the
        fetch only: the /close or /abort before it still happens, so a reliable
        reader's last item is not delivered twice after a drain.  So do more
        connections than ``connection_limit_refuse_reads`` (:meth:`read_refusal`
        says which refused).
        """
        server = self.server
        stats = self.stats
        traffic = self.traffic
        f.reply = None
        f.item = None
        fetch = f.open or not (f.close or f.abort)
        gate = self.gate
        refused = fetch and gate.reads_refused is not None
        try:  # create_queue_on_get off: a fetch never makes a queue (or reader) exist
            reader = self.queues.reader(f.name, False)
            if reader is None and fetch and not refused and server.config.create_queue_on_get:
                reader = self.queues.reader(f.name, True)
        except TooManyQueues:
            stats.queue_create_refusals += 1
            f.outcome = LIMITED if single else MISS  # one key of several: just no item
            return f.outcome
        if reader is None:
            if refused:
                f.outcome = REFUSED
                return REFUSED
            if fetch:
                traffic.get_misses += 1
                if f.peek:
                    traffic.cmd_peek += 1
                else:
                    traffic.cmd_get += 1
            f.outcome = MISS
            return MISS
        reads = self.open_reads.get(reader)
        if f.abort and reads:
            read = reads[0]
            del reads[0]  # not pop(0): compiled, that is a method call on a short list
            reader.abort([read])
        if f.close and reads:
            read = reads[0]
            del reads[0]
            f.reply = self._confirm_one(reader, read)
        if reads is not None and not reads and (refused or f.peek or not f.open):
            self._forget_empty(reader, reads)
            reads = None
        # A /close/open that emptied its line keeps it in open_reads for the item it opens
        # next (no delete and insert per loop); _forget_empty drops it if none comes.
        if refused:
            f.outcome = REFUSED
            return REFUSED
        if not fetch:
            f.outcome = MISS
            return MISS
        if f.peek:
            traffic.cmd_peek += 1
        else:
            traffic.cmd_get += 1
            if reads and (not f.open or len(reads) >= server.config.max_open_reads):
                # A plain get while a read is open, or too many open reads.
                f.outcome = BUSY
                return BUSY
        now = now_ms()
        item = reader.peek(now) if f.peek else reader.take(now)
        if item is not None:
            traffic.get_hits += 1
            if gate.latency_observer is not None:
                gate.latency_observer("get_hit", 0.0)
            self._hand_out(reader, f, item)
            f.outcome = ITEM
            return ITEM
        if not single or f.timeout <= 0 or self.no_wait:
            if reads is not None and not reads:
                self._forget_empty(reader, reads)
            traffic.get_misses += 1
            f.outcome = MISS
            return MISS
        # A /close/open that waits keeps its emptied line for the item the wait brings (no
        # delete and insert per item of a consumer that waits); _wait_done drops it if none.
        waiter = Waiter(self._wait_done_bound, server.loop, self.tick)
        reader.enter(waiter, f.timeout / 1000)
        self.waiting = waiter
        self.tick.wait_began()  # ended in _wait_done, which every end of the wait runs
        self.wait_fetch = f
        f.reader = reader
        f.behind = f.reply  # placed by the front end now; the item goes in after it
        f.started = monotonic()
        f.outcome = WAIT
        return WAIT

    def _forget_empty(self, reader: Reader, reads: list[OpenRead]) -> None:
        """A line of open reads emptied by a /close leaves open_reads (the next read opened
        reuses the list)."""
        del self.open_reads[reader]
        self.spare_reads = reads

    def _hand_out(self, reader: Reader, f: Fetch, item: QueueItem) -> None:
        """``item`` goes to the client: opened (/open), looked at (/peek) or consumed."""
        f.item = item
        if f.peek:
            return
        if self.trace is not None:
            self.trace.taken()
        if f.open:
            read = reader.open(item, self)
            reads = self.open_reads.get(reader)
            if reads is None:
                reads = self.spare_reads  # a /close/open's: the line its close emptied
                if reads is None:
                    reads = []
                else:
                    self.spare_reads = None
                self.open_reads[reader] = reads
            reads.append(read)
            behind = f.behind if f.behind is not None else f.reply
            if behind is not None:
                behind.undo_gives_back(read)  # a failed /close gives the new read back
            return
        ticket = reader.consume(item)
        if ticket is None or (ticket.done and ticket.error is None):
            return
        reply = self._hold(ticket, reader)
        reply.undo_returns(item)
        f.reply = reply

    def _wait_done(self, waiter: Waiter) -> None:
        """A wait ended (run after what ended it: the flush that served it, or on the loop's
        next turn): with an item, or None at its timeout (or when ended early)."""
        f = self.wait_fetch
        self.wait_fetch = None
        self.waiting = None
        self.tick.wait_ended()
        item = waiter.item  # None: timed out, or cancelled (the session ended the wait)
        reader = f.reader  # type: ignore[union-attr]
        f.reader = None  # type: ignore[union-attr]
        f.reply = None  # type: ignore[union-attr]
        behind = f.behind  # type: ignore[union-attr]
        if item is None or self.closed or (behind is not None and behind.failed):
            reads = self.open_reads.get(reader)
            if reads is not None and not reads:
                self._forget_empty(reader, reads)  # kept for the item the wait did not bring
        if self.closed or (behind is not None and behind.failed):
            if item is not None:
                reader.return_items([item])  # nobody to take it (or its /close failed)
            if not self.closed:
                f.outcome = GONE  # type: ignore[union-attr]
                self.listener.wait_ended(f)
            return
        observe = self.gate.latency_observer
        if observe is not None:  # the wait's length, per reader for a timeout
            observe(
                "get_hit" if item is not None else "get_timeout",
                monotonic() - f.started,  # type: ignore[union-attr]
                reader.full_name,
            )
        if item is None:
            self.traffic.get_misses += 1
            f.outcome = MISS  # type: ignore[union-attr]
        else:
            self.traffic.get_hits += 1
            if f.peek:  # type: ignore[union-attr]
                reader.return_items([item])  # a peek only looks: the item stays at the head
            self._hand_out(reader, f, item)  # type: ignore[arg-type]
            f.outcome = ITEM  # type: ignore[union-attr]
        self.listener.wait_ended(f)

    def stop_waiting(self) -> None:
        """Nobody may be listening any more: end the wait in progress (no item) and wait
        for nothing from now on (a half-closed client, a server that is stopping)."""
        self.no_wait = True
        waiting = self.waiting
        if waiting is not None and not waiting.done() and not self.authenticating:
            waiting.cancel()

    # --- monitor ---------------------------------------------------------------------------

    def monitor(self, f: Fetch, seconds: float, limit: int) -> bool:
        """Open reads of every item of ``f.name`` for ``seconds`` (at most ``limit``).

        Each item is opened and passed to the listener's ``monitor_item(f)``
        (``f.item``); the end is ``wait_ended(f)``: outcome MISS at its end, GONE
        when :meth:`stop_waiting` ended it early.  It is this
        session's wait.  Raises :class:`NotWritable` when fetches are refused and
        :class:`QueueRefused` for a new name beyond ``max_queues``.

        False when ``f.name`` has no reader (an alias, which holds nothing, or an
        unknown queue with ``create_queue_on_get`` off): nothing started or created,
        and the front end answers as for an empty queue at once.
        """
        self.check_readable()
        try:
            reader = self.queues.reader(f.name, self.server.config.create_queue_on_get)
        except TooManyQueues as e:
            self.stats.queue_create_refusals += 1
            raise QueueRefused(str(e)) from None
        if reader is None:
            f.outcome = MISS
            return False
        if self.no_wait:
            seconds = 0.0  # take what is there, wait for nothing
        f.reader = reader
        task = self.server.loop.create_task(_monitor(self, f, reader, seconds, limit))
        self.waiting = task
        self.wait_fetch = f
        task.add_done_callback(self._monitor_done)
        return True

    def monitor_open(self, f: Fetch, item: QueueItem) -> None:
        """One item of a monitor: opened by this session, then shown to the listener."""
        self.traffic.get_hits += 1
        if self.trace is not None:
            self.trace.taken()
        f.item = item
        f.outcome = ITEM
        read = f.reader.open(item, self)  # type: ignore[union-attr]
        reads = self.open_reads.get(f.reader)
        if reads is None:
            reads = self.open_reads[f.reader] = []
        reads.append(read)
        self.listener.monitor_item(f)

    def _monitor_done(self, task: asyncio.Task) -> None:
        f = self.wait_fetch
        if self.waiting is task:
            self.waiting = None
            self.wait_fetch = None
        if not task.cancelled() and task.exception() is not None:
            log.error("monitor_failed", error=str(task.exception()))
        if not self.closed and f is not None:
            # Ended early (the client half-closed, the server stops): each item went
            # out as a whole get reply already, and no END follows.
            f.outcome = GONE if task.cancelled() else MISS
            f.item = None
            self.listener.wait_ended(f)

    # --- confirms and aborts ---------------------------------------------------------------

    def confirm(self, name: str, count: int) -> PendingReply | None:
        """Confirm this session's ``count`` oldest open reads of ``name``.

        Returns the reply to hold until that is durable (None: answer now).
        Raises :class:`NoOpenRead` when none is open.
        """
        reader = self.queues.reader(name, create=False)
        reads = self.open_reads.get(reader) if reader is not None else None
        if not reads:
            raise NoOpenRead(name)
        confirmed = [reads.pop(0) for _ in range(min(count, len(reads)))]
        if not reads:
            del self.open_reads[reader]
        return self._confirm(reader, confirmed)  # type: ignore[arg-type]

    def abort(self, name: str, count: int) -> int:
        """Give this session's ``count`` oldest open reads of ``name`` back; how many.

        Raises :class:`NoOpenRead` when none is open.
        """
        reader = self.queues.reader(name, create=False)
        reads = self.open_reads.get(reader) if reader is not None else None
        if not reads:
            raise NoOpenRead(name)
        aborted = [reads.pop(0) for _ in range(min(count, len(reads)))]
        if not reads:
            del self.open_reads[reader]
        reader.abort(aborted)  # type: ignore[union-attr]
        return len(aborted)

    def open_count(self, name: str) -> int:
        """How many reads of ``name`` this session holds open."""
        reader = self.queues.reader(name, create=False)
        reads = self.open_reads.get(reader) if reader is not None else None
        return len(reads) if reads else 0

    def queue_stats(self, name: str) -> dict[str, int]:
        """The counters of queue ``name`` (Kestrel's per-queue stats); empty if it is missing."""
        reader = self.queues.reader(name, create=False)
        return reader.stats() if reader is not None else {}

    def hand_over(self, name: str) -> OpenRead:
        """The read this session opened last on ``name`` leaves it, for a holder that
        outlives the session (thrift's ids, :class:`~kestreld.session.open_ids.OpenIds`):
        closing the session no longer gives it back."""
        reader = self.queues.reader(name, create=False)
        reads = self.open_reads[reader]
        read = reads.pop()
        if not reads:
            del self.open_reads[reader]
        return read

    def _confirm_one(self, reader: Reader, read: OpenRead) -> PendingReply | None:
        """A ``/close``'s confirm: :meth:`_confirm` of one read, without the list."""
        ticket = reader.confirm(read)
        if ticket is None:
            return None
        reply = self._hold(ticket, reader)
        reply.undo_reopens(read)
        return reply

    def _confirm(self, reader: Reader, reads: list[OpenRead]) -> PendingReply | None:
        # A reader's confirms of one event-loop tick share one progress batch (it is
        # written on a later tick), so the reads of one request get one ticket.
        reply = None
        for read in reads:
            ticket = reader.confirm(read)
            if ticket is None:
                continue
            if reply is None or reply.ticket is not ticket:
                reply = self._hold(ticket, reader)
            reply.undo_reopens(read)
        return reply

    def _hold(self, ticket: Any, reader: Reader) -> PendingReply:
        reply = pending_confirm(ticket, reader)
        if not ticket.done and self.confirm_ticket is not ticket:
            self.confirm_ticket = ticket  # one callback per batch, however many replies
            ticket.add_done_callback(self.ready)
        return reply

    def reply_failed(self, reply: PendingReply) -> None:
        """A confirm could not be made durable: everything its request did is put back.

        The confirmed reads are open again (first in line to be confirmed),
        a read the same request opened goes back to its queue, and a plain
        get's item goes back to the head.
        """
        reader = reply.reader
        if reader is None:
            return  # a put: nothing was stored, nothing to undo
        give_back = reply.give_back
        if give_back is not None:
            reads = self.open_reads.get(reader)
            if reads is not None and give_back in reads:
                reads.remove(give_back)
                if not reads:
                    del self.open_reads[reader]
                reader.abort([give_back])
        for read in reversed(reply.reopen or ()):
            reader.reopen(read)
            if self.closed:
                reader.abort([read])
                continue
            reads = self.open_reads.get(reader)
            if reads is None:
                reads = self.open_reads[reader] = []
            reads.insert(0, read)
        if reply.taken is not None:
            reader.return_items([reply.taken])

    def open_read_timed_out(self, read: OpenRead) -> None:
        """``open_transaction_timeout`` gave ``read`` back to its queue: it leaves this
        session (a later confirm or close cannot reach it, nor count against the limit)."""
        reads = self.open_reads.get(read.reader)
        if reads is not None and read in reads:
            reads.remove(read)
            if not reads:
                del self.open_reads[read.reader]

    # --- queue administration --------------------------------------------------------------

    def delete(self, name: str) -> None:
        """Delete queue ``name`` (or reader ``q+r``).  Raises :class:`NotWritable`."""
        self.check_writable()
        self.queues.delete(name)

    def flush(self, name: str) -> PendingReply | None:
        """Drop every item of ``name``.  Raises :class:`NotWritable`.

        The flush is a ``READ_HEAD`` jump in the reader's progress file: the
        reply to hold until it is durable (None: answer now).
        """
        self.check_writable()
        return self._hold_durable(self.queues.flush(name))

    def flush_all(self) -> PendingReply | None:
        """Drop every item of every queue.  Raises :class:`NotWritable`.

        The reply to hold until every reader's jump is durable (None: answer now).
        """
        self.check_writable()
        return self._hold_durable(self.queues.flush_all())

    def _hold_durable(self, ticket: Any) -> PendingReply | None:
        # Nothing to undo if it fails (the items are gone from memory): the front end
        # answers its error line instead of the acknowledgement.
        if ticket is None or (ticket.done and ticket.error is None):
            return None
        return self._hold(ticket, None)

    def flush_expired(self, name: str) -> int:
        """Drop the expired items of ``name``; how many.  Raises :class:`NotWritable`."""
        self.check_writable()
        return self.queues.flush_expired(name)

    def flush_all_expired(self) -> int:
        """Drop the expired items of every queue; how many.  Raises :class:`NotWritable`."""
        self.check_writable()
        return self.queues.flush_all_expired()

    # --- the end ---------------------------------------------------------------------------

    def close(self, client_caused: bool) -> None:
        """The session ends: its wait ends and every open read goes back, in order.

        ``client_caused``: the client went away (reset, end of input) and
        replies still pending are lost with the connection; otherwise the
        front end has already sent every reply it promised.  Idempotent.
        """
        if self.closed:
            return
        self.closed = True
        self.no_wait = True
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.cancel()  # its callback gives a handed-off item back
        reads, self.open_reads = self.open_reads, {}
        given_back = 0
        for reader, queue in reads.items():
            given_back += len(queue)
            reader.abort(list(queue))
        if self.trace is not None:
            self.trace.end(given_back)  # session_ended, with what it did


async def _monitor(session: Session, f: Fetch, reader: Reader, seconds: float, limit: int) -> None:
    loop = session.server.loop
    deadline = loop.time() + seconds
    sent = 0
    while sent < limit and not session.closed:
        item = reader.take(now_ms())
        if item is None:
            remaining = deadline - loop.time()
            if remaining <= 0 or session.no_wait:
                break
            fut = reader.wait(loop, remaining)
            try:
                item = await fut
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled() and fut.result() is not None:
                    reader.return_items([fut.result()])
                raise
            if item is None:
                break
            if session.closed:
                reader.return_items([item])
                break
        session.monitor_open(f, item)
        sent += 1
