"""The open-file budget of the queues' journals (RabbitMQ's file handle cache).

A writer journal holds descriptors while it is written or read: its segment, its
readers' progress files, the segments read-behind reads.  With thousands of queues
that would be thousands of descriptors, most of them idle, and the process's limit
would refuse the next client or the next queue (``Too many open files``).  The
:class:`HandleCache` of a server admits every journal that opens a descriptor and,
past its budget, closes the descriptors of the journal used least recently that has
nothing in flight (no buffered write, no fsync pending or running, no rewrite); the
journal opens them again, at the same append position, when it is next written or
read.  A journal closed here was fsynced as its ``sync_journal`` demands: nothing in
flight means every written batch is acknowledged, and with ``sync_journal = 0`` or a
period an acknowledged batch was fsynced or has its fsync pending (then it is busy).

The budget is derived from the process's open-file limit: a share stays free for
client connections (:func:`descriptor_budget`).  Cold code: it runs when a journal
opens a descriptor it had closed, never per request.
"""

from __future__ import annotations

import resource
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import structlog

log = structlog.get_logger("kestreld.journal")

#: Descriptors counted per journal: its segment, one progress file, one read-behind segment.
PER_JOURNAL = 3
#: Descriptors kept for everything else: listeners, the lock file, the admin port, log
#: files, the executor's transient opens (rewrites, fsyncs of the folder, retirements).
FIXED = 64


@dataclass(slots=True, frozen=True)
class DescriptorBudget:
    """How the open-file limit is shared between journals and client connections."""

    limit: int
    connections: int  # descriptors kept for clients
    journals: int  # journals that may hold descriptors at once


def descriptor_budget(limit: int, workers: int = 1) -> DescriptorBudget:
    """Half of ``limit`` (at least 64) for connections, 64 for the server's own files, the
    rest for journals (:data:`PER_JOURNAL` each, at least 16 journals).

    ``limit`` is a process's: with ``workers = N`` each worker has its own, opens only its
    own queues' journals, and keeps 1/N of the connections' half for its clients, since
    each of them may hold a connection to each of the other workers (its channels)."""
    connections = max(64, limit // 2)
    journals = max(16, (limit - connections - FIXED) // PER_JOURNAL)
    return DescriptorBudget(limit, max(64 // workers, connections // workers), journals)


def log_open_file_limit(
    was: int, soft: int, budget: DescriptorBudget, max_connections: int, **fields: object
) -> None:
    """The ``open_file_limit`` event: the limit raised, and how it is shared."""
    log.info(
        "open_file_limit",
        soft_was=was,
        soft=soft,
        hard=resource.getrlimit(resource.RLIMIT_NOFILE)[1],
        journals_open_at_most=budget.journals,
        connections_at_most=min(budget.connections, max_connections),
        **fields,
    )


def raise_open_file_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; returns (soft before, soft now)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        # An unlimited hard limit cannot be the soft one (the kernel caps descriptors at
        # nr_open): stay with a generous finite figure.
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft, soft
        return soft, target
    return soft, soft


class HandleCache:
    """The journals holding descriptors, least recently admitted first (one writer: the
    event loop).  A journal is admitted when it opens a descriptor while not held here,
    and leaves when its descriptors are closed (evicted, or the journal closed)."""

    __slots__ = ("max_journals", "journals", "evictions", "_over_logged")

    def __init__(self, max_journals: int | None = None) -> None:
        #: Journals that may hold descriptors at once; None: no limit.
        self.max_journals = max_journals
        self.journals: OrderedDict[Any, None] = OrderedDict()
        self.evictions = 0
        self._over_logged = False

    def resize(self, max_journals: int | None) -> None:
        """Hold at most ``max_journals`` journals from now on (the server's share of its limit);
        the next admission closes the surplus."""
        self.max_journals = max_journals

    def admit(self, journal: Any) -> None:
        """``journal`` opens a descriptor: held from now on; past the budget, idle journals
        used least recently close theirs (a journal used since it was last passed over gets
        a second chance, as in a CLOCK cache)."""
        journal.cached = True
        journal.used = True
        journals = self.journals
        journals[journal] = None
        limit = self.max_journals
        if limit is None or len(journals) <= limit:
            return
        for _ in range(2 * len(journals)):  # twice round: second chances are spent
            if len(journals) <= limit:
                return
            oldest, _ = journals.popitem(last=False)
            if oldest.used or oldest is journal:
                oldest.used = False
                journals[oldest] = None
            elif oldest.close_handles():
                self.evictions += 1
            else:
                journals[oldest] = None  # busy: writes or an fsync in flight
        if len(journals) > limit and not self._over_logged:
            self._over_logged = True  # every journal is busy: over the budget for now
            log.warning("descriptor_budget_exceeded", journals=len(journals), budget=limit)

    def release(self, journal: Any) -> None:
        """``journal`` closed its descriptors (closed, erased, or evicted by itself)."""
        journal.cached = False
        self.journals.pop(journal, None)

    def __len__(self) -> int:
        return len(self.journals)
