"""Busy polling: after answering a lone client, keep the event loop awake for its next
request, when that costs less CPU than sleeping.

A server that sleeps in ``epoll_wait`` between two requests of a client pays for waking up
on every request: an interrupt, a context switch, and a request run on a CPU whose caches
went cold meanwhile.  At one connection on a virtual machine that costs more server CPU
than the request itself (BENCHMARKS.md, issue 28: about 30 µs against 7).  A server that
polls for a moment before it sleeps reads the next request as soon as it arrives, on a warm
CPU; but a poll costs its whole length in CPU, so it pays only when the client's next
request comes sooner than a wake-up costs.  With a client that sends its next request
within about 20 µs of the reply, server CPU per request falls by up to a fifth and the
rate doubles or more; with one that takes 30 µs or more (its own event loop, other
connections to serve) a poll costs more than the wake-up it spares.

So the server measures which way is cheaper for the client it has, and takes it.  Answers
come in periods of :data:`PERIOD`, each opening with a window: its first :data:`EXPLORE`
answers go the way not preferred (poll after each, or sleep), the next :data:`EXPLORE`
the preferred way, and each of those answers reads the thread's CPU clock: the CPU from
one answer to the next, the whole cycle of a request (the poll or the wake-up, the read,
the work, the reply), is what each way costs.  At the end of the window the two blocks' means (less each
block's dearest cycle, where a checkpoint or a collection landed) give the difference,
and a running average of the differences (:data:`WEIGHT` for the newest) decides the
preferred way until the next window.  Both blocks run back to back, so what else the
machine does weighs on both alike; the first :data:`SETTLE` cycles after a change of way
are not counted (they still carry the other way's state).  The price of knowing: a clock
reading (a system call) on 33 answers in 512, and the other way on 16; while one way stays
far cheaper (by a quarter of a cycle or more) the windows thin out, one period in two,
three, five, up to one in nine.  Polling is taken up only when it saves at least
:data:`MARGIN` of a cycle, and given up when it saves nothing: near a tie the server
sleeps.  Between two windows a sleeping server does nothing more per answer than count it.

``busy_poll_us`` (server config) is how long a poll may last (0: never poll; left out,
:data:`DEFAULT_LIMIT_US`).  Only a lone client is polled for (the server's only
connection, or the only one not waiting for an item): with several, the next read comes
soon anyway, and on a box they share the clients need the CPU a poll would take.  The loop sees when the next request arrives: within the
limit, the poll caught it; a poll that ran out was wasted, and the next polls are skipped,
one after the first miss in a row, then two, four, up to 64, before one is tried again.  A
request that arrives within the limit while polls are skipped (measured from the answer, so
a late wake-up counts against it) ends the back-off.  An idle server, or clients pausing
longer than the limit, cost at most one poll in 65 answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kestreld.journal.clock import monotonic, thread_cpu

try:
    import cython

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

#: ``busy_poll_us`` when the config leaves it out: 30 µs in the compiled build.  The plain
#: build does not poll unless asked: there a request's own Python costs more than the
#: wake-up a poll spares, and polling measured no gain (BENCHMARKS.md, issue 28).
DEFAULT_LIMIT_US = 30 if COMPILED else 0

#: Polls skipped after the longest run of polls that ran out (then one is tried again).
MAX_BACK_OFF = 64
#: Answers per period of the choice between polling and sleeping (a window, then the rest).
PERIOD = 512
#: Answers of a window that go the way not preferred, and answers of the preferred way
#: measured right after them.
EXPLORE = 16
#: Cycles not counted after a change of way.
SETTLE = 2
#: Weight of the newest window's difference in the running average.
WEIGHT = 0.25
#: Polling is taken up when it saves at least this share of a sleeping cycle (and given up
#: as soon as it saves nothing): near a tie, sleeping, which spins nothing, stays.
MARGIN = 0.02
#: Most periods without a window while one way stays far cheaper (a quarter of a cycle or
#: more): after such a window the next is skipped, then two, four, up to this many.
MAX_REST = 8


class BusyPoll:
    """The poll after the replies of one server's event loop (one instance per server)."""

    __slots__ = (
        "limit",
        "done",
        "polled",
        "polling",
        "back_off",
        "skip",
        "caught",
        "ran_out",
        "period",
        "explore",
        "left",
        "step",
        "prefer",
        "edge",
        "windows",
        "rest",
        "cpu_at",
        "tried",
        "kept",
        "cpu_clock",
        "_call_soon",
        "_poll_bound",
    )

    def __init__(self, limit_us: int) -> None:
        self.limit = max(0, limit_us) / 1e6  # seconds a poll lasts at most; 0: never poll
        self.done = 0.0  # when the last read's requests were answered (0: not since then)
        self.polled = False  # a poll followed that answer
        self.polling = False  # the poll callback is on the loop
        self.back_off = 0  # polls to skip after the next that runs out (0: none ran out)
        self.skip = 0  # polls still to skip
        self.caught = 0  # polls the next request arrived in (stats)
        self.ran_out = 0  # polls that ended without one (stats)
        self.period = PERIOD
        self.explore = EXPLORE
        self.left = 0  # answers to a lone client until the next window (0: it begins)
        self.step = 0  # answers of the current window so far
        self.prefer = False  # polling is the cheaper way (sleeping until measured)
        #: Running average of (CPU per cycle polling) - (sleeping), seconds.
        self.edge = 0.0
        self.windows = 0  # windows measured
        self.rest = 0  # periods without a window after the last (ways far apart)
        self.cpu_at = 0.0  # the thread's CPU clock at the last measured answer (0: none)
        self.tried: list[float] = []  # this window's cycles of the way not preferred
        self.kept: list[float] = []  # and of the preferred way
        #: The CPU clock (a function returning seconds); None: the thread's own.
        self.cpu_clock: Any = None
        self._call_soon: Any = None
        self._poll_bound: Any = self._poll

    def arrived(self, now: float) -> None:
        """Requests arrived at ``now``: did the poll since the last answer catch them?"""
        done = self.done
        if done == 0.0:
            return
        self.done = 0.0
        if now - done <= self.limit:
            if self.polled:
                self.caught += 1
            self.back_off = self.skip = 0  # caught, or would have been
        elif self.polled:  # the poll ran out: skip the next ones, twice as many in a row
            self.ran_out += 1
            back_off = self.back_off * 2 if self.back_off else 1
            self.back_off = back_off if back_off < MAX_BACK_OFF else MAX_BACK_OFF
            self.skip = self.back_off

    def served(self, lone: bool) -> None:
        """The requests read are answered: poll for the next ones, when they came from the
        server's only client (others connected but waiting for an item do not count),
        polling is the way chosen for this answer, and polls are not backing off."""
        if self.limit == 0.0:
            return
        if not lone:
            # Several clients: the next read is soon anyway, and on a box they share the
            # clients need the CPU a poll would take.  Nothing to measure either.
            self.done = 0.0
            self.polled = False
            self.cpu_at = 0.0
            return
        left = self.left - 1
        if left > 0:
            self.left = left
            if not self.prefer:  # sleeping between two windows: nothing to note
                self.polled = False
                return
            poll = True
        else:
            step = self.step
            poll = self.prefer != (step < self.explore)  # the way not preferred first
            self._measure(step)
        self.done = monotonic()
        if not poll:
            self.polled = False
            return
        if self.skip:
            self.skip -= 1
            self.polled = False
            return
        self.polled = True
        if not self.polling:
            call_soon = self._call_soon
            if call_soon is None:
                try:
                    call_soon = self._call_soon = asyncio.get_running_loop().call_soon
                except RuntimeError:
                    self.polled = False
                    return  # no loop runs (a connection driven by hand in a test)
            self.polling = True
            call_soon(self._poll_bound)

    def _measure(self, step: int) -> None:
        """Answer ``step`` of a window: the cycle since the last answer goes to the block
        of the way that answer took; the window's last answer decides."""
        now = thread_cpu() if self.cpu_clock is None else self.cpu_clock()
        at = self.cpu_at
        self.cpu_at = now
        explore = self.explore
        if at != 0.0 and step > 0:
            last = step - 1
            if SETTLE <= last < explore:
                self.tried.append(now - at)
            elif explore + SETTLE <= last:
                self.kept.append(now - at)
        if step < 2 * explore:
            self.step = step + 1
            return
        self.cpu_at = 0.0
        self._decide()
        self.step = 0
        self.left = self.period * (1 + self.rest) - 2 * explore

    def _decide(self) -> None:
        tried = self.tried
        kept = self.kept
        if len(tried) > 2 and len(kept) > 2:
            # Each block's mean without its dearest cycle (a checkpoint, a collection).
            other = (sum(tried) - max(tried)) / (len(tried) - 1)
            same = (sum(kept) - max(kept)) / (len(kept) - 1)
            if self.prefer:
                edge, sleeping = same - other, other  # polling - sleeping
            else:
                edge, sleeping = other - same, same
            if self.windows:
                self.edge += WEIGHT * (edge - self.edge)
            else:
                self.edge = edge
            self.windows += 1
            self.prefer = self.edge < (0.0 if self.prefer else -MARGIN * sleeping)
            if abs(self.edge) * 4.0 > sleeping:  # far apart: look again less often
                rest = self.rest * 2 if self.rest else 1
                self.rest = rest if rest < MAX_REST else MAX_REST
            else:
                self.rest = 0
        self.tried = []
        self.kept = []

    def _poll(self) -> None:
        # A callback on the loop's ready queue makes its next poll of the sockets a
        # non-blocking one; this one puts itself back until the poll has lasted its limit.
        done = self.done
        if done and self.polled and monotonic() - done < self.limit:
            self._call_soon(self._poll_bound)
        else:
            self.polling = False

    def stats(self) -> list[tuple[str, object]]:
        """The ``stats`` lines (none while polling is off)."""
        if self.limit == 0.0:
            return []
        return [
            ("busy_poll_us", round(self.limit * 1e6)),
            ("busy_poll_caught", self.caught),
            ("busy_poll_ran_out", self.ran_out),
            ("busy_poll_preferred", int(self.prefer)),
            ("busy_poll_gain_ns", round(-self.edge * 1e9)),
        ]
