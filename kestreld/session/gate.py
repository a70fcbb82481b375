"""What the server lets its sessions do now, read on every request.

Why writes and fetches are refused (the status in force, or more connections than
``connection_limit_refuse_writes`` / ``_reads``), and who observes request latencies
(metrics), change rarely and are read by every set and get.  The server keeps them
current in its one Gate (through :meth:`Gate.refuse` and :meth:`Gate.observe`); each
session holds the same Gate, a ``cdef`` class when compiled (``gate.pxd``): a request
reads a C field instead of an attribute of the server.  It imports nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Gate:
    __slots__ = ("writes_refused", "reads_refused", "latency_observer")

    def __init__(self) -> None:
        #: Why writes / fetches are refused now, else None (requests are taken).
        self.writes_refused: str | None = None
        self.reads_refused: str | None = None
        #: Called with (kind, seconds[, queue or reader name]) for "set", "get_hit" and
        #: "get_timeout" (metrics), else None.
        self.latency_observer: Callable[..., Any] | None = None

    def refuse(self, writes: str | None, reads: str | None) -> None:
        """The server's judgement now: why writes and fetches are refused (None: taken)."""
        self.writes_refused = writes
        self.reads_refused = reads

    def observe(self, observer: Callable[..., Any] | None) -> None:
        """Latencies go to ``observer`` from now on (None: nobody observes them)."""
        self.latency_observer = observer
