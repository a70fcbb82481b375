"""The charts of ``kestreld analyze``: what they plot (the data, not the pixels), and that they decode."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("matplotlib")

from kestreld.pipeline import charts  # noqa: E402

T0 = datetime(2026, 11, 21, 14, 5)


def minute(i: int) -> str:
    return (T0 + timedelta(minutes=i)).strftime("%Y-%m-%dT%H:%M:%SZ")


def per_minute(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.Table.from_pylist([{"queue": q, "minute": minute(m), "items": n} for q, m, n in rows])


def steps(fig) -> dict[str, tuple[list[float], list[datetime]]]:
    """queue -> (values, edges) of the step drawn in each panel."""
    import matplotlib.dates as mdates
    from matplotlib.patches import StepPatch

    found = {}
    for ax in fig.axes:
        patches = [p for p in ax.patches if isinstance(p, StepPatch)]
        assert len(patches) == 1, "one step series per panel"
        data = patches[0].get_data()
        edges = [mdates.num2date(e).replace(tzinfo=None) for e in data.edges]
        found[patches[0].get_label()] = ([float(v) for v in data.values], edges)
    return found


def test_throughput_draws_one_step_per_minute_per_queue_in_its_own_panel() -> None:
    fig = charts.throughput_figure(
        per_minute([("jobs", 0, 50_000), ("jobs", 1, 40_000), ("jobs", 3, 7), ("mail", 1, 3)])
    )
    drawn = steps(fig)
    edges = [T0 + timedelta(minutes=i) for i in range(5)]  # minutes 0..3 and the right edge
    assert drawn == {
        "jobs": ([50_000, 40_000, 0, 7], edges),  # idle minute 2 is 0
        "mail": ([0, 3, 0, 0], edges),
    }
    # each panel has its own scale from 0: mail's 3 items fill its panel, not 1/10,000 of it
    tops = {ax.patches[0].get_label(): ax.get_ylim() for ax in fig.axes}
    assert tops["jobs"][0] == tops["mail"][0] == 0
    assert tops["mail"][1] < 10 < 50_000 < tops["jobs"][1]


def test_throughput_ticks_are_whole_utc_minutes_inside_the_data() -> None:
    import matplotlib.dates as mdates

    fig = charts.throughput_figure(per_minute([("jobs", i, 10 + i) for i in range(0, 44, 3)]))
    bottom = fig.axes[-1]
    ticks = [mdates.num2date(t).replace(tzinfo=None) for t in bottom.get_xticks()]
    labels = [t.get_text() for t in bottom.get_xticklabels()]
    assert 2 <= len(ticks) <= charts.MAX_TICKS
    assert all(t.second == 0 and t.minute % 5 == 0 for t in ticks)
    assert T0 <= ticks[0] and ticks[-1] <= T0 + timedelta(minutes=43)
    assert labels == [t.strftime("%H:%M") for t in ticks]
    assert bottom.get_xlabel() == "minute (UTC, 2026-11-21)"
    assert bottom.xaxis.get_offset_text().get_text() == ""  # no offset label past the data


def test_time_ticks_over_a_day_boundary_name_the_date() -> None:
    ticks, fmt = charts.time_ticks(datetime(2026, 11, 21, 22, 0), datetime(2026, 11, 22, 3, 59))
    assert [t.hour for t in ticks] == [22, 23, 0, 1, 2, 3, 4]
    assert fmt == "%m-%d %H:%M"
    ticks, fmt = charts.time_ticks(datetime(2026, 11, 1), datetime(2026, 11, 20))
    assert fmt == "%Y-%m-%d" and all(t.hour == t.minute == 0 for t in ticks)
    assert len(ticks) <= charts.MAX_TICKS


def test_throughput_puts_the_smallest_queues_together_past_the_panel_limit() -> None:
    rows = [(f"q{i}", 0, 100 - i) for i in range(charts.MAX_PANELS + 3)]
    drawn = steps(charts.throughput_figure(per_minute(rows)))
    assert len(drawn) == charts.MAX_PANELS
    assert drawn["4 other queues"][0] == [sum(100 - i for i in range(charts.MAX_PANELS - 1, 9))]


def test_lag_shows_unread_items_beside_the_oldest_unread_age() -> None:
    table = pa.Table.from_pylist(
        [
            {
                "queue": "jobs",
                "reader": "",
                "unread_items": 1200,
                "oldest_unread_age_ms": 5_400_000,
            },
            {"queue": "jobs", "reader": "audit", "unread_items": 3, "oldest_unread_age_ms": 90_000},
            {"queue": "mail", "reader": "", "unread_items": 0, "oldest_unread_age_ms": None},
        ]
    )
    fig = charts.lag_figure(table)
    counts, ages = fig.axes
    assert [p.get_width() for p in counts.patches] == [1200, 3, 0]
    assert [p.get_width() for p in ages.patches] == [90.0, 1.5, 0.0]  # minutes
    assert "min" in ages.get_xlabel()
    assert [t.get_text() for t in counts.get_yticklabels()] == [
        "jobs/(default)", "jobs/audit", "mail/(default)",
    ]  # fmt: skip
    assert [t.get_text().strip() for t in ages.texts] == ["90 min", "90 s", "nothing unread"]


def test_lag_count_ticks_stay_apart_for_big_backlogs() -> None:
    """40,000 unread drew nine ticks as '5000100001500020000...' run together: few, short ticks."""
    table = pa.Table.from_pylist(
        [
            {"queue": "orders", "reader": "billing", "unread_items": 40_000,
             "oldest_unread_age_ms": 900_000},
            {"queue": "orders", "reader": "", "unread_items": 1_999, "oldest_unread_age_ms": 88_000},
        ]
    )  # fmt: skip
    fig = charts.lag_figure(table)
    fig.canvas.draw()
    counts = fig.axes[0]
    labels = [t for t in counts.get_xticklabels() if t.get_text()]
    assert 2 <= len(labels) <= 5
    assert all(len(t.get_text()) <= 5 for t in labels), [t.get_text() for t in labels]
    boxes = sorted(
        (t.get_window_extent() for t in labels if counts.get_xlim()[0] <= t.get_position()[0]
         <= counts.get_xlim()[1]), key=lambda b: b.x0,
    )  # fmt: skip
    assert all(a.x1 < b.x0 for a, b in itertools.pairwise(boxes)), "tick labels overlap"


@pytest.mark.parametrize(
    ("rows", "scale"),
    [
        ([("orders", 10, 80_000), ("emails", 11, 300)], "log"),  # 300 items must stay visible
        ([("a", 3, 50), ("b", 4, 70)], "linear"),
    ],
)
def test_sizes_turns_to_a_log_scale_when_queues_differ_by_orders(rows, scale) -> None:
    table = pa.Table.from_pylist([{"queue": q, "bucket": b, "items": n} for q, b, n in rows])
    (ax,) = charts.sizes_figure(table).axes
    assert ax.get_yscale() == scale
    assert sorted(p.get_height() for p in ax.patches if p.get_height()) == sorted(
        n for _, _, n in rows
    )


def test_compact_counts() -> None:
    assert [charts.compact_count(v) for v in (0, 950, 9_500, 40_000, 12_500, 1_250_000)] == [
        "0", "950", "9,500", "40k", "12.5k", "1.25M",
    ]  # fmt: skip


def test_human_ages() -> None:
    assert [charts.human_ms(v) for v in (None, 850, 42_000, 720_000, 12_600_000, 800_000_000)] == [
        "nothing unread", "850 ms", "42 s", "12 min", "3.5 h", "9.3 d",
    ]  # fmt: skip


@pytest.mark.parametrize("empty", [True, False])
def test_chart_files_decode_and_are_not_blank(tmp_path, empty: bool) -> None:
    import matplotlib.image as mpimg

    rows = [] if empty else [("jobs", i, (i * 7) % 11) for i in range(30)] + [("mail", 3, 2)]
    table = per_minute(rows) if rows else pa.table({"queue": [], "minute": [], "items": []})
    lag = pa.Table.from_pylist(
        []
        if empty
        else [{"queue": "jobs", "reader": "", "unread_items": 4, "oldest_unread_age_ms": 1000}]
    )
    charts.throughput(table, str(tmp_path / "throughput.png"))
    charts.lag(lag, str(tmp_path / "lag.png"))
    for name in ("throughput.png", "lag.png"):
        image = mpimg.imread(tmp_path / name)
        assert image.shape[:2] == (600, 1000)
        assert image.std() > 0.02, f"{name} looks blank"
