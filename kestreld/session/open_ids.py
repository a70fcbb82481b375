"""Reads held under a server-wide id, outliving the session that opened them (Kestrel's thrift).

A thrift ``get`` with ``auto_abort_msec > 0`` opens its items and returns
each with an id; any connection may confirm or abort them by that id, and the
client's disconnect does not give them back: the auto-abort timer does, after
``auto_abort_msec``, unless they were confirmed first.  Ids are unique while
the server runs (they start again at 1 after a restart, when every read that
was open is back in its queue anyway: an open read is never journaled as
consumed).

A read that ``open_transaction_timeout`` (or a deleted queue) gave back first
stays listed until its id is confirmed, aborted or its timer fires, and
counts as not open then (its ``finished`` flag is set).

Per-session counts (how many ids a session opened on a queue and are still
open) let the front end apply ``max_open_reads`` per session and queue, as
Kestrel counted them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from kestreld.queues.reader import OpenRead

log = structlog.get_logger("kestreld.session")

__all__ = ["OpenIds"]


@dataclass(slots=True, eq=False)
class _Held:
    read: OpenRead
    name: str  # the queue (or ``q+reader``) it was fetched from
    holder: Any  # the session that opened it (for its count), or None once it ended
    timer: asyncio.TimerHandle | None = None
    deadline: float = 0.0  # loop time of the auto-abort


class OpenIds:
    """Every read opened under an id, server-wide; the auto-abort timers."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.loop = loop
        self.next_id = 1
        self.held: dict[int, _Held] = {}
        self.counts: dict[tuple[Any, str], int] = {}  # (session, queue) -> ids still open

    def __len__(self) -> int:
        return len(self.held)

    def count(self, session: Any, name: str) -> int:
        """How many ids ``session`` opened on queue ``name`` that are still open."""
        return self.counts.get((session, name), 0)

    def adopt(self, read: OpenRead, name: str, session: Any, auto_abort_ms: int) -> int:
        """Hold ``read`` (opened by ``session``) under a new id, aborted after
        ``auto_abort_ms`` unless confirmed; returns the id."""
        loop = self.loop or asyncio.get_running_loop()
        self.loop = loop
        id_ = self.next_id
        self.next_id += 1
        held = _Held(read, name, session)
        held.deadline = loop.time() + auto_abort_ms / 1000
        held.timer = loop.call_at(held.deadline, self._expire, id_)
        self.held[id_] = held
        key = (session, name)
        self.counts[key] = self.counts.get(key, 0) + 1
        return id_

    def confirm(self, name: str, ids: set[int]) -> asyncio.Future:
        """Confirm the open ids of queue ``name``: a future of how many, resolved once
        their confirms are durable (a confirm that fails leaves its id open)."""
        loop = self.loop or asyncio.get_running_loop()
        self.loop = loop
        done: asyncio.Future = loop.create_future()
        count = 0
        waiting: list[tuple[int, _Held, Any]] = []
        for id_ in ids:
            held = self._release(id_, name)
            if held is None:
                continue
            ticket = held.read.reader.confirm(held.read)
            if ticket is None or (ticket.done and ticket.error is None):
                count += 1
            else:
                waiting.append((id_, held, ticket))
        if not waiting:
            done.set_result(count)
            return done
        remaining = [len(waiting)]
        confirmed = [count]

        def settled(id_: int, held: _Held, ticket: Any) -> None:
            if ticket.error is None:
                confirmed[0] += 1
            else:
                self._reopen(id_, held)
            remaining[0] -= 1
            if not remaining[0] and not done.done():
                done.set_result(confirmed[0])

        for id_, held, ticket in waiting:
            ticket.add_done_callback(lambda t, i=id_, h=held: settled(i, h, t))
        return done

    def abort(self, name: str, ids: set[int]) -> int:
        """Give the open ids of queue ``name`` back to the head of their queue; how many."""
        count = 0
        for id_ in sorted(ids):
            held = self._release(id_, name)
            if held is not None:
                held.read.reader.abort([held.read])
                count += 1
        return count

    def session_ended(self, session: Any) -> None:
        """``session`` is gone: its ids stay open (until confirmed or auto-aborted), but
        no longer count against a session."""
        for key in [k for k in self.counts if k[0] is session]:
            del self.counts[key]
        for held in self.held.values():
            if held.holder is session:
                held.holder = None

    def close(self) -> None:
        """The server stops: every held read goes back to its queue."""
        for id_ in sorted(self.held):
            held = self._release(id_, self.held[id_].name)
            if held is not None:
                held.read.reader.abort([held.read])

    def _expire(self, id_: int) -> None:
        held = self.held.get(id_)
        if held is None:
            return
        held.timer = None
        if self._release(id_, held.name) is None:
            return
        log.debug("auto_abort", queue=held.name, id=id_)
        held.read.reader.abort([held.read])

    def _release(self, id_: Any, name: str) -> _Held | None:
        held = self.held.get(id_)
        if held is None or held.name != name:
            return None
        del self.held[id_]
        if held.timer is not None:
            held.timer.cancel()
        if held.holder is not None:
            key = (held.holder, held.name)
            left = self.counts.get(key, 0) - 1
            if left > 0:
                self.counts[key] = left
            else:
                self.counts.pop(key, None)
        if held.read.finished:
            return None  # given back meanwhile (the queue was deleted, or timed out)
        return held

    def _reopen(self, id_: int, held: _Held) -> None:
        """A confirm was not durable: the read is open again under its id, same deadline."""
        reader = held.read.reader
        reader.reopen(held.read)
        loop = self.loop
        assert loop is not None
        self.held[id_] = held
        if held.holder is not None:
            key = (held.holder, held.name)
            self.counts[key] = self.counts.get(key, 0) + 1
        held.timer = loop.call_at(held.deadline, self._expire, id_)
