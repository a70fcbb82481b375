"""Samples of the server's figures every few seconds: the baseline of ``/stats.json?period=N``
(counters as deltas, metrics over the window) and the put and get rates of the live page.

Every :data:`SAMPLE_SECONDS` the admin server takes a :class:`Sample` on the event loop:
the ostrich counters (a dict of ints), a copy of the latency histograms, and per queue
and reader the running totals of items put and handed out.  The counters and histograms
of the last :data:`MAX_PERIOD` seconds are kept (they cost memory per queue); the put
and get totals of the last :data:`RATE_HISTORY` seconds, for the sparklines.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from kestreld.stats.latency import LatencyHistograms

#: Seconds between samples: the resolution of ``period`` and of the page's rates.
SAMPLE_SECONDS = 5.0
#: The longest ``period`` (seconds) /stats.json accepts; ostrich's usual one is 60.
MAX_PERIOD = 60
#: Seconds of put and get totals kept for the sparklines.
RATE_HISTORY = 600


@dataclass(slots=True)
class Sample:
    at: float  # monotonic seconds
    #: Ostrich counter name -> value; None once older than MAX_PERIOD (memory).
    counters: dict[str, int] | None
    latency: LatencyHistograms | None
    #: Queue or reader name -> (items put so far, items handed out so far, items waiting).
    flows: dict[str, tuple[int, int, int]]


class StatsWindow:
    """The samples, oldest first."""

    def __init__(self) -> None:
        self.samples: deque[Sample] = deque()

    def add(self, sample: Sample) -> None:
        samples = self.samples
        samples.append(sample)
        while samples and samples[0].at < sample.at - RATE_HISTORY - SAMPLE_SECONDS:
            samples.popleft()
        keep_after = sample.at - MAX_PERIOD - 2 * SAMPLE_SECONDS
        for old in samples:
            if old.at >= keep_after:
                break
            old.counters = None
            old.latency = None

    def baseline(self, now: float, period: float) -> Sample | None:
        """The sample a window of ``period`` seconds ending ``now`` starts from: the newest
        taken at least ``period`` seconds ago, else the oldest kept (a younger server)."""
        best = None
        for sample in self.samples:
            if sample.counters is None:
                continue
            if sample.at <= now - period or best is None:
                best = sample
            else:
                break
        return best

    def rates(self, name: str) -> tuple[list[float], list[float]]:
        """Items put and handed out per second between consecutive samples, oldest first."""
        puts: list[float] = []
        gets: list[float] = []
        previous = None
        for sample in self.samples:
            flow = sample.flows.get(name)
            if previous is not None and flow is not None and previous[1] is not None:
                seconds = max(sample.at - previous[0], 0.001)
                before = previous[1]
                puts.append(max(0, flow[0] - before[0]) / seconds)
                gets.append(max(0, flow[1] - before[1]) / seconds)
            previous = (sample.at, flow)
        return puts, gets
