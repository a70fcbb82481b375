"""The server's clocks: the wall clock in milliseconds, the monotonic clock, and the CPU
time of the calling thread.

Items carry wall-clock stamps in milliseconds since the epoch (Kestrel's journal
format: add and expiry times); timeouts, idle times and latencies use the
monotonic clock, in seconds.  Both are read several times per request, so the
compiled build (``clock.pxd``) reads them with ``clock_gettime`` directly, the
same clocks ``time.time`` and ``time.monotonic`` read on Linux (so values from
here and from the ``time`` module compare), without a Python call and a float
per reading.
"""

from __future__ import annotations

import time

try:
    import cython
    from cython.cimports.posix.time import (  # type: ignore[import-not-found]
        CLOCK_MONOTONIC,
        CLOCK_REALTIME,
        CLOCK_THREAD_CPUTIME_ID,
        clock_gettime,
        timespec,
    )

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False


def now_ms() -> int:
    """Wall-clock time in milliseconds since the epoch, as ``int(time.time() * 1000)``."""
    if COMPILED:
        ts = cython.declare(timespec)
        clock_gettime(CLOCK_REALTIME, cython.address(ts))
        return ts.tv_sec * 1000 + ts.tv_nsec // 1000000
    return time.time_ns() // 1000000


def monotonic() -> float:
    """Seconds of the monotonic clock, as ``time.monotonic()`` (and ``time.perf_counter()``)."""
    if COMPILED:
        ts = cython.declare(timespec)
        clock_gettime(CLOCK_MONOTONIC, cython.address(ts))
        return ts.tv_sec + ts.tv_nsec * 1e-9
    return time.monotonic()


def thread_cpu() -> float:
    """Seconds of CPU the calling thread has used, as ``time.thread_time()`` (a system call:
    read it where a measurement needs it, not per request)."""
    if COMPILED:
        ts = cython.declare(timespec)
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, cython.address(ts))
        return ts.tv_sec + ts.tv_nsec * 1e-9
    return time.thread_time()


if not COMPILED:
    # The plain build calls the clock itself: no Python frame around it.
    monotonic = time.monotonic  # noqa: F811
    thread_cpu = time.thread_time  # noqa: F811
