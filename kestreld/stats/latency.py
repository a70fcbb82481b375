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
from dataclasses import dataclass, field

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

#: Upper bounds in seconds: 50 µs (an immediate hit) up to a minute (a long blocking get).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip

#: The kinds the connection reports through ``Server.latency_observer``.
REQUEST_KINDS = ("set", "get_hit", "get_timeout")


@dataclass(slots=True)
class LatencyHistogram:
    """Counts per bucket (the last one is +Inf) and the sum of observed seconds."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    total: float = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bucket (le = "<=").
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def copy(self) -> LatencyHistogram:
        return LatencyHistogram(self.bounds, self.counts.copy(), self.total)

    def cumulative(self) -> list[tuple[str, int]]:
        """(le, count of observations <= le) pairs, ending with +Inf, as Prometheus wants."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((floatToGoString(bound), running))
        return out


class LatencyHistograms(Collector):
    """The server's latency histograms, and the observers that feed them."""

    def __init__(self) -> None:
        self.requests: dict[str, LatencyHistogram] = {
            kind: LatencyHistogram() for kind in REQUEST_KINDS
        }
        self.fsync = LatencyHistogram()

    def observe_request(self, kind: str, seconds: float) -> None:
        """``Server.latency_observer``: (``set`` | ``get_hit`` | ``get_timeout``, seconds)."""
        histogram = self.requests.get(kind)
        if histogram is not None:
            histogram.observe(seconds)

    def observe_fsync(self, seconds: float) -> None:
        """``kestreld.journal.periodic_sync.fsync_observer``: seconds one fsync took."""
        self.fsync.observe(seconds)

    def snapshot(self) -> LatencyHistograms:
        """A frozen copy to encode on another thread while this one keeps counting."""
        copy = LatencyHistograms()
        copy.requests = {kind: h.copy() for kind, h in self.requests.items()}
        copy.fsync = self.fsync.copy()
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
