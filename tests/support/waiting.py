"""Waiting for a condition instead of sleeping a fixed time.

A fixed sleep is either too short on a loaded machine (a false failure) or
slower than needed on a quiet one.  These poll with a generous deadline: the
test states the order of events ("the get is waiting, then the put comes")
and the deadline only bounds a real hang.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from typing import TypeVar

from kestreld_process import Conn, KestreldProcess

from kestreld.journal.checkpoint import read_checkpoint
from kestreld.journal.files import checkpoint_name

T = TypeVar("T")

#: Long enough for a 2-core machine at load average 4+; only a hang takes this long.
DEADLINE = 30.0


def wait_until(
    condition: Callable[[], T], what: str, seconds: float = DEADLINE, interval: float = 0.01
) -> T:
    """Poll ``condition`` until it returns something true; that value is returned."""
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f}s: {what}")
        time.sleep(interval)


async def until(
    condition: Callable[[], object], what: str = "condition", seconds: float = DEADLINE
) -> None:
    """Let the event loop run (an in-process server, a writer's threads reporting) until
    ``condition()`` holds; fails after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f}s: {what}")
        await asyncio.sleep(0.005)


def stat(srv: KestreldProcess, key: str) -> str | None:
    """One ``stats`` value, asked on a connection of its own."""
    c = Conn(srv.connect())
    try:
        return c.stats().get(key)
    finally:
        c.close()


def wait_stat(srv: KestreldProcess, key: str, value: str, seconds: float = DEADLINE) -> None:
    """Until ``stats`` shows ``key`` = ``value``."""
    wait_until(lambda: stat(srv, key) == value, f"stats {key} = {value}", seconds)


def wait_waiters(srv: KestreldProcess, queue: str, count: int) -> None:
    """Until ``count`` clients are blocked in a get (or monitor) on ``queue``."""
    wait_stat(srv, f"queue_{queue}_waiters", str(count))


def checkpoint_head(folder: str | os.PathLike, queue: str, reader: str = "") -> int:
    """The head in a reader's checkpoint file (0 when there is none yet)."""
    path = os.path.join(folder, checkpoint_name(queue, reader))
    if not os.path.exists(path):
        return 0
    cp = read_checkpoint(path)
    return cp.head if cp is not None else 0


def wait_checkpoint(
    folder: str | os.PathLike, queue: str, head: int, reader: str = "", seconds: float = DEADLINE
) -> None:
    """Until the reader's checkpoint on disk has reached ``head`` (consumption is durable)."""
    wait_until(
        lambda: checkpoint_head(folder, queue, reader) >= head,
        f"checkpoint of {queue}+{reader or '(default)'} at head {head}",
        seconds,
    )
