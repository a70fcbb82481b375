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
``loop_hold_probes`` is the share of the time the loop was held longer than 1 ms.

On a machine with more runnable threads than cores, the loop's thread also waits for a CPU,
and that wait is the machine's, not the server's: the time the thread spent runnable but
not running since the previous read (the kernel's ``/proc/thread-self/schedstat``) is taken
off.  A hold is then counted at least as long as the server's own work (and blocking calls)
made it, less at most one period's waits for a CPU before it: never more than it was.

The cost is one wake-up and two small reads per period, nothing per request: while the
loop's thread runs :data:`BUSY_SHARE` of the time or more the period is :data:`PERIOD`;
after :data:`QUIET_READS` reads below that it is :data:`IDLE_PERIOD` (a wake-up every 20 ms
cost an idle server 0.6 % of a core on a virtual machine), until the loop is busy again.  Where
``timerfd`` is missing (not Linux) the loop's own timer stands in, whose lateness also
counts its resolution (about 1 ms).
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import time
from collections import deque

import structlog

log = structlog.get_logger("kestreld.loop")

#: How often the probe asks while the server is busy.
PERIOD = 0.02
#: How often it asks while the server is idle (the loop thread below BUSY_SHARE of the time).
IDLE_PERIOD = 1.0
#: The share of the time the loop's thread runs from which the server counts as busy.
BUSY_SHARE = 0.02
#: Reads below BUSY_SHARE in a row before the probe slows down to IDLE_PERIOD (a second).
QUIET_READS = 50
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

    def record(self, longest: float, expirations: int, now: float) -> None:
        """``expirations`` expired since the previous read, a period apart, and the loop was
        held ``longest`` seconds from the first of them (each later one, a period less)."""
        self.probes += expirations
        if longest > LIMIT:
            self.over_limit += min(expirations, math.ceil((longest - LIMIT) / self.period))
        self._move_to(now)
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

    def __init__(self) -> None:
        self.period = PERIOD  # IDLE_PERIOD while the loop is idle
        self.holds = LoopHolds(PERIOD)
        self._fd = -1
        self._due = 0.0  # the fallback timer's next expiration (loop time)
        #: The loop thread's /proc/thread-self/schedstat (-1: not readable), and at the
        #: previous read: the time it had run, had waited for a CPU, and when it was read.
        self._schedstat = -1
        self._ran = 0.0
        self._waited = 0.0
        self._read_at = 0.0
        self._quiet = 0  # reads in a row with the loop below BUSY_SHARE

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
            self._schedstat = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._schedstat = -1
        self._ran, self._waited = self._sched()
        self._read_at = time.monotonic()
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
            if self._schedstat >= 0:
                os.close(self._schedstat)
                self._schedstat = -1

    def _sched(self) -> tuple[float, float]:
        """Seconds the loop's thread has run, and has been runnable without a CPU (both 0
        when unknown)."""
        if self._schedstat < 0:
            return 0.0, 0.0
        try:
            ran, waited = os.pread(self._schedstat, 64, 0).split()[:2]
            return int(ran) * 1e-9, int(waited) * 1e-9
        except (OSError, ValueError):
            return 0.0, 0.0

    def _held(self, longest: float, expirations: int) -> None:
        """Record a hold of ``longest`` seconds, less what the thread waited for a CPU; then
        choose the period by how busy the loop was since the previous read."""
        now = time.monotonic()
        ran, waited = self._sched()
        longest -= waited - self._waited
        self.holds.record(max(longest, 0.0), expirations, now)
        busy = self._schedstat < 0 or ran - self._ran >= BUSY_SHARE * (now - self._read_at)
        self._ran, self._waited, self._read_at = ran, waited, now
        if busy:
            self._quiet = 0
            if self.period != PERIOD:
                self._set_period(PERIOD)
        elif self.period == PERIOD:
            self._quiet += 1
            if self._quiet >= QUIET_READS:
                self._set_period(IDLE_PERIOD)

    def _set_period(self, period: float) -> None:
        self.period = self.holds.period = period
        if self._fd >= 0:
            _arm(self._fd, period)

    def _expired(self) -> None:
        try:
            expirations = int.from_bytes(os.read(self._fd, 8), "little")
        except BlockingIOError:
            return
        late = self.period - _remaining(self._fd)  # after the last expiration
        self._held(late + (expirations - 1) * self.period, expirations)

    def _timer(self, loop: asyncio.AbstractEventLoop) -> None:
        """Without timerfd: the loop's own timer, kept on its schedule."""
        late = time.monotonic() - self._due
        missed = int(late // self.period) if late > 0 else 0
        self._held(late, missed + 1)
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
    try:
        _arm(fd, period)
    except OSError:
        os.close(fd)
        raise
    return fd


def _arm(fd: int, period: float) -> None:
    """Make ``fd`` expire every ``period`` seconds from now."""
    sec, nsec = divmod(round(period * 1e9), 1_000_000_000)
    every = _Timespec(sec, nsec)
    spec = _Itimerspec(every, every)
    if _libc.timerfd_settime(fd, 0, ctypes.byref(spec), None) < 0:  # type: ignore[union-attr]
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _remaining(fd: int) -> float:
    """Seconds until ``fd``'s next expiration."""
    spec = _Itimerspec()
    _libc.timerfd_gettime(fd, ctypes.byref(spec))  # type: ignore[union-attr]
    return spec.it_value.tv_sec + spec.it_value.tv_nsec * 1e-9
