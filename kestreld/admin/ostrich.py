"""``/stats.json`` as ostrich served it for Kestrel 2.4: ``counters``, ``gauges``,
``metrics`` and ``labels``, under Kestrel's stat names (``q/<queue>/items`` ...).

Names are Kestrel's where kestreld has the figure (see docs/operations.md for the
list).  ``metrics`` are distributions: ``count`` always; ``sum``, ``minimum``,
``maximum``, ``average`` and the percentiles ``p50`` ... ``p9999`` once something was
observed, in the unit the name ends with (``_usec``, ``_msec``), as ostrich printed them.

With a :class:`~kestreld.admin.window.Sample` as baseline (``?period=N``) counters are
the deltas since it and metrics hold only what was observed since it; gauges and labels
are current either way.  ``filters`` (``stats_filters``, ``?filtered=1``) leave out
every name one of the regular expressions matches whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kestreld.stats.collector import StatsSnapshot
from kestreld.stats.latency import LatencyHistogram, LatencyHistograms

if TYPE_CHECKING:
    from kestreld.queues.collection import QueueCollection

#: Global counters: ostrich name -> ``stats`` key.
GLOBAL_COUNTERS = {
    "total_connections": "total_connections",
    "cmd_get": "cmd_get",
    "cmd_set": "cmd_set",
    "cmd_peek": "cmd_peek",
    "get_hits": "get_hits",
    "get_misses": "get_misses",
    "bytes_read": "bytes_read",
    "bytes_written": "bytes_written",
    "total_items": "total_items",
    "queue_creates": "queue_creates",
    "queue_deletes": "queue_deletes",
    "queue_expires": "queue_expires",
}
#: Global gauges: ostrich name -> ``stats`` key.
GLOBAL_GAUGES = {
    "items": "curr_items",
    "bytes": "bytes",
    "reserved_memory_ratio": "reserved_memory_ratio",
    "connections": "curr_connections",
    "uptime": "uptime",
}
#: A box's gauges (``workers = N``): its workers, and those whose figures are in the totals.
BOX_GAUGES = ("workers", "workers_answering")
#: Per-queue counters (``q/<name>/...``): ostrich name -> ``stats`` key.
QUEUE_COUNTERS = {
    "total_items": "total_items",
    "put_items": "total_items",
    "expired_items": "expired_items",
    "discarded": "discarded",
    "transactions": "transactions",
    "canceled_transactions": "canceled_transactions",
    "total_flushes": "total_flushes",
    "journal_rewrites": "journal_rewrites",
    "journal_rotations": "journal_rotations",
}
#: Per-queue gauges: ostrich name -> ``stats`` key.  Kestrel's ``age_msec`` grew while the
#: head waited: kestreld's ``oldest_item_age`` is that figure.
QUEUE_GAUGES = {
    "items": "items",
    "bytes": "bytes",
    "journal_size": "logsize",
    "mem_items": "mem_items",
    "mem_bytes": "mem_bytes",
    "age_msec": "oldest_item_age",
    "waiters": "waiters",
    "open_transactions": "open_transactions",
}
#: Server-wide metrics: ostrich name -> (histogram in LatencyHistograms, unit per second).
_USEC, _MSEC = 1_000_000, 1_000
PERCENTILES = (("p50", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99), ("p999", 0.999),
               ("p9999", 0.9999))  # fmt: skip
#: Per-queue metrics: ostrich suffix -> (QUEUE_KINDS kind, unit per second).
QUEUE_METRICS = {
    "set_latency_usec": ("set", _USEC),
    "get_timeout_msec": ("get_timeout", _MSEC),
    "delivery_latency_msec": ("delivery", _MSEC),
}


def global_metrics(latency: LatencyHistograms) -> dict[str, tuple[LatencyHistogram, int]]:
    return {
        "set_latency_usec": (latency.requests["set"], _USEC),
        "get_hit_latency_usec": (latency.requests["get_hit"], _USEC),
        "get_timeout_msec": (latency.requests["get_timeout"], _MSEC),
        "delivery_latency_msec": (latency.delivery(), _MSEC),
        "fsync_delay_usec": (latency.fsync, _USEC),
    }


def queue_metrics(
    latency: LatencyHistograms, names: Iterable[str]
) -> dict[str, tuple[LatencyHistogram, int]]:
    out = {}
    for name in names:
        for suffix, (kind, unit) in QUEUE_METRICS.items():
            histogram = latency.queues[kind].get(name)
            if histogram is not None:
                out[f"q/{name}/{suffix}"] = (histogram, unit)
    return out


def distribution(histogram: LatencyHistogram, unit: int) -> dict[str, int]:
    """Ostrich's ``Distribution.toMap``: count, and the rest once anything was observed."""
    out = {"count": histogram.count}
    if histogram.count:
        out["sum"] = int(histogram.total * unit)
        out["minimum"] = int(histogram.low * unit)
        out["maximum"] = int(histogram.high * unit)
        out["average"] = int(histogram.total * unit / histogram.count)
        for key, fraction in PERCENTILES:
            out[key] = int(histogram.percentile(fraction) * unit)
    return dict(sorted(out.items()))


def queue_limits(queues: QueueCollection) -> dict[str, tuple[int | None, int | None]]:
    """Each queue's and reader's (max_items, max_size), for ``/stats.json``."""
    limits = {}
    for q in queues.queues.values():
        for r in q.readers.values():
            limits[r.full_name] = (r.config.max_items, r.config.max_size)
        if "" not in q.readers:
            limits[q.name] = (q.config.max_items, q.config.max_size)
    return limits


@dataclass(slots=True, frozen=True)
class AdminSnapshot:
    """Everything /stats.json, the page and a sample need, read on the event loop."""

    stats: StatsSnapshot
    latency: LatencyHistograms  # a copy
    limits: dict[str, tuple[int | None, int | None]]  # name -> (max_items, max_size)

    def global_values(self) -> dict[str, object]:
        return dict(self.stats.server)

    def counters(self) -> dict[str, int]:
        server = self.global_values()
        out = {name: int(server[key]) for name, key in GLOBAL_COUNTERS.items()}  # type: ignore[call-overload]
        put_bytes = self.latency.put_bytes
        delivered = self.latency.queues["delivery"]
        for name, values in self.stats.queues:
            prefix = f"q/{name}/"
            for suffix, key in QUEUE_COUNTERS.items():
                out[prefix + suffix] = int(values.get(key, 0))
            out[prefix + "put_bytes"] = put_bytes.get(name, 0)
            histogram = delivered.get(name)
            out[prefix + "get_items_hit"] = histogram.count if histogram is not None else 0
        for name, values in self.stats.aliases:  # Kestrel's AliasedQueue: puts only
            out[f"q/{name}/put_items"] = int(values["put_items"])  # type: ignore[call-overload]
            out[f"q/{name}/put_bytes"] = int(values["put_bytes"])  # type: ignore[call-overload]
        return out

    def gauges(self) -> dict[str, int | float]:
        server = self.global_values()
        out: dict[str, int | float] = {}
        for name, key in GLOBAL_GAUGES.items():
            value = float(server[key])  # type: ignore[arg-type]
            out[name] = int(value) if value.is_integer() else value
        for key in BOX_GAUGES:  # a box's (workers = N): did every worker answer?
            if key in server:
                out[key] = int(server[key])  # type: ignore[call-overload]
        for name, values in self.stats.queues:
            prefix = f"q/{name}/"
            for suffix, key in QUEUE_GAUGES.items():
                out[prefix + suffix] = int(values.get(key, 0))
            max_items, max_size = self.limits.get(name, (None, None))
            if max_items is not None:
                out[prefix + "max_items"] = max_items
            if max_size is not None:
                out[prefix + "max_bytes"] = max_size
        return out

    def labels(self) -> dict[str, str]:
        server = self.global_values()
        out = {"version": str(server["version"]), "status": self.stats.status.value}
        for name, values in self.stats.aliases:  # where an alias's puts go
            out[f"q/{name}/children"] = str(values["children"])
        return out

    def metrics(self) -> dict[str, tuple[LatencyHistogram, int]]:
        out = global_metrics(self.latency)
        out.update(queue_metrics(self.latency, (name for name, _ in self.stats.queues)))
        return out


def _delta(old: int, new: int) -> int:
    """Ostrich's ``Stats.delta``: a counter that went down was reset, so it counts from 0."""
    return new - old if new >= old else new


def summary(
    snapshot: AdminSnapshot,
    baseline_counters: dict[str, int] | None = None,
    baseline_latency: LatencyHistograms | None = None,
    filters: tuple[str, ...] = (),
) -> dict[str, dict]:
    """The /stats.json document: counters, metrics, gauges, labels (any thread)."""
    counters = snapshot.counters()
    if baseline_counters is not None:
        counters = {k: _delta(baseline_counters.get(k, 0), v) for k, v in counters.items()}
    metrics = {}
    earlier = (
        dict(
            global_metrics(baseline_latency),
            **queue_metrics(baseline_latency, (n for n, _ in snapshot.stats.queues)),
        )
        if baseline_latency is not None
        else {}
    )
    for name, (histogram, unit) in snapshot.metrics().items():
        if baseline_latency is not None:
            before = earlier.get(name)
            histogram = histogram.minus(before[0] if before is not None else None)
        metrics[name] = distribution(histogram, unit)
    doc = {
        "counters": dict(sorted(counters.items())),
        "metrics": dict(sorted(metrics.items())),
        "gauges": dict(sorted(snapshot.gauges().items())),
        "labels": dict(sorted(snapshot.labels().items())),
    }
    if filters:
        pattern = re.compile("|".join(f"(?:{f})" for f in filters))
        doc = {
            section: {k: v for k, v in values.items() if not pattern.fullmatch(k)}
            for section, values in doc.items()
        }
    return doc


def render_text(value: object) -> str:
    """Ostrich's ``.txt`` form: ``key: value`` lines, nested maps indented two spaces."""
    return "\n".join(_lines(value)) + "\n"


def _lines(value: object) -> list[str]:
    if isinstance(value, dict):
        out = []
        for key in sorted(value, key=str):
            inner = _lines(value[key])
            if len(inner) == 1 and ": " not in inner[0]:
                out.append(f"{key}: {inner[0]}")
            else:
                out.append(f"{key}:")
                out.extend("  " + line for line in inner)
        return out
    if isinstance(value, list | tuple):
        return [line for item in value for line in _lines(item)]
    if isinstance(value, float) and value.is_integer():
        return [str(int(value))]
    if value is None:
        return ["null"]
    return [str(value)]
