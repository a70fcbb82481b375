"""The live page at ``GET /``: its files (package data in ``static/``, no build step, nothing
from another host) and the figures it polls (``GET /admin/overview.json``).

Each row is a queue or a fanout reader: items, bytes, the oldest item's age, open
reads, waiters, put and get rates with the series behind their sparklines, and the
delivery latency (p50, p99) over the last minute.  Each row has a state
(:func:`attention`, defined in :data:`STATES`; docs/operations.md quotes the same
words) and rows come sorted by it, then oldest item first.
"""

from __future__ import annotations

from enum import StrEnum
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

#: Seconds a queue must be seen with items waiting and nothing handed out to be stalled.
STALL_SECONDS = MAX_PERIOD


class Attention(StrEnum):
    """A row's state, most in need of attention first."""

    STALLED = "stalled"
    GROWING = "growing"
    BUSY = "busy"
    IDLE = "idle"
    ALIAS = "alias"


#: What each state means: the page shows it on the state's badge, and docs/operations.md
#: says the same words (a test holds them to it).
STATES: dict[Attention, str] = {
    Attention.STALLED: (
        "items wait, the oldest has waited at least a minute, and nothing was handed out "
        "in the last minute (never in the server's first minute: it has not watched that long)"
    ),
    Attention.GROWING: (
        "more items than a minute ago (than at start-up, in the server's first minute)"
    ),
    Attention.BUSY: "items wait or were handed out in the last minute, and none of the above",
    Attention.IDLE: "empty, and nothing handed out in the last minute",
    Attention.ALIAS: "an alias: it holds nothing, its puts go to its destinations",
}

_ORDER = {state: i for i, state in enumerate(Attention)}
_NONE = (0, 0, 0)  # the flows (put, handed out, items) of a queue not yet sampled


def static_file(name: str) -> bytes:
    """One of :data:`STATIC_FILES` (KeyError for anything else)."""
    if name not in STATIC_FILES:
        raise KeyError(name)
    return resources.files("kestreld.admin").joinpath("static", name).read_bytes()


def attention(items: int, oldest_ms: int, taken: int, grew: int, watched: float) -> Attention:
    """The state of a queue or reader (:data:`STATES` says it in words).

    ``items`` wait now, the oldest for ``oldest_ms``; ``taken`` were handed out and
    ``grew`` more items wait than ``watched`` seconds ago, the window the admin
    port's samples cover (up to a minute, less in the server's first minute).
    """
    stalled_ms = STALL_SECONDS * 1000
    if items and oldest_ms >= stalled_ms and not taken and watched >= STALL_SECONDS:
        return Attention.STALLED
    if grew > 0:
        return Attention.GROWING
    return Attention.BUSY if items or taken else Attention.IDLE


def overview(
    snapshot: AdminSnapshot,
    window: StatsWindow,
    now: float,
    server: dict[str, object],
) -> dict[str, object]:
    """The page's document (any thread): ``server`` and ``rows``."""
    baseline = window.baseline(now, MAX_PERIOD)
    watched = now - baseline.at if baseline is not None else 0.0
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
        oldest_ms = int(values.get("oldest_item_age", 0))
        # A queue created since the window began had no items then.
        grew = items - earlier_flows.get(name, _NONE)[2] if baseline is not None else 0
        queue, plus, reader = name.partition("+")
        rows.append(
            {
                "name": name,
                "queue": queue,
                "reader": reader if plus else None,
                "items": items,
                "bytes": int(values.get("bytes", 0)),
                "oldest_ms": oldest_ms,
                "open_reads": int(values.get("open_transactions", 0)),
                "waiters": int(values.get("waiters", 0)),
                "put_rate": puts[-1] if puts else 0.0,
                "get_rate": gets[-1] if gets else 0.0,
                "put_series": [round(r, 2) for r in puts],
                "get_series": [round(r, 2) for r in gets],
                "delivery_p50_ms": round(histogram.percentile(0.5) * 1000, 1) if taken else None,
                "delivery_p99_ms": round(histogram.percentile(0.99) * 1000, 1) if taken else None,
                "grew": grew,
                "attention": attention(items, oldest_ms, taken, grew, watched).value,
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
                "attention": Attention.ALIAS.value,
            }
        )
    rows.sort(key=lambda r: (_ORDER[r["attention"]], -r["oldest_ms"], -r["grew"], r["name"]))  # type: ignore[operator]
    states = {state.value: meaning for state, meaning in STATES.items()}
    return {"server": server, "rows": rows, "states": states}
