"""Busy polling (opt-in): after answering, keep the event loop awake for the next request.

A server that sleeps in ``epoll_wait`` between two requests of a client pays for waking up
on every request: an interrupt, a context switch, and a request run on a CPU whose caches
went cold meanwhile.  At one connection on a virtual machine that costs more server CPU
than the request itself (BENCHMARKS.md, issue 28: about 30 µs against 7).  A server that
polls for a moment before it sleeps reads the next request as soon as it arrives, on a warm
CPU; but a poll costs its whole length in CPU, so it pays only when the client's next
request comes sooner than a wake-up costs.  With a client that sends its next request
within about 20 µs of the reply, server CPU per request falls by a quarter and the rate
triples; with one that takes 30 µs or more (its own event loop, other connections to
serve) a poll costs more than the wake-up it spares.  So it is off unless
``busy_poll_us`` (server config) sets how long a poll may last; BENCHMARKS.md has both
measurements.  Only a lone client is polled for (the server's only connection, or the only
one not waiting for an item): with several, the next read comes soon anyway, and on a box
they share the clients need the CPU a poll would take.

Each poll lasts at most that limit.  The loop sees when the next request arrives: within
the limit, the poll caught it; a poll that ran out was wasted, and the next polls are
skipped, one after the first miss in a row, then two, four, up to 64, before one is tried
again.  A request that arrives within the limit while polls are skipped (measured from the
answer, so a late wake-up counts against it) ends the back-off.  An idle server, or
clients pausing longer than the limit, cost at most one poll in 65 answers.
"""

from __future__ import annotations

import asyncio
from typing import Any

from kestreld.journal.clock import monotonic

#: Polls skipped after the longest run of polls that ran out (then one is tried again).
MAX_BACK_OFF = 64


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
        server's only client (others connected but waiting for an item do not count) and
        polls are not backing off."""
        if self.limit == 0.0:
            return
        if not lone:
            # Several clients: the next read is soon anyway, and on a box they share the
            # clients need the CPU a poll would take.  Nothing to measure either.
            self.done = 0.0
            self.polled = False
            return
        self.done = monotonic()
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
        ]
