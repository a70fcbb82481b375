"""The PNG charts of ``kestreld analyze`` (matplotlib, Agg backend, 1000x600 px)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

WIDTH_IN, HEIGHT_IN, DPI = 10, 6, 100  # 1000 x 600 pixels
#: sizes.png turns to a log scale when its biggest bar is this many times its smallest.
LOG_SCALE_RATIO = 100


def _figure() -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)


def _integer_axis(axis: Any) -> None:
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def compact_count(n: float) -> str:
    """A count for an axis tick: ``950``, ``9,500``, ``40k``, ``1.2M``."""
    n = int(n)
    if abs(n) < 10_000:
        return f"{n:,}"
    if abs(n) < 1_000_000:
        return f"{n / 1000:g}k"
    return f"{n / 1_000_000:.3g}M"


def _count_axis(axis: Any) -> None:
    """Whole-number ticks, few enough and short enough not to run into each other."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(nbins=4, integer=True))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: compact_count(value)))


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


#: Up to this many minutes (about 2 years) every minute is drawn, idle ones as 0;
#: over a longer span only the minutes with items are drawn.
FILL_MINUTES = 1_000_000

#: Queues drawn in a panel of their own; the smallest of the rest share one panel.
MAX_PANELS = 6

#: Tick spacings in minutes, from a minute to a week (whole minutes, hours, days).
TICK_MINUTES = (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440, 2880, 10080)
MAX_TICKS = 8

ONE_MINUTE = timedelta(minutes=1)


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


def time_ticks(first: datetime, last: datetime) -> tuple[list[datetime], str]:
    """At most :data:`MAX_TICKS` ticks on whole minutes/hours/days in ``[first, last + 1 min]``,
    and their ``strftime`` format (the date is added when the span crosses midnight)."""
    end = last + ONE_MINUTE  # the right edge of the last minute's bar
    span = (end - first).total_seconds() / 60
    step = next((m for m in TICK_MINUTES if span / m <= MAX_TICKS), None)
    if step is None:  # longer than 8 weeks: whole weeks
        step = 10080 * int(span // (10080 * MAX_TICKS) + 1)
    midnight = first.replace(hour=0, minute=0, second=0, microsecond=0)
    offset = (first - midnight).total_seconds() / 60
    tick = midnight + timedelta(minutes=-(-offset // step) * step)  # first multiple >= first
    ticks = []
    while tick <= end:
        ticks.append(tick)
        tick += timedelta(minutes=step)
    same_day = first.date() == last.date()
    if step >= 1440:
        fmt = "%Y-%m-%d"
    elif same_day:
        fmt = "%H:%M"
    else:
        fmt = "%m-%d %H:%M"
    return ticks, fmt


def _minute_points(per_minute: pa.Table) -> dict[str, dict[datetime, int]]:
    """queue -> minute (naive UTC) -> items."""
    by_queue: dict[str, dict[datetime, int]] = {}
    for row in per_minute.to_pylist():
        minute = datetime.strptime(row["minute"], "%Y-%m-%dT%H:%M:%SZ")
        by_queue.setdefault(row["queue"], {})[minute] = row["items"]
    return by_queue


def _panels(by_queue: dict[str, dict[datetime, int]]) -> list[tuple[str, dict[datetime, int]]]:
    """One panel per queue, busiest first; past :data:`MAX_PANELS` the rest are summed."""
    ranked = sorted(by_queue.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))
    if len(ranked) <= MAX_PANELS:
        return ranked
    shown, rest = ranked[: MAX_PANELS - 1], ranked[MAX_PANELS - 1 :]
    summed: dict[datetime, int] = {}
    for _, points in rest:
        for minute, items in points.items():
            summed[minute] = summed.get(minute, 0) + items
    return shown + [(f"{len(rest)} other queues", summed)]


def throughput_figure(per_minute: pa.Table) -> Any:
    """Items added per minute: one panel per queue, each with its own scale from 0.

    Each panel is a step per minute (a bar one minute wide, idle minutes 0), so
    a queue taking 10 items a minute is as readable as one taking 100,000 beside it.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    by_queue = _minute_points(per_minute)
    if not by_queue:
        fig, ax = _figure()
        _empty(ax, "no items")
        ax.set_title("Throughput: items added per minute")
        return fig
    panels = _panels(by_queue)
    first = min(min(points) for points in by_queue.values())
    last = max(max(points) for points in by_queue.values())
    fig, axes = plt.subplots(
        len(panels), 1, sharex=True, squeeze=False, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (ax, (queue, points)) in enumerate(zip(axes[:, 0], panels, strict=True)):
        xs, ys = minute_series(points, first, last)
        color = colors[i % len(colors)]
        if len(xs) == int((last - first).total_seconds() // 60) + 1:
            edges = xs + [xs[-1] + ONE_MINUTE]
            ax.stairs(ys, edges, fill=True, color=color, alpha=0.85, label=queue)
        else:  # a very long span: one bar per minute with items
            ax.bar(xs, ys, width=ONE_MINUTE, align="edge", color=color, label=queue)
        total, peak = sum(ys), max(ys)
        ax.text(
            0.005,
            0.95,
            f"{queue}: {total:,} items, peak {peak:,}/min",
            transform=ax.transAxes,
            ha="left",
            va="top",
            fontsize="small",
            bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
        )
        ax.set_ylim(0, peak * 1.25 + 1)
        ax.yaxis.set_major_locator(MaxNLocator(nbins=3, integer=True))
        ax.grid(axis="y", alpha=0.3)
    ticks, fmt = time_ticks(first, last)
    bottom = axes[-1, 0]
    pad = max(ONE_MINUTE / 2, (last + ONE_MINUTE - first) / 50)
    bottom.set_xlim(first - pad, last + ONE_MINUTE + pad)
    bottom.set_xticks(ticks)
    bottom.set_xticklabels([t.strftime(fmt) for t in ticks])
    day = "" if "%d" in fmt else f", {first:%Y-%m-%d}"
    bottom.set_xlabel(f"minute (UTC{day})")
    fig.supylabel("items per minute")
    fig.suptitle("Throughput: items added per minute, per queue")
    return fig


def throughput(per_minute: pa.Table, path: str) -> None:
    """Write :func:`throughput_figure` to ``path``."""
    _save(throughput_figure(per_minute), path)


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


def sizes_figure(histogram: pa.Table) -> Any:
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
        nonzero = [n for n in counts.values() if n > 0]
        if nonzero and max(nonzero) >= LOG_SCALE_RATIO * min(nonzero):
            # A queue of a few hundred items stays visible beside one of a million.
            ax.set_yscale("log")
            ax.set_ylabel("items (log scale)")
        else:
            ax.set_ylabel("items")
            _count_axis(ax.yaxis)
        ax.legend(loc="best", fontsize="small")
    ax.set_title("Item sizes")
    return fig


def sizes(histogram: pa.Table, path: str) -> None:
    """Write :func:`sizes_figure` to ``path``."""
    _save(sizes_figure(histogram), path)


def human_ms(ms: int | None) -> str:
    """An age for people: ``850 ms``, ``42 s``, ``12 min``, ``3.5 h``, ``9.2 d``."""
    if ms is None:
        return "nothing unread"
    if ms < 1000:
        return f"{ms} ms"
    seconds = ms / 1000
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


#: Age axis units: (limit in ms up to which the unit is used, divisor, label).
_AGE_UNITS = ((120_000, 1000, "s"), (7_200_000, 60_000, "min"), (172_800_000, 3_600_000, "h"))


def lag_figure(consumer_lag: pa.Table) -> Any:
    """Per reader: unread items (left) beside the age of its oldest unread item (right)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = consumer_lag.to_pylist()
    if not rows:
        fig, ax = _figure()
        _empty(ax, "no readers")
        ax.set_title("Consumer lag")
        return fig
    fig, (left, right) = plt.subplots(1, 2, sharey=True, figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    labels = [reader_label(r["queue"], r["reader"]) for r in rows]
    ys = list(range(len(rows)))
    counts = [r["unread_items"] for r in rows]
    left.barh(ys, counts, color="tab:blue")
    for y, v in zip(ys, counts, strict=True):
        left.text(v, y, f" {v:,}", va="center", fontsize="small")
    left.set_yticks(ys)
    left.set_yticklabels(labels)
    left.invert_yaxis()
    left.set_xlim(0, max(1, *counts) * 1.25)  # from 0, room for the labels, even when all are 0
    _count_axis(left.xaxis)
    left.set_xlabel("unread items")
    left.set_title("Unread items")

    ages = [r["oldest_unread_age_ms"] for r in rows]
    oldest = max((a for a in ages if a is not None), default=0)
    _, divisor, unit = next((u for u in _AGE_UNITS if oldest < u[0]), (None, 86_400_000, "d"))
    values = [(a or 0) / divisor for a in ages]
    right.barh(ys, values, color="tab:orange")
    for y, v, a in zip(ys, values, ages, strict=True):
        right.text(v, y, f" {human_ms(a)}", va="center", fontsize="small")
    right.set_xlim(0, max(1, *values) * 1.3)
    right.set_xlabel(f"age of the oldest unread item ({unit})")
    right.set_title("Oldest unread item")
    fig.suptitle("Consumer lag per reader (queue/reader)")
    return fig


def lag(consumer_lag: pa.Table, path: str) -> None:
    """Write :func:`lag_figure` to ``path``."""
    _save(lag_figure(consumer_lag), path)
