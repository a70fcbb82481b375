"""A FIFO that consumers can wait on: libkestrel's ConcurrentBlockingQueue, in asyncio form.

Items live in a deque; waiting consumers are waiters in a second deque, oldest
first.  A put hands the item straight to the oldest live waiter (the airport
taxi line) and only queues it when nobody waits.  A waiter that timed out or
whose connection died is done and is skipped, so it never swallows
an item; such dead waiters are pruned once they make up half the line, so a
long-waiting get cannot make short polls behind it pile up.  Everything runs
on the event loop thread: no locks are needed.

A waiting get is a :class:`Waiter`, the part of a future it needs without asyncio's
machinery (a monitor, which awaits, still waits with a future).  Waiters whose waits ended
together (served, timed out) run later, all of one line's together, from one callback: on
the loop's next turn, as a future's callbacks would, or, for a waiter given the server's
:class:`~kestreld.journal.tick.Tick`, once the batch or flush that served it is over (the
same turn: no extra poll of the loop between a set and the get it serves).

Timed waits share one timer per queue, armed for the earliest deadline (a
``/t=`` get that is served leaves the line of deadlines with the hand-off, as
the oldest in it; one ended by its session lingers until the timer fires or
the line is pruned): a wait costs no timer of its own, which is most of what a
blocked ``get q/t=...`` would otherwise pay for its timeout.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any

try:
    import cython

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

# Items are QueueItems; the type stays open so the class can be a compiled cdef class
# (blocking.pxd), which cannot derive from typing.Generic.
T = Any

#: Dead waiters tolerated before the line is pruned (then: once they are half of it).
PRUNE_AFTER = 32
#: A deadline this close (seconds) counts as reached: the loop's clock has millisecond
#: steps, and a timer must never re-arm itself for a deadline a fraction of a step away.
DEADLINE_SLACK = 0.001


#: A waiter's states.
PENDING = 0
SERVED = 1
CANCELLED = 2


class Waiter:
    """One consumer's place in a line: ``callback(waiter)`` runs once, after the wait ends
    (served with ``item``, None at its timeout, or cancelled), never inside what ended it."""

    __slots__ = ("callback", "loop", "tick", "state", "item")

    def __init__(self, callback: Any, loop: asyncio.AbstractEventLoop, tick: Any = None) -> None:
        self.callback = callback
        self.loop = loop
        #: The server's Tick: a served wait's callback runs when its batch or flush is over.
        self.tick = tick
        self.state = PENDING
        self.item: T | None = None

    def done(self) -> bool:
        return self.state != PENDING

    def cancelled(self) -> bool:
        return self.state == CANCELLED

    def serve(self, item: T | None) -> None:
        """The wait ends with ``item`` (None: its timeout); its line runs the callback."""
        if self.state != PENDING:
            raise asyncio.InvalidStateError("the wait has ended already")
        self.state = SERVED
        self.item = item

    def cancel(self) -> bool:
        """End the wait without an item (its session ends); False when it ended already."""
        if self.state != PENDING:
            return False
        self.state = CANCELLED
        self.loop.call_soon(self.callback, self)
        return True


class BlockingQueue:
    __slots__ = (
        "items",
        "_push",
        "_pop",
        "waiters",
        "_wait_push",
        "_wait_pop",
        "dead",
        "deadlines",
        "_deadline_push",
        "_deadline_pop",
        "timer",
        "timer_at",
        "loop",
        "_create_future",
        "_time",
        "served",
    )

    def __init__(self) -> None:
        self.items: deque[T] = deque()
        if COMPILED:
            # Its items (compiled QueueItems: numbers and bytes) are in no reference cycle
            # and are not tracked; the line itself need not be either: a tracked deque of a
            # million items made every full collection visit each (9 ms held the loop).
            PyObject_GC_UnTrack(cython.cast(cython.p_void, self.items))  # noqa: F821 - .pxd
        # The deque's append and popleft, bound once: the verbs of every put and get.
        self._push = self.items.append
        self._pop = self.items.popleft
        self.waiters: deque[asyncio.Future[T | None]] = deque()
        self.dead = 0  # waiters resolved since the last prune (some may be gone already)
        #: (deadline, waiter) of timed waits, in the order they began (served ones linger).
        self.deadlines: deque[tuple[float, asyncio.Future[T | None]]] = deque()
        # The two lines' verbs, bound once too (the lines are pruned in place, never replaced).
        self._wait_push = self.waiters.append
        self._wait_pop = self.waiters.popleft
        self._deadline_push = self.deadlines.append
        self._deadline_pop = self.deadlines.popleft
        self.timer: asyncio.TimerHandle | None = None  # the one timer: the earliest deadline
        self.timer_at = 0.0
        self.loop: asyncio.AbstractEventLoop | None = None
        # The loop's create_future and time, bound at the first wait (one loop runs a server).
        self._create_future: Any = None
        self._time: Any = None
        #: Waiters whose waits ended this turn: their callbacks run on the next (one callback).
        self.served: list[Waiter] = []

    def __len__(self) -> int:
        return len(self.items)

    def __bool__(self) -> bool:
        return bool(self.items)

    def hand_off(self, item: T) -> bool:
        """Give ``item`` to the oldest live waiter; False when nobody is waiting."""
        waiters = self.waiters
        while waiters:
            fut = self._wait_pop()
            if type(fut) is Waiter:  # a get's: its own verbs, C calls when compiled
                waiter = fut
                if waiter.state != PENDING:
                    continue
                self._end(waiter, item)
            elif fut.done():
                continue
            else:
                fut.set_result(item)  # a monitor's future
            deadlines = self.deadlines
            # Timed waits began in the order of the line, and the oldest live waiter was
            # just served: its deadline and any older ones are done, at the head.
            while deadlines and deadlines[0][1].done():
                self._deadline_pop()
            return True
        return False

    def put(self, item: T) -> None:
        """Append at the tail (no hand-off: the caller offered it to waiters first)."""
        self._push(item)

    def put_first(self, item: T) -> None:
        """Put ``item`` back at the head (no hand-off)."""
        self.items.appendleft(item)

    def put_head(self, items: Iterable[T]) -> None:
        """Return items to the head in their original order (no hand-off)."""
        self.items.extendleft(reversed(list(items)))

    def poll(self) -> T | None:
        return self._pop() if self.items else None

    def peek(self) -> T | None:
        return self.items[0] if self.items else None

    def clear(self) -> None:
        self.items.clear()

    def wait(
        self, loop: asyncio.AbstractEventLoop, timeout: float | None
    ) -> asyncio.Future[T | None]:
        """A future for the next item; resolved with None after ``timeout`` seconds."""
        if loop is not self.loop:
            self._bind(loop)
        fut: asyncio.Future[T | None] = self._create_future()
        self._line_up(fut, timeout)
        return fut

    def enter(self, waiter: Waiter, timeout: float | None) -> None:
        """``waiter`` waits for the next item; it ends with None after ``timeout`` seconds."""
        if waiter.loop is not self.loop:
            self._bind(waiter.loop)
        self._line_up(waiter, timeout)

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop's verbs, bound at the first wait (one loop runs a server)."""
        self.loop = loop
        self._create_future = loop.create_future
        self._time = loop.time
        self.served = []  # any left belong to a loop that stopped: they can never run

    def _end(self, waiter: Waiter, item: T | None) -> None:
        """``waiter``'s wait ends with ``item``: its callback runs with those of every other
        wait of this line ending meanwhile, once the tick's batch or flush is over (or on the
        loop's next turn)."""
        waiter.serve(item)
        served = self.served
        served.append(waiter)
        if len(served) == 1:
            tick = waiter.tick
            if tick is not None:
                tick.soon(self._run_served)
            else:
                self.loop.call_soon(self._run_served)  # type: ignore[union-attr]

    def _resolve(self, fut: Any, item: T | None) -> None:
        """End a live wait of the line, a get's waiter or a monitor's future (the cold paths:
        a hand-off serves a waiter through its own verbs)."""
        if type(fut) is Waiter:
            self._end(fut, item)
        else:
            fut.set_result(item)

    def _run_served(self) -> None:
        served = self.served
        self.served = []
        for waiter in served:
            try:
                waiter.callback(waiter)
            except Exception as e:  # as the loop reports a failing callback; the rest still run
                self.loop.call_exception_handler(  # type: ignore[union-attr]
                    {"message": "the end of a wait failed", "exception": e, "waiter": waiter}
                )

    def _line_up(self, waiter: Any, timeout: float | None) -> None:
        self._wait_push(waiter)
        if timeout is not None:
            deadline = self._time() + timeout
            self._deadline_push((deadline, waiter))
            if self.timer is None or deadline < self.timer_at:
                self._arm(deadline)

    def _arm(self, deadline: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer_at = deadline
        self.timer = self.loop.call_at(deadline, self._expire_due)  # type: ignore[union-attr]

    def _expire_due(self) -> None:
        """The timer fired: time out every waiter whose deadline came, re-arm for the next."""
        self.timer = None
        now = self.loop.time() + DEADLINE_SLACK  # type: ignore[union-attr]
        left: list[tuple[float, asyncio.Future[T | None]]] = []
        earliest = 0.0
        for entry in list(self.deadlines):  # a copy: _note_dead may prune the line meanwhile
            fut = entry[1]
            if fut.done():
                continue  # served, cancelled or already timed out: dropped
            deadline = entry[0]
            if deadline <= now:
                self._resolve(fut, None)
                self._note_dead()  # it lingers in the line of waiters until a hand-off or a prune
                continue
            left.append(entry)
            if not earliest or deadline < earliest:
                earliest = deadline
        self.deadlines.clear()  # in place: _deadline_push and _deadline_pop are its methods
        self.deadlines.extend(left)
        if left:
            self._arm(earliest)

    def _note_dead(self) -> None:
        """A waiter resolved and lingers in a line: prune the dead ones now and then (a waiter
        cancelled by its session lingers too, and goes with the next prune or the timer)."""
        self.dead += 1
        if self.dead > PRUNE_AFTER and self.dead * 2 > len(self.waiters) + len(self.deadlines):
            self.dead = 0
            waiters = [f for f in self.waiters if not f.done()]
            deadlines = [e for e in self.deadlines if not e[1].done()]
            self.waiters.clear()  # in place, as in _expire_due
            self.waiters.extend(waiters)
            self.deadlines.clear()
            self.deadlines.extend(deadlines)

    def live_waiters(self) -> int:
        return sum(1 for f in self.waiters if not f.done())

    def wake_all(self) -> None:
        """Resolve every waiter with None (the queue was deleted or the server stops)."""
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                self._resolve(fut, None)
        self.deadlines.clear()
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
