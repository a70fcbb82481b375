"""How long the event loop is held: a probe that times the loop's answer to a kernel timer.

Every request of every connection runs on one event loop: while one callback runs, nothing
else does, and a request that arrives meanwhile waits for it.  The probe is a periodic
kernel timer (Linux ``timerfd``, every :data:`PERIOD`) that the loop reads like a socket.
The kernel makes it readable at the instant it expires; the loop reads it as soon as it
gets to its I/O, so how late the read is (nanosecond clock) is how long the loop was busy at
that instant: what a request arriving then waited before the loop looked at it.  A hold
that covers several expirations is timed from the first it missed.

The instants are the kernel's, not the loop's, so they fall anywhere in its work: a hold of
*h* is seen with probability *h* / :data:`PERIOD` each time it happens, and one that recurs
(every large item of a flood) is seen within seconds.  ``loop_hold_over_1ms`` over
``loop_hold_probes`` is the share of the time the loop was held longer than 1 ms.  The time
also counts what the process spent waiting for a CPU (on a loaded machine, the others'
work).  The cost is one wake-up per :data:`PERIOD`, nothing per request.  Where ``timerfd``
is missing (not Linux) the loop's own timer stands in, whose lateness also counts its
resolution (about 1 ms).
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import time
from collections import deque

import structlog

log = structlog.get_logger("kestreld.loop")

#: How often the probe asks: a wake-up this often costs an idle server about 0.1 % of a core.
PERIOD = 0.02
#: A hold longer than this counts in ``loop_hold_over_1ms``: the fairness goal (issue 55).
LIMIT = 0.001
#: ``loop_hold_max_us`` is the longest in the last SLOTS slots of SLOT seconds (a minute).
SLOT = 10.0
SLOTS = 6


class LoopHolds:
    """The probe's accounting (no I/O): expirations seen, how many were served late by more
    than :data:`LIMIT`, and the longest hold of each recent :data:`SLOT`."""

    __slots__ = ("period", "probes", "over_limit", "maxima", "slot")

    def __init__(self, period: float = PERIOD) -> None:
        self.period = period
        self.probes = 0  # timer expirations (instants probed)
        self.over_limit = 0  # of them, served more than LIMIT late
        self.maxima: deque[float] = deque([0.0], maxlen=SLOTS)  # the newest slot last
        self.slot = 0  # the newest slot's number (monotonic seconds // SLOT)

    def record(self, late: float, expirations: int, now: float) -> None:
        """The loop read the timer ``late`` seconds after its last expiration, and
        ``expirations`` expired since the previous read (the earlier ones a period apart,
        each served later by one more period)."""
        self.probes += expirations
        self.over_limit += expirations - 1 + (late > LIMIT)
        self._move_to(now)
        longest = late + (expirations - 1) * self.period
        if longest > self.maxima[-1]:
            self.maxima[-1] = longest

    def longest(self, now: float) -> float:
        """The longest hold seen in the last minute (seconds)."""
        self._move_to(now)
        return max(self.maxima)

    def _move_to(self, now: float) -> None:
        slot = int(now // SLOT)
        gone = slot - self.slot
        if gone > 0:
            self.maxima.extend([0.0] * min(gone, SLOTS))
            self.slot = slot

    def stats(self, now: float) -> list[tuple[str, object]]:
        """The ``stats`` lines."""
        return [
            ("loop_hold_max_us", round(self.longest(now) * 1e6)),
            ("loop_hold_probes", self.probes),
            ("loop_hold_over_1ms", self.over_limit),
        ]


class HoldProbe:
    """The timer of one event loop and its :class:`LoopHolds`; :meth:`run` as a task."""

    def __init__(self, period: float = PERIOD) -> None:
        self.period = period
        self.holds = LoopHolds(period)
        self._fd = -1
        self._due = 0.0  # the fallback timer's next expiration (loop time)

    def stats(self) -> list[tuple[str, object]]:
        """The ``stats`` lines (see :meth:`LoopHolds.stats`)."""
        return self.holds.stats(time.monotonic())

    async def run(self) -> None:
        """Probe the running loop until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            self._fd = _timerfd(self.period)
        except OSError as e:
            log.info("loop_hold_probe_fallback", reason=e.strerror)
        try:
            if self._fd >= 0:
                loop.add_reader(self._fd, self._expired)
            else:
                self._due = loop.time() + self.period
                loop.call_at(self._due, self._timer, loop)
            await loop.create_future()  # until cancelled
        finally:
            if self._fd >= 0:
                loop.remove_reader(self._fd)
                os.close(self._fd)
                self._fd = -1

    def _expired(self) -> None:
        try:
            expirations = int.from_bytes(os.read(self._fd, 8), "little")
        except BlockingIOError:
            return
        late = self.period - _remaining(self._fd)
        self.holds.record(late, expirations, time.monotonic())

    def _timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Without timerfd: the loop's own timer, kept on its schedule."""
        late = time.monotonic() - self._due
        missed = int(late // self.period) if late > 0 else 0
        self.holds.record(late - missed * self.period, missed + 1, time.monotonic())
        self._due += (missed + 1) * self.period
        loop.call_at(self._due, self._timer, loop)


# --- Linux timerfd, through the C library (os.timerfd_* arrive in Python 3.13) ----------


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


_CLOCK_MONOTONIC = 1
_TFD_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC  # TFD_NONBLOCK, TFD_CLOEXEC
_libc: ctypes.CDLL | None = None


def _timerfd(period: float) -> int:
    """A non-blocking timerfd expiring every ``period`` seconds (raises OSError without)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    if not hasattr(_libc, "timerfd_create"):
        raise OSError(0, "no timerfd")
    fd = _libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_FLAGS)
    if fd < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))
    sec, nsec = divmod(round(period * 1e9), 1_000_000_000)
    every = _Timespec(sec, nsec)
    if _libc.timerfd_settime(fd, 0, ctypes.byref(_Itimerspec(every, every)), None) < 0:
        errno = ctypes.get_errno()
        os.close(fd)
        raise OSError(errno, os.strerror(errno))
    return fd


def _remaining(fd: int) -> float:
    """Seconds until ``fd``'s next expiration."""
    spec = _Itimerspec()
    _libc.timerfd_gettime(fd, ctypes.byref(spec))  # type: ignore[union-attr]
    return spec.it_value.tv_sec + spec.it_value.tv_nsec * 1e-9
