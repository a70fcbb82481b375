"""The memcache command table of a worker: each request runs where its queue lives.

A request naming a queue this worker owns runs here, through the ordinary handlers
(kestreld/frontends/memcache/commands.py).  One naming a queue another worker owns is
sent, as the client wrote it, over this client connection's own connection to the
owner's channel (kestreld/workers/channel.py), and the owner's reply takes the request's
place in the client's output: a held reply, like a ``STORED`` waiting for its journal,
so replies stay in request order whatever worker answers them.  The open reads made
there belong to that channel connection, which closes when the client leaves.

Box-wide commands (``stats``, ``dump_stats``, ``dump_config``, ``flush_all``,
``flush_all_expired``, ``reload``, ``status <s>``) go to every worker's channel, this
one's included, and their replies are combined; ``shutdown`` asks the supervisor, which
stops every worker.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

import structlog

from kestreld.frontends.memcache.commands import COMMANDS, parse_get, queue_name
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.frontends.memcache.framing import Command
from kestreld.frontends.memcache.replies import NOT_STORED, STORED, server_error
from kestreld.journal.batch import Batch
from kestreld.session.reply import PUT, PendingReply, pending_confirm
from kestreld.workers.box_stats import merge_dump, merge_stats
from kestreld.workers.channel import channel_path
from kestreld.workers.handoff import MAX_HANDOFFS, Arrival, Handoff, holds_nothing
from kestreld.workers.ownership import Ownership
from kestreld.workers.upstream import LIST, MONITOR, ONE, Upstream

log = structlog.get_logger("kestreld.workers")

CRLF = b"\r\n"
END = b"END\r\n"

#: The end of a failed put's error when the owner answered NOT_STORED (queue full).
REFUSED = "NOT_STORED"

#: Where the sets to an alias run.
ALIAS_WORKER = 0

#: Requests a client connection may have sent to one owner and not had answered yet.
MAX_IN_FLIGHT = 8

#: Commands that name one queue in their first argument: run by its owner.
_QUEUE_COMMANDS = (b"delete", b"flush", b"flush_expired", b"confirm", b"monitor")


def _gone(index: int) -> bytes:
    return server_error(f"worker {index} is not serving (it is restarting); try again")


def _quiet(command: Command, args: list[bytes]) -> bool:
    """The framing's noreply rule (memcached's): ``noreply`` last, where the command allows."""
    after = command.noreply_after
    return bool(after) and len(args) > after and args[-1] == b"noreply"


class Router:
    """Where each request of this worker's client connections runs."""

    def __init__(self, server: Any, ownership: Ownership, folder: str) -> None:
        self.server = server
        self.ownership = ownership
        self.index = ownership.index
        self.folder = folder
        #: Each client connection's connections to the other workers (opened on first use).
        self.upstreams: dict[Any, dict[int, Upstream]] = {}
        #: Requests this worker served itself / sent to an owner (the cost of crossing).
        self.local = 0
        self.crossed = 0
        #: The class of this worker's client connections.
        self.connection_class = RoutedConnection
        #: While a get runs here: the puts it sent to other workers (an abort's punts).
        self.moves: list[Batch] | None = None
        #: Hands client connections to the owners of their queues (worker_handoff).
        self.handoff: Handoff | None = None
        #: Client connections that had a request forwarded: they may hold something at an
        #: owner (an open read, a noreply set not run yet), so they never move.
        self.forwarded: set[Any] = set()

    # --- the table --------------------------------------------------------------------------

    def table(self) -> dict[bytes, Command]:
        """:data:`COMMANDS` with the queue and box-wide commands routed."""
        table = dict(COMMANDS)
        for word in (b"get", b"gets"):
            table[word] = self._line(word, self._get)
        for word in _QUEUE_COMMANDS:
            table[word] = self._line(word, self._named)
        routed_set = Command(
            b"set",
            self._set_block,
            shape=COMMANDS[b"set"].shape,
            noreply_after=COMMANDS[b"set"].noreply_after,
            accept=self._set_line,
            waits_for_sets=False,
        )
        table[b"set"] = routed_set
        table[b"stats"] = self._line(b"stats", self._stats)
        table[b"dump_stats"] = self._line(b"dump_stats", self._dump)
        table[b"dump_config"] = self._line(b"dump_config", self._dump_config)
        for word in (b"flush_all", b"flush_all_expired", b"reload", b"status"):
            table[word] = self._line(word, self._everywhere)
        table[b"shutdown"] = self._line(b"shutdown", self._shutdown)
        return table

    def _line(self, word: bytes, run: Callable[[Any, Command, list[bytes]], None]) -> Command:
        original = COMMANDS[word]
        command = Command(
            word,
            None,
            shape=original.shape,
            noreply_after=original.noreply_after,
            waits_for_sets=original.waits_for_sets,
        )
        command.run = lambda conn, args: run(conn, original, args)
        return command

    # --- queue requests ---------------------------------------------------------------------

    def _owner(self, raw: bytes) -> int:
        """The owner of the queue a key names (``q/open`` -> q); -1 for a name that is not
        legal: the local handler answers it with its error."""
        base = raw.split(b"/", 1)[0]
        if queue_name(base) is None:
            return -1
        if self.server.config.aliases and base.decode() in self.server.config.aliases:
            # An alias's sets are counted, and its destinations put to, on worker 0: the
            # admin port (worker 0's) and dump_stats then show its counters whole.
            return ALIAS_WORKER
        return self.ownership.owner(base)

    def _get(self, conn: Any, command: Command, args: list[bytes]) -> None:
        if len(args) < 2:
            command_run(command, conn, args)
            return
        owners = {self._owner(key) for key in args[1:]}
        if len(owners) > 1:
            owners.discard(-1)  # a bad key among others: answered by the owner of the rest
        if len(owners) > 1:
            self._get_spread(conn, command, args)
            return
        self._run(conn, command, args, owners.pop(), ONE)

    def _get_spread(self, conn: Any, command: Command, args: list[bytes]) -> None:
        """A get of several keys whose queues live on several workers: each worker gets its
        keys (this one too, over its own channel), and the items are put back in the
        order of the keys, as one server answers."""
        keys = args[1:]
        for key in keys:
            parsed = parse_get(key)
            if type(parsed) is bytes or parsed.open or parsed.timeout:  # type: ignore[union-attr]
                command_run(command, conn, args)  # its error, before anything is fetched
                return
        groups: dict[int, list[bytes]] = {}
        for key in keys:
            owner = self._owner(key)
            groups.setdefault(self.index if owner < 0 else owner, []).append(key)
        self.crossed += 1
        reply = self._hold(conn)
        replies: dict[int, bytes] = {}

        def answered(owner: int, raw: bytes | None) -> None:
            if raw is None:
                raw = _gone(owner)
            elif len(groups[owner]) == 1 and not raw.startswith(b"VALUE "):
                # A key alone at its owner got a lone get's answer (an error line for a
                # refused queue, say); among several keys it just has no item, as one
                # server answers.
                raw = END
            replies[owner] = raw
            if len(replies) == len(groups):
                _answer(conn, reply, in_key_order(keys, list(replies.values())))

        for owner, group in groups.items():
            request = b" ".join([args[0], *group]) + CRLF
            upstream = self._upstream(conn, owner)
            if upstream is None:
                answered(owner, None)
            else:
                upstream.request(request, ONE, lambda raw, o=owner: answered(o, raw))

    def _named(self, conn: Any, command: Command, args: list[bytes]) -> None:
        owner = self._owner(args[1]) if len(args) > 1 else -1
        shape = MONITOR if args[0].lower() == b"monitor" else ONE
        self._run(conn, command, args, owner, shape)

    def _run(self, conn: Any, command: Command, args: list[bytes], owner: int, shape: int) -> None:
        if owner < 0 or owner == self.index:
            self.local += 1
            word = args[0].lower()
            if shape == ONE and word in (b"get", b"gets"):
                self.run_waiting_for_moves(command, conn, args)
            elif word == b"delete":
                self.run_delete(command, conn, args)
            else:
                command_run(command, conn, args)
            return
        request = b" ".join(args) + CRLF
        # A monitor is a wait: it is sent on, never the reason to move (handed over with the
        # client's half-close right behind it, the owner ended it before its first item).
        if shape != MONITOR and self._hand(conn, owner, request):
            return
        self.crossed += 1
        self.forward(conn, owner, request, _quiet(command, args), shape)

    def _hand(self, conn: Any, owner: int, request: bytes) -> bool:
        """Hand ``conn`` to ``owner`` with ``request`` when it may move (handoff.py)."""
        handoff = self.handoff
        if (
            handoff is None
            or not self.server.config.worker_handoff
            or type(conn) is not RoutedConnection
            or conn.handoffs >= MAX_HANDOFFS
            or self.server.tls is not None  # TLS state cannot move: forwarded
            or not holds_nothing(conn, conn in self.forwarded)
        ):
            return False
        handoff.begin(conn, owner, request)
        return True

    def _set_line(self, conn: Any, args: list[bytes], size: int) -> bool:
        """A set's line is judged here wherever its queue lives (its size, its words, the
        status): a refused block is skipped as it arrives, never read to be sent on."""
        set_command = COMMANDS[b"set"]
        keep = set_command.accept(conn, args, size)  # type: ignore[misc]
        if keep and self._owner(args[1]) not in (-1, self.index):
            conn.take_put()  # the owner stores it (and counts it: not counted twice)
            conn.traffic.cmd_set -= 1
        return keep

    def _set_block(self, conn: Any, args: list[bytes], data: bytes) -> None:
        set_command = COMMANDS[b"set"]
        owner = self._owner(args[1])
        if owner < 0 or owner == self.index:
            self.local += 1
            self.run_set(set_command, conn, args, data)
            return
        quiet = _quiet(set_command, args)
        aliases = self.server.config.aliases
        if aliases and args[1].decode() in aliases:
            self.crossed += 1
            self._set_alias_elsewhere(conn, owner, args[:-1] if quiet else args, data, quiet)
            return
        request = b"".join((b" ".join(args), CRLF, data, CRLF))
        if self._hand(conn, owner, request):
            return
        self.crossed += 1
        self.forward(conn, owner, request, quiet, ONE)

    def _set_alias_elsewhere(
        self, conn: Any, owner: int, args: list[bytes], data: bytes, quiet: bool
    ) -> None:
        """A set to an alias, run by another worker: this client's next requests wait for
        its answer (``noreply`` too), as one server's gets wait for its sets: a get of a
        destination right after it finds the item, wherever that destination lives."""
        request = b"".join((b" ".join(args), CRLF, data, CRLF))
        upstream = self._upstream(conn, owner)
        if upstream is None:
            if not quiet:
                conn.out.append(_gone(owner))
            return
        if quiet:
            upstream.request(request, ONE, lambda raw: conn.replies_ready())
        else:
            reply = self._hold(conn)
            upstream.request(request, ONE, lambda raw: _answer(conn, reply, raw or _gone(owner)))
        conn.held = True

    def run_waiting_for_moves(self, command: Command, conn: Any, args: list[bytes]) -> None:
        """Run a get here; an abort among its keys may punt items to queues other workers
        own, and its reply is then sent only once every owner stored them: a get of the
        error queue right after the abort finds the item (a punt leaves the source only
        after the target has it)."""
        moves: list[Batch] = []
        self.moves = moves
        mark = len(conn.out)
        try:
            command_run(command, conn, args)
        finally:
            self.moves = None
        _hold_until_moved(conn, mark, moves)

    def run_delete(self, command: Command, conn: Any, args: list[bytes]) -> None:
        """Run a delete here; the box's ``max_queues`` budget has the queue back at once
        (a set of a new name right after it is not refused for a second)."""
        command_run(command, conn, args)
        box_queues = self.server.queues.box_queues
        if box_queues is not None:
            box_queues.publish(len(self.server.queues.queues))

    def run_set(self, command: Command, conn: Any, args: list[bytes], data: bytes) -> None:
        """Run a set here (a client's, or one another worker sent on).  A set to an alias
        that one destination refused is answered ``NOT_STORED`` only once the destinations
        other workers own stored theirs: a get of one of them right after the answer finds
        the item, as in one process."""
        mark = len(conn.out)
        aliases = self.server.config.aliases
        if not aliases or args[1].decode() not in aliases:
            command.run(conn, args, data)
            return
        moves: list[Batch] = []
        self.moves = moves
        try:
            command.run(conn, args, data)
        finally:
            self.moves = None
        if len(conn.out) == mark + 1:
            self._refused_is_not_stored(conn)
        _hold_until_moved(conn, mark, moves)

    @staticmethod
    def _refused_is_not_stored(conn: Any) -> None:
        """The held ``STORED`` of a set to an alias whose destinations live on other workers:
        a destination's owner that refused it makes it ``NOT_STORED``, as a refusal here
        does (the connection would render any failed put as a ``SERVER_ERROR``)."""
        put = conn.out[-1]
        if type(put) is bytes or put.kind != PUT:
            return
        reply = pending_confirm(Batch(), None)
        conn.out[-1] = reply

        def settled(batch: Batch) -> None:
            error = batch.error
            if error is None:
                raw = STORED
            elif error.endswith(REFUSED):
                raw = NOT_STORED
            else:
                raw = server_error(error)
            _answer(conn, reply, raw)

        put.ticket.add_done_callback(settled)

    def put_elsewhere(self, name: str, data: bytes, expire_time: int, error_count: int) -> Batch:
        """A put of this worker's queue side (an alias's destination, an error queue,
        expire_to_queue) to a queue another worker owns, with the item's error count and
        expiry (the channel's ``put_item``): the batch resolves once the owner answered
        STORED, or fails with its answer."""
        owner = self.ownership.owner(name)
        batch = Batch()
        if self.moves is not None:
            self.moves.append(batch)
        upstream = self._upstream(self, owner)  # the queue side's own connection to it
        if upstream is None:
            batch.resolve(f"worker {owner} is not serving")
            return batch
        request = b"".join(
            (
                b"put_item %s %d %d %d\r\n" % (name.encode(), error_count, expire_time, len(data)),
                data,
                CRLF,
            )
        )

        def stored(raw: bytes | None) -> None:
            if raw == STORED:
                batch.resolve()
            elif raw == NOT_STORED:
                batch.resolve(f"worker {owner}: {name} {REFUSED}")
            else:
                said = raw.decode("ascii", "replace").strip() if raw else "no answer"
                batch.resolve(f"worker {owner}: {said}")

        upstream.request(request, ONE, stored)
        return batch

    def forward(self, conn: Any, owner: int, request: bytes, quiet: bool, shape: int) -> None:
        """Send ``request`` to ``owner`` on ``conn``'s connection to it; its reply is held in
        ``conn``'s output in the request's place (nothing for ``noreply``)."""
        self.forwarded.add(conn)
        upstream = self._upstream(conn, owner)
        if upstream is None:
            if not quiet:
                conn.out.append(_gone(owner))
            return
        if quiet:
            upstream.request(request, shape, None)
        elif shape == MONITOR:
            self._forward_monitor(conn, owner, upstream, request)
        else:
            reply = self._hold(conn)
            # b"" is a reply: a monitor the client's half-close ended before any item.
            upstream.request(
                request,
                shape,
                lambda raw: _answer(conn, reply, _gone(owner) if raw is None else raw),
            )
        if upstream.in_flight() >= MAX_IN_FLIGHT:
            # Back-pressure: the client's next requests wait until the owner answered some
            # (and a client that does not read its replies pauses as it would here).
            conn.held = True

    @staticmethod
    def _forward_monitor(conn: Any, owner: int, upstream: Upstream, request: bytes) -> None:
        """A monitor of another worker's queue: each item is sent to the client as it
        comes, as a lone server sends it.  Its held reply takes the item and is sent; a
        new one, held in its place (before any later reply), waits for the next item or
        the END."""
        held = [Router._hold(conn)]

        def item(raw: bytes) -> None:
            if conn.closed:
                return  # the client left: its channel connection closes, its reads go back
            reply = held[0]
            following = pending_confirm(Batch(), None)
            conn.out.insert(conn.out.index(reply) + 1, following)  # unsent: still there
            conn.pending += 1
            held[0] = following
            _answer(conn, reply, raw)

        # b"" is its end too: a monitor the client's half-close ended (its items went).
        upstream.request(
            request,
            MONITOR,
            lambda raw: _answer(conn, held[0], _gone(owner) if raw is None else raw),
            item,
        )

    def _upstream(self, conn: Any, owner: int) -> Upstream | None:
        mine = self.upstreams.get(conn)
        if mine is None:
            mine = self.upstreams[conn] = {}
        upstream = mine.get(owner)
        if upstream is not None and not upstream.lost:
            return upstream
        upstream = Upstream(owner, channel_path(self.folder, owner))
        try:
            upstream.open(asyncio.get_running_loop())
        except OSError as e:
            log.warning("worker_unreachable", worker=owner, error=e.strerror or str(e))
            mine.pop(owner, None)
            return None
        mine[owner] = upstream
        return upstream

    @staticmethod
    def _hold(conn: Any) -> PendingReply:
        reply = pending_confirm(Batch(), None)
        conn.hold(reply)
        return reply

    def client_finished(self, conn: Any) -> None:
        """The client half-closed: its connections to the owners do too, so a wait there
        ends now (an item is never handed to a client that may be gone)."""
        mine = self.upstreams.get(conn)
        if mine:
            for upstream in mine.values():
                upstream.finish()

    def waits_elsewhere(self, conn: Any) -> bool:
        """True while ``conn`` has requests at an owner that are not answered yet."""
        return any(upstream.in_flight() for upstream in (self.upstreams.get(conn) or {}).values())

    def stopping(self) -> None:
        """The worker stops: every owner answers what it was sent, without waiting."""
        for mine in self.upstreams.values():
            for upstream in mine.values():
                upstream.finish()

    def connection_closed(self, conn: Any) -> None:
        """The client left: its connections to the owners close (its reads there go back)."""
        self.server.role.connections_changed(self.server)  # the box's max_connections
        self.forwarded.discard(conn)
        mine = self.upstreams.pop(conn, None)
        if mine:
            for upstream in mine.values():
                upstream.close()

    # --- box-wide commands ------------------------------------------------------------------

    def _everyone(
        self, conn: Any, request: bytes, shape: int, quiet: bool, combine: Callable
    ) -> None:
        """Send ``request`` to every worker; ``combine(replies)`` (in worker order, None for
        one that did not answer) is the client's reply.

        It goes over the client's own connections to the workers (this one's too), behind
        what the client sent them before, and the client's next request waits for the
        reply: ``status readonly`` then a ``set`` is refused, wherever the queue lives.
        """
        count = self.ownership.count
        replies: list[bytes | None] = [None] * count
        left = [count]
        reply = None if quiet else self._hold(conn)

        def answered(index: int, raw: bytes | None) -> None:
            replies[index] = raw
            left[0] -= 1
            if left[0] == 0:
                if reply is not None:
                    _answer(conn, reply, combine(replies))
                else:
                    conn.replies_ready()

        # The connection's own gate (what its unacknowledged sets use): requests after
        # this one wait until every worker ran it (``noreply`` too); replies_ready lifts it.
        conn.held = True
        for index in range(count):
            upstream = self._upstream(conn, index)
            if upstream is None:
                answered(index, None)
            else:
                upstream.request(request, shape, lambda raw, i=index: answered(i, raw))

    def _stats(self, conn: Any, command: Command, args: list[bytes]) -> None:
        index = self.index
        self._everyone(conn, b"stats\r\n", LIST, False, lambda r: merge_stats(r, index))

    def _dump(self, conn: Any, command: Command, args: list[bytes]) -> None:
        self._everyone(conn, b" ".join(args) + CRLF, LIST, False, merge_dump)

    def _dump_config(self, conn: Any, command: Command, args: list[bytes]) -> None:
        if len(args) > 1:  # named: the config is the same in every worker
            command_run(command, conn, args)
            return
        self._everyone(conn, b"dump_config\r\n", LIST, False, merge_dump)

    def _everywhere(self, conn: Any, command: Command, args: list[bytes]) -> None:
        """``flush_all``, ``flush_all_expired``, ``reload``, ``status``: every worker runs it.
        ``status`` alone only reads; the reply is this worker's unless another failed."""
        if args[0].lower() == b"status" and len(args) < 2:
            command_run(command, conn, args)
            return
        index = self.index
        word = args[0].lower()

        def combine(replies: list[bytes | None]) -> bytes:
            if word == b"flush_all_expired":
                counts = [int(r) for r in replies if r is not None and r.strip().isdigit()]
                if len(counts) == len(replies):
                    return b"%d\r\n" % sum(counts)
            for i, raw in enumerate(replies):
                if raw is None:
                    return _gone(i)
                if raw.startswith((b"SERVER_ERROR", b"CLIENT_ERROR", b"ERROR")):
                    return raw
            return replies[index] or _gone(index)

        quiet = _quiet(command, args)
        # Sent without its ``noreply``: each worker's answer says it ran (the client's next
        # request waits for that), and the client is sent nothing.
        sent = args[:-1] if quiet else args
        self._everyone(conn, b" ".join(sent) + CRLF, ONE, quiet, combine)

    def _shutdown(self, conn: Any, command: Command, args: list[bytes]) -> None:
        """The supervisor stops every worker, once the owners answered what this client
        sent them before (as one server would have run it before stopping)."""
        conn.close()  # nothing after it runs; what it was promised is still sent
        mine = self.upstreams.get(conn) or {}
        busy = [upstream for upstream in mine.values() if upstream.in_flight()]
        left = [len(busy)]

        def stop(raw: bytes | None = None) -> None:
            left[0] -= 1
            if left[0] <= 0:
                log.info("shutdown_requested", reason="shutdown command")
                os.kill(os.getppid(), signal.SIGTERM)

        if not busy:
            stop()
        for upstream in busy:
            upstream.request(b"version\r\n", ONE, stop)  # answered after what it waits on

    def stats(self) -> list[tuple[str, object]]:
        """This worker's lines of its own ``stats`` (the box's merges them)."""
        return [
            ("worker", self.index),
            ("worker_requests_local", self.local),
            ("worker_requests_crossed", self.crossed),
            *(self.handoff.stats() if self.handoff is not None else ()),
        ]

    def close(self) -> None:
        for mine in self.upstreams.values():
            for upstream in mine.values():
                upstream.close()
        self.upstreams.clear()


class RoutedConnection(MemcacheConnection):
    """A client connection of a worker: its half-close reaches the owners it used; one
    handed over from another worker (``arrival``) runs the bytes it brought first."""

    __slots__ = ("handoffs", "arrival")

    def __init__(self, server: Any, table: dict[bytes, Command], unknown: Command) -> None:
        super().__init__(server, table, unknown)
        self.handoffs = 0
        self.arrival: Arrival | None = None

    def too_many(self) -> bool:
        # One handed over was admitted where it was accepted, and is counted there until
        # it is counted here: it is never refused for itself.
        return self.arrival is None and not self.server.role.admits_client(self.server)

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        arrival = self.arrival
        if arrival is None:
            return
        self.arrival = None
        if self.closed:
            return  # refused (too many connections): it closes, having held nothing
        # Counted once on the box: where it was accepted (its bytes too); counted here now.
        self.stats.total_connections -= 1
        self.server.role.connections_changed(self.server)
        self.handoffs = arrival.handoffs
        if arrival.unread:
            self.traffic.bytes_read -= len(arrival.unread)
            self.data_received(arrival.unread)
        if self.read_paused:
            # Its bytes paused it (replies the client is not reading): but the loop starts
            # reading a connection once connection_made returns, whatever was paused in it,
            # so the pause is asked again then (else a client that never reads has all it
            # sends read and held).
            asyncio.get_running_loop().call_soon(self._pause_again)

    def _pause_again(self) -> None:
        if self.read_paused and not self.closed and self.transport is not None:
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:
        keep = super().eof_received()
        if self.closing or (not self.framing.holds_input() and not self.held):
            # Nothing of the client's is left to run (or will run: a quit was judged): a
            # wait at an owner ends now.  (With requests still to judge, they are sent on
            # first, and close() says it once they are.)
            self.server.router.client_finished(self)
        return keep

    def close(self) -> None:
        if self.eof and not self.closing:
            # Every request the half-closed client sent is judged now: a wait at an owner
            # ends (eof_received could not say so while requests were still held here).
            self.server.router.client_finished(self)
        super().close()
        if not self.eof and not self.closed and self.server.router.waits_elsewhere(self):
            # A quit behind a request crossed to an owner, as one server would, still hears
            # the client's half-close (closing stops reading), which ends a wait there.
            self.read_paused = False
            self.transport.resume_reading()


def in_key_order(keys: list[bytes], replies: list[bytes]) -> bytes:
    """One multi-key get reply from the replies of its parts: the items in key order, then
    END; the first error line of a part instead, when one failed."""
    items: dict[bytes, list[bytes]] = {}
    for raw in replies:
        pos = 0
        while pos < len(raw):
            eol = raw.index(b"\r\n", pos)
            if not raw.startswith(b"VALUE ", pos):
                if raw[pos:eol] != b"END":
                    return raw[pos : eol + 2]
                pos = eol + 2
                continue
            words = raw[pos:eol].split()
            end = eol + 2 + int(words[3]) + 2
            items.setdefault(words[1], []).append(raw[pos:end])
            pos = end
    out = []
    for key in keys:
        found = items.get(key)
        if found:
            out.append(found.pop(0))
    out.append(END)
    return b"".join(out)


def command_run(command: Command, conn: Any, args: list[bytes]) -> None:
    """Run the table's own handler of ``command`` here."""
    command.run(conn, args)


def _answer(conn: Any, reply: PendingReply, raw: bytes) -> None:
    """The held ``reply`` is ``raw``: send it (and what waited behind it)."""
    reply.parts.append(raw)  # type: ignore[union-attr]
    reply.ticket.resolve()
    conn.replies_ready()


def _hold_until_moved(conn: Any, mark: int, moves: list[Batch]) -> None:
    """Hold the replies ``conn`` has from ``mark`` on until every put another worker was
    sent meanwhile (``moves``) is stored there (the reply itself may not wait for them: a
    get's items, a refused alias set's ``NOT_STORED``)."""
    waiting = [batch for batch in moves if not batch.done]
    if not waiting:
        return
    gate = pending_confirm(Batch(), None)  # holds the replies after it, empty itself
    conn.out.insert(mark, gate)
    conn.pending += 1
    left = [len(waiting)]

    def stored(batch: Batch) -> None:
        left[0] -= 1
        if left[0] == 0:
            gate.ticket.resolve()
            conn.replies_ready()

    for batch in waiting:
        batch.add_done_callback(stored)
