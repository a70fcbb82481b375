"""The live page at ``GET /``: its files (package data in ``static/``, no build step, nothing
from another host) and the figures it polls (``GET /admin/overview.json``).

Each row is a queue or a fanout reader: items, bytes, the oldest item's age, open
reads, waiters, put and get rates with the series behind their sparklines, and the
delivery latency (p50, p99) over the last minute.  Rows come sorted by what needs
attention: ``stalled`` (items wait and nothing was handed out for a minute), then
``growing`` (more items than a minute ago), then the rest, oldest item first.
"""

from __future__ import annotations

from importlib import resources

from kestreld.admin.ostrich import AdminSnapshot
from kestreld.admin.window import MAX_PERIOD, StatsWindow

#: File name -> content type; nothing else is served from static/.
STATIC_FILES = {
    "index.html": "text/html; charset=utf-8",
    "page.css": "text/css; charset=utf-8",
    "page.js": "text/javascript; charset=utf-8",
    "icon.svg": "image/svg+xml",
}

_ORDER = {"stalled": 0, "growing": 1, "busy": 2, "idle": 3, "alias": 4}


def static_file(name: str) -> bytes:
    """One of :data:`STATIC_FILES` (KeyError for anything else)."""
    if name not in STATIC_FILES:
        raise KeyError(name)
    return resources.files("kestreld.admin").joinpath("static", name).read_bytes()


def _attention(items: int, grew: int, taken_last_minute: float) -> str:
    if items and not taken_last_minute:
        return "stalled"
    if grew > 0:
        return "growing"
    return "busy" if items or taken_last_minute else "idle"


def overview(
    snapshot: AdminSnapshot,
    window: StatsWindow,
    now: float,
    server: dict[str, object],
) -> dict[str, object]:
    """The page's document (any thread): ``server`` and ``rows``."""
    baseline = window.baseline(now, MAX_PERIOD)
    earlier_latency = baseline.latency if baseline is not None else None
    earlier_flows = baseline.flows if baseline is not None else {}
    delivery = snapshot.latency.queues["delivery"]
    rows = []
    for name, values in snapshot.stats.queues:
        puts, gets = window.rates(name)
        histogram = delivery.get(name)
        if histogram is not None and earlier_latency is not None:
            histogram = histogram.minus(earlier_latency.queues["delivery"].get(name))
        taken = histogram.count if histogram is not None else 0
        items = int(values.get("items", 0))
        grew = items - earlier_flows[name][2] if name in earlier_flows else 0
        queue, plus, reader = name.partition("+")
        rows.append(
            {
                "name": name,
                "queue": queue,
                "reader": reader if plus else None,
                "items": items,
                "bytes": int(values.get("bytes", 0)),
                "oldest_ms": int(values.get("oldest_item_age", 0)),
                "open_reads": int(values.get("open_transactions", 0)),
                "waiters": int(values.get("waiters", 0)),
                "put_rate": puts[-1] if puts else 0.0,
                "get_rate": gets[-1] if gets else 0.0,
                "put_series": [round(r, 2) for r in puts],
                "get_series": [round(r, 2) for r in gets],
                "delivery_p50_ms": round(histogram.percentile(0.5) * 1000, 1) if taken else None,
                "delivery_p99_ms": round(histogram.percentile(0.99) * 1000, 1) if taken else None,
                "grew": grew,
                "attention": _attention(items, grew, taken),
            }
        )
    for name, values in snapshot.stats.aliases:  # holds nothing: its puts and destinations
        puts, _ = window.rates(name)
        rows.append(
            {
                "name": name,
                "queue": name,
                "reader": None,
                "alias": str(values["children"]).split(","),
                "items": 0,
                "bytes": 0,
                "oldest_ms": 0,
                "open_reads": 0,
                "waiters": 0,
                "put_rate": puts[-1] if puts else 0.0,
                "get_rate": 0.0,
                "put_series": [round(r, 2) for r in puts],
                "get_series": [],
                "delivery_p50_ms": None,
                "delivery_p99_ms": None,
                "grew": 0,
                "attention": "alias",
            }
        )
    rows.sort(key=lambda r: (_ORDER[r["attention"]], -r["oldest_ms"], -r["grew"], r["name"]))  # type: ignore[operator]
    return {"server": server, "rows": rows}
