"""What the admin port serves from the stats layer: Prometheus ``/metrics`` and the flat
``/flat_stats.json`` (the ``stats`` figures as one JSON object; it was ``/stats.json``
until that path took ostrich's shape).  The HTTP server is :mod:`kestreld.admin.http`.

The figures are read on the event loop, on the thread that owns the queues, exactly
like the ``stats`` command (:class:`StatsSnapshot`).  The expensive part, building and
encoding thousands of samples, runs from that snapshot on any thread.

- ``/metrics``: every ``stats`` figure (see :mod:`kestreld.stats.collector`), the
  latency histograms (:mod:`kestreld.stats.latency`) and the process metrics, in the
  format the scraper asks for (Prometheus text, or OpenMetrics), gzipped when it
  accepts gzip.
- ``/flat_stats.json``: the global keys, ``status``, and ``queues`` mapping each queue
  (and ``q+r`` reader) to its keys.
"""

from __future__ import annotations

import gzip
import json

from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from kestreld.stats.collector import StatsCollector, StatsSnapshot
from kestreld.stats.latency import LatencyHistograms

#: (status, content type, body, extra headers)
Response = tuple[int, str, bytes, list[str]]


class PrometheusExposition:
    """``/metrics`` of one server: its figures, latency histograms and process metrics."""

    def __init__(self) -> None:
        self._process = ProcessCollector(registry=None)
        self._platform = PlatformCollector(registry=None)

    def registry(
        self,
        snapshot: StatsSnapshot,
        latency: LatencyHistograms,
        processes: Collector | None = None,
    ) -> CollectorRegistry:
        """Everything ``/metrics`` shows, for one snapshot; ``processes``: the process
        figures to show instead of this process's (a box's workers')."""
        registry = CollectorRegistry(auto_describe=False)
        process = self._process if processes is None else processes
        for collector in (StatsCollector(snapshot), latency, process, self._platform):
            registry.register(collector)
        return registry

    def render(
        self,
        snapshot: StatsSnapshot,
        latency: LatencyHistograms,
        headers: dict[str, str],
        processes: Collector | None = None,
    ) -> Response:
        """``/metrics`` in the format the scraper accepts (any thread)."""
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry(snapshot, latency, processes))
        extra = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            extra.append("Content-Encoding: gzip")
        return 200, content_type, body, extra


def render_flat_stats_json(snapshot: StatsSnapshot) -> Response:
    """``/flat_stats.json``: the global keys, ``status``, and ``queues`` (any thread)."""
    doc: dict[str, object] = {}
    for key, value in snapshot.server:
        doc[key] = float(value) if key == "reserved_memory_ratio" else value  # type: ignore[arg-type]
    doc["status"] = snapshot.status.value
    if snapshot.zookeeper_connected is not None:
        doc["zookeeper_connected"] = snapshot.zookeeper_connected
    doc["queues"] = dict(snapshot.queues)
    body = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
    return 200, "application/json", body, []
