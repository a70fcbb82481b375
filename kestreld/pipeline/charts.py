"""The PNG charts of ``kestreld analyze`` (matplotlib, Agg backend, 1000x600 px)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

WIDTH_IN, HEIGHT_IN, DPI = 10, 6, 100  # 1000 x 600 pixels


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)


def _integer_axis(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def _save(fig: Any, path: str) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def _empty(ax: Any, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, fontsize=14)
    ax.set_xticks([])
    ax.set_yticks([])


def reader_label(queue: str, reader: str) -> str:
    """``queue/reader``, with ``(default)`` for the default reader."""
    return f"{queue}/{reader or '(default)'}"


#: Up to this many minutes, minutes without items are drawn as 0 (not bridged by a line).
FILL_MINUTES = 20_000


def minute_series(
    points: dict[datetime, int], first: datetime, last: datetime
) -> tuple[list[datetime], list[int]]:
    """Every minute from ``first`` to ``last`` with its count, 0 where ``points`` has none.

    Over more than :data:`FILL_MINUTES` minutes only the minutes with items are kept.
    """
    span = int((last - first).total_seconds() // 60) + 1
    if span > FILL_MINUTES:
        xs = sorted(points)
    else:
        xs = [first + timedelta(minutes=i) for i in range(span)]
    return xs, [points.get(m, 0) for m in xs]


def throughput(per_minute: pa.Table, path: str) -> None:
    """Items per minute, one line per queue; idle minutes are 0, the axis starts at 0."""
    import matplotlib.dates as mdates

    fig, ax = _figure()
    rows = per_minute.to_pylist()
    if not rows:
        _empty(ax, "no items")
    else:
        by_queue: dict[str, dict[datetime, int]] = {}
        for row in rows:
            minute = datetime.strptime(row["minute"], "%Y-%m-%dT%H:%M:%SZ")
            by_queue.setdefault(row["queue"], {})[minute] = row["items"]
        first = min(min(points) for points in by_queue.values())
        last = max(max(points) for points in by_queue.values())
        for queue, points in sorted(by_queue.items()):
            xs, ys = minute_series(points, first, last)
            ax.plot(xs, ys, marker="o" if len(xs) <= 120 else None, label=queue)
        pad = max(timedelta(minutes=1), (last - first) / 20)
        ax.set_xlim(first - pad, last + pad)
        ax.set_ylim(bottom=0, top=max(max(p.values()) for p in by_queue.values()) * 1.1 + 1)
        locator = mdates.AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))
        ax.set_xlabel("minute (UTC)")
        ax.set_ylabel("items per minute")
        _integer_axis(ax.yaxis)
        ax.legend(loc="best", fontsize="small")
    ax.set_title("Throughput: items added per minute")
    _save(fig, path)


def _human(n: int) -> str:
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10}K"
    return str(n)


def _bucket_label(bucket: int) -> str:
    """Bucket 0 is empty items; bucket b holds sizes in [2^(b-1), 2^b)."""
    if bucket == 0:
        return "0"
    lo = 1 << (bucket - 1)
    return f"{_human(lo)}-{_human(2 * lo)}"


def sizes(histogram: pa.Table, path: str) -> None:
    """Item-size distribution: items per power-of-two size bucket, bars per queue."""
    fig, ax = _figure()
    rows = histogram.to_pylist()
    if not rows:
        _empty(ax, "no items")
    else:
        buckets = list(range(min(r["bucket"] for r in rows), max(r["bucket"] for r in rows) + 1))
        queues = sorted({r["queue"] for r in rows})
        counts = {(r["queue"], r["bucket"]): r["items"] for r in rows}
        width = 0.8 / len(queues)
        for i, queue in enumerate(queues):
            xs = [b + (i - (len(queues) - 1) / 2) * width for b in buckets]
            ax.bar(xs, [counts.get((queue, b), 0) for b in buckets], width=width, label=queue)
        ax.set_xticks(buckets)
        ax.set_xticklabels([_bucket_label(b) for b in buckets], rotation=45, ha="right")
        ax.set_xlabel("item size in bytes (bucket [low, high))")
        ax.set_ylabel("items")
        _integer_axis(ax.yaxis)
        ax.legend(loc="best", fontsize="small")
    ax.set_title("Item sizes")
    _save(fig, path)


def lag(consumer_lag: pa.Table, path: str) -> None:
    """Unread items per reader (horizontal bars)."""
    fig, ax = _figure()
    rows = consumer_lag.to_pylist()
    if not rows:
        _empty(ax, "no readers")
    else:
        labels = [reader_label(r["queue"], r["reader"]) for r in rows]
        values = [r["unread_items"] for r in rows]
        ax.barh(range(len(rows)), values)
        ax.set_yticks(range(len(rows)))
        ax.set_yticklabels(labels)
        ax.invert_yaxis()
        for y, v in enumerate(values):
            ax.text(v, y, f" {v}", va="center")
        ax.set_xlabel("unread items")
        ax.set_xlim(0, max(1, *values) * 1.15)  # from 0, room for the labels, even when all are 0
        _integer_axis(ax.xaxis)
    ax.set_title("Consumer lag: unread items per reader")
    _save(fig, path)
