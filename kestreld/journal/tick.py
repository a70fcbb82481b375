"""One event-loop tick's journal writes: the writers with something to write, flushed together.

Every put and every confirm of a tick waits for its writer journal's flush (one write per
queue, then the acknowledgements).  The writers of one server share a Tick: the first that
has something to write asks the event loop for one callback, and that callback flushes every
writer that joined meanwhile, so a tick costs one callback however many queues it touched,
and the puts of every connection read in that turn of the loop share their writes (group
commit).

A front end reading a batch of requests holds the tick (:meth:`hold`) while it runs them and
releases it at the end.  With other clients connected the flush stays on the loop's next
turn, where their requests join it.  A lone client has nobody to share a write with: its
requests' writes go out at once (:meth:`release` with ``now``), before its read callback
returns, sparing the trip through the loop (a callback, the GIL taken again, the handle).
Clients waiting for an item (a get with a timeout) send nothing that could join, so the
front ends count them (:meth:`wait_began`, :meth:`wait_ended`): a producer whose only peers
are waiting consumers is a lone client too.
The order is the same either way: each writer writes, then acknowledges, then replies go.

What an acknowledgement sets off for another client (an item handed to a consumer waiting
in a get) must not run inside the acknowledgement: it is asked for with :meth:`soon`, and
runs when the batch or flush running now is over, in the same turn of the loop (no
callback of its own, no extra poll of the loop), or on the loop's next turn when nothing
runs.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Flushing:
    """What a tick flushes (the writer journal): a base class, so the compiled tick calls
    ``flush`` in C."""

    __slots__ = ()

    def flush(self) -> None:
        raise NotImplementedError


class Tick:
    """The writer journals of one server with a flush due (one writer: the event loop)."""

    __slots__ = (
        "writers",
        "_spare",
        "after",
        "scheduled",
        "held",
        "waiting",
        "_call_soon",
        "_turn_bound",
        "changed",
    )

    def __init__(self) -> None:
        self.writers: list[Flushing] = []  # writers with a flush due, in the order they asked
        self._spare: list[Flushing] = []  # the list a flush pass collects joiners in
        self.after: list[Any] = []  # what runs once the batch or flush running now is over
        self.scheduled = False  # a loop callback is pending
        self.held = 0  # front ends running a batch of requests (flush when they release)
        self.waiting = 0  # clients waiting for an item: none of their requests can join
        self._call_soon: Any = None  # the loop's call_soon, bound once
        self._turn_bound: Any = None
        #: Writers that wrote or read since the last checkpoint round took them: the round
        #: visits these, not every queue (an idle queue costs nothing).
        self.changed: list[Any] = []

    def take_changed(self) -> list[Any]:
        """The writers changed since the last call (each marks itself once)."""
        changed, self.changed = self.changed, []
        return changed

    def add(self, writer: Flushing) -> bool:
        """``writer`` has something to write this tick; False when no loop runs (the caller
        flushes at once: offline tools, tests driving a queue by hand)."""
        self.writers.append(writer)
        if self.scheduled or self.held or self._schedule():
            return True
        self.writers.pop()
        return False

    def soon(self, fn: Any) -> None:
        """Run ``fn()`` once the batch or flush running now is over (after its writes and
        acknowledgements), or on the loop's next turn when none runs."""
        if not (self.held or self.scheduled or self._schedule()):
            raise RuntimeError("no running event loop")
        self.after.append(fn)  # the batch's release, or the scheduled turn, runs it

    def wait_began(self) -> None:
        """A client waits for an item: nothing it sends is run until the wait ends."""
        self.waiting += 1

    def wait_ended(self) -> None:
        self.waiting -= 1

    def hold(self) -> None:
        """A batch of requests runs: what it writes waits for :meth:`release`."""
        self.held += 1

    def release(self, now: bool) -> None:
        """The batch ran: flush at once (``now``: nobody else could join the write) or on the
        loop's next turn, with the other connections' requests.

        A flush writes every writer that joined, in order; writers joining meanwhile (a
        reply that let a connection run its next requests) go in the same pass."""
        self.held -= 1
        if self.held or not (self.writers or self.after):
            return
        if self.writers and not now and (self.scheduled or self._schedule()):
            return  # what waits in after runs on that turn too, after the writes
        self.held += 1
        try:
            writers = self.writers
            while writers or self.after:
                if not writers:
                    self._run_after()
                    writers = self.writers
                    continue
                # Writers joining during this pass go to the other list (two lists in
                # turn: no new list per flush).
                self.writers = self._spare
                self._spare = writers
                done = 0
                try:
                    for writer in writers:
                        done += 1
                        writer.flush()
                except BaseException:
                    # A flush failed unexpectedly (a bug): the writers after it still owe
                    # theirs, on the next turn, as if each had its own callback.
                    self.writers = writers[done:] + self.writers
                    self._spare = []
                    if self.writers and not self.scheduled:
                        self._schedule()
                    raise
                writers.clear()
                writers = self.writers
        finally:
            self.held -= 1

    def _run_after(self) -> None:
        """Run what :meth:`soon` deferred (what runs may defer more: it runs in this pass)."""
        after, self.after = self.after, []
        done = 0
        try:
            for fn in after:
                done += 1
                fn()
        except BaseException:
            self.after = after[done:] + self.after  # the rest on the next turn
            if not self.scheduled:
                self._schedule()
            raise

    def _schedule(self) -> bool:
        call_soon = self._call_soon
        if call_soon is None:
            try:
                call_soon = self._call_soon = asyncio.get_running_loop().call_soon
            except RuntimeError:
                return False
            self._turn_bound = self._turn
        self.scheduled = True
        call_soon(self._turn_bound)
        return True

    def _turn(self) -> None:
        self.scheduled = False
        self.held += 1
        self.release(True)
