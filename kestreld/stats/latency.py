"""Latency histograms for the metrics endpoint: set, get hit, get timeout and fsync.

Observations happen on the event loop's hot path (every ``STORED``, every
fetch, every fsync), so a :class:`LatencyHistogram` is just a list of bucket
counts and a sum: one ``bisect`` and two additions, no lock.  It is only
touched on the loop thread; the metrics endpoint copies it there
(:meth:`LatencyHistograms.snapshot`) and encodes the copy as
``prometheus_client`` histogram families on its own thread.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: Upper bounds in seconds: 50 µs (an immediate hit) up to a minute (a long blocking get).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip


def _fine_buckets() -> tuple[float, ...]:
    """Prometheus' bounds plus a geometric series (x1.25 from 1 µs to 2 h): the percentiles
    of ``/stats.json`` and the live page are read from these, within 25 %."""
    bounds = set(LATENCY_BUCKETS)
    bound = 0.000001
    while bound < 7200:
        bounds.add(float(f"{bound:.3g}"))
        bound *= 1.25
    return tuple(sorted(bounds))


#: The bounds every histogram counts in; ``/metrics`` shows them summed at LATENCY_BUCKETS.
FINE_BUCKETS: tuple[float, ...] = _fine_buckets()
_EXPORTED = tuple(FINE_BUCKETS.index(b) for b in LATENCY_BUCKETS)

#: The kinds the connection reports through ``Server.latency_observer``.
REQUEST_KINDS = ("set", "get_hit", "get_timeout")


class LatencyHistogram:
    """Counts per bucket (the last one is +Inf), the sum of observed seconds, min and max.

    ``observe`` is the per-item cost: one ``bisect`` and a few additions, no allocation.
    """

    __slots__ = ("bounds", "counts", "total", "count", "low", "high")

    def __init__(self, bounds: tuple[float, ...] = FINE_BUCKETS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0
        self.count = 0
        self.low = 0.0  # min and max of what was observed (0 when nothing was)
        self.high = 0.0

    def observe(self, seconds: float, times: int = 1) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le = "<=").
        self.counts[bisect_left(self.bounds, seconds)] += times
        self.total += seconds * times
        count = self.count
        if not count:
            self.low = self.high = seconds
        elif seconds > self.high:
            self.high = seconds
        elif seconds < self.low:
            self.low = seconds
        self.count = count + times

    def merge(self, other: LatencyHistogram) -> None:
        """Add ``other``'s observations (same bounds) to these."""
        if not other.count:
            return
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.low = other.low if not self.count else min(self.low, other.low)
        self.high = max(self.high, other.high)
        self.total += other.total
        self.count += other.count

    def copy(self) -> LatencyHistogram:
        twin = LatencyHistogram(self.bounds)
        twin.counts = self.counts.copy()
        twin.total, twin.count, twin.low, twin.high = self.total, self.count, self.low, self.high
        return twin

    def minus(self, earlier: LatencyHistogram | None) -> LatencyHistogram:
        """What was observed since ``earlier`` (a copy of this one taken before).

        Extremes cannot be subtracted: min and max are those of the whole life,
        narrowed to the bounds of the lowest and highest bucket counted since.
        """
        if earlier is None or not earlier.count:
            return self
        delta = LatencyHistogram(self.bounds)
        delta.counts = [a - b for a, b in zip(self.counts, earlier.counts, strict=True)]
        delta.count = self.count - earlier.count
        delta.total = self.total - earlier.total if delta.count else 0.0
        if delta.count:
            counted = [i for i, n in enumerate(delta.counts) if n]
            first, last = counted[0], counted[-1]
            floor = self.bounds[first - 1] if first else 0.0
            ceiling = self.bounds[last] if last < len(self.bounds) else self.high
            delta.low, delta.high = max(self.low, floor), min(self.high, ceiling)
        return delta

    def percentile(self, fraction: float) -> float:
        """The upper bound of the bucket holding that share of observations (0 when empty),
        never above the largest value observed."""
        if not self.count:
            return 0.0
        rank = fraction * self.count
        running = 0
        for i, count in enumerate(self.counts):
            running += count
            if running >= rank and count:
                bound = self.bounds[i] if i < len(self.bounds) else self.high
                return min(bound, self.high)
        return self.high

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) pairs, ending with +Inf, as Prometheus wants."""
        out = []
        running = 0
        counts = self.counts
        exported = _EXPORTED if self.bounds is FINE_BUCKETS else range(len(self.bounds))
        start = 0
        for index in exported:
            running += sum(counts[start : index + 1])
            start = index + 1
            out.append((floatToGoString(self.bounds[index]), running))
        out.append(("+Inf", self.count if self.count else running + sum(counts[start:])))
        return out


#: Per-queue histograms: kind -> (Prometheus family, help).  Each is labelled ``queue`` and
#: ``reader`` (``""``: the queue's own; set latency is the queue's, so always ``""``).
QUEUE_KINDS: dict[str, tuple[str, str]] = {
    "delivery": (
        "kestreld_queue_delivery_latency_seconds",
        "How long an item waited in the queue before it was handed to a consumer "
        '(now - add time at the hand-off), per queue and reader (reader="" is the queue\'s own).',
    ),
    "get_timeout": (
        "kestreld_queue_get_timeout_seconds",
        "How long blocking gets (/t=) that got nothing waited, per queue and reader.",
    ),
    "set": (
        "kestreld_queue_set_latency_seconds",
        "Time from a put to its acknowledgement (journal written, or fsynced with "
        "sync_journal = 0), per queue; measured from the first put of its write batch.",
    ),
}


class LatencyHistograms(Collector):
    """The server's latency histograms, and the observers that feed them."""

    def __init__(self) -> None:
        self.requests: dict[str, LatencyHistogram] = {
            kind: LatencyHistogram() for kind in REQUEST_KINDS
        }
        self.fsync = LatencyHistogram()
        #: kind (QUEUE_KINDS) -> queue or reader name (``q``, ``q+r``) -> histogram.
        self.queues: dict[str, dict[str, LatencyHistogram]] = {kind: {} for kind in QUEUE_KINDS}
        self.delivered = self.queues["delivery"]  # one lookup less per item
        #: Bytes of acknowledged puts per queue since start (ostrich's q/<name>/put_bytes).
        self.put_bytes: dict[str, int] = {}

    def _queue(self, kind: str, name: str) -> LatencyHistogram:
        by_name = self.queues[kind]
        histogram = by_name.get(name)
        if histogram is None:
            histogram = by_name[name] = LatencyHistogram()
        return histogram

    def observe_request(self, kind: str, seconds: float, queue: str | None = None) -> None:
        """``Server.latency_observer``: (``set`` | ``get_hit`` | ``get_timeout``, seconds[,
        queue or reader name]).  Without a name only the server-wide histogram counts it."""
        histogram = self.requests.get(kind)
        if histogram is not None:
            histogram.observe(seconds)
            if queue is not None and kind == "get_timeout":  # per queue: not per item
                self._queue(kind, queue).observe(seconds)

    def observe_delivery(self, full_name: str, age_ms: int) -> None:
        """An item was handed to a consumer of ``full_name`` after waiting ``age_ms``."""
        histogram = self.delivered.get(full_name)
        if histogram is None:
            histogram = self.delivered[full_name] = LatencyHistogram()
        histogram.observe(age_ms / 1000)

    def observe_stored(self, queue: str, seconds: float, count: int, nbytes: int) -> None:
        """``count`` puts to ``queue`` (``nbytes`` of data) were acknowledged ``seconds``
        after their batch began (``kestreld.queues.journaled_queue.stored_observer``)."""
        self._queue("set", queue).observe(seconds, count)
        self.put_bytes[queue] = self.put_bytes.get(queue, 0) + nbytes

    def observe_fsync(self, seconds: float) -> None:
        """``kestreld.journal.periodic_sync.fsync_observer``: seconds one fsync took."""
        self.fsync.observe(seconds)

    def delivery(self) -> LatencyHistogram:
        """Every reader's hand-offs together (the server-wide delivery latency)."""
        total = LatencyHistogram()
        for histogram in self.delivered.values():
            total.merge(histogram)
        return total

    def forget(self, alive: set[str]) -> None:
        """Drop the histograms of queues and readers that no longer exist."""
        for by_name in (*self.queues.values(), self.put_bytes):
            for name in [n for n in by_name if n not in alive]:
                del by_name[name]

    def snapshot(self, previous: LatencyHistograms | None = None) -> LatencyHistograms:
        """A frozen copy to encode on another thread while this one keeps counting.

        With ``previous`` (an earlier snapshot, never changed since) a histogram that
        counted nothing since is shared, not copied: the admin port samples every
        few seconds, and most queues of a large server are quiet.
        """
        copy = LatencyHistograms()
        copy.requests = {kind: h.copy() for kind, h in self.requests.items()}
        copy.fsync = self.fsync.copy()
        copy.put_bytes = self.put_bytes.copy()
        for kind, by_name in self.queues.items():
            before = previous.queues[kind] if previous is not None else {}
            frozen = copy.queues[kind]
            for name, histogram in by_name.items():
                old = before.get(name)
                frozen[name] = (
                    old if old is not None and old.count == histogram.count else (histogram.copy())
                )
        copy.delivered = copy.queues["delivery"]
        return copy

    def collect(self) -> Iterator[HistogramMetricFamily]:
        requests = HistogramMetricFamily(
            "kestreld_request_latency_seconds",
            "Time from request to reply: set until STORED (journal written, or fsynced with "
            "sync_journal = 0); get until an item was handed over (get_hit) or the wait ran out "
            "(get_timeout).",
            labels=["op"],
        )
        for kind, histogram in self.requests.items():
            requests.add_metric([kind], histogram.cumulative(), histogram.total)
        yield requests
        fsync = HistogramMetricFamily(
            "kestreld_fsync_latency_seconds",
            "Time one journal fsync took (group commit with sync_journal = 0, or periodic).",
        )
        fsync.add_metric([], self.fsync.cumulative(), self.fsync.total)
        yield fsync
        for kind, (family_name, help_text) in QUEUE_KINDS.items():
            if not family_name:
                continue
            family = HistogramMetricFamily(family_name, help_text, labels=["queue", "reader"])
            for name, histogram in sorted(self.queues[kind].items()):
                queue, _, reader = name.partition("+")
                family.add_metric([queue, reader], histogram.cumulative(), histogram.total)
            yield family
