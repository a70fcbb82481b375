"""What the tests of a box of workers share: a queue name a given worker owns, and waiting
for what the box does a moment later (a read given back, a worker forked again)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from kestreld.workers.ownership import owner_of


def owned_by(index: int, prefix: str, workers: int = 2) -> str:
    """A queue name worker ``index`` of ``workers`` owns."""
    return next(f"{prefix}{i}" for i in range(1000) if owner_of(f"{prefix}{i}", workers) == index)


def until(predicate: Callable[[], Any], timeout: float = 5.0, step: float = 0.02) -> Any:
    """``predicate()``'s first true value within ``timeout`` seconds, else its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()
