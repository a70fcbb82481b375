"""The tables every command prints (text or Markdown) and the targets, read from measured rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kestreld.bench.workloads import Row


@dataclass(slots=True)
class Table:
    """A header and rows of cells; ``render`` prints it as aligned text or as Markdown."""

    header: Sequence[str]
    rows: list[list[str]]

    def render(self, markdown: bool = False) -> str:
        if markdown:
            lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
            return "\n".join(
                lines
                + ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in self.rows]
            )
        widths = [
            max(len(c) for c in column) for column in zip(self.header, *self.rows, strict=True)
        ]
        lines = [self.header, ["-" * w for w in widths], *self.rows]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in lines
        )


# --- numbers --------------------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _lat(row: Row) -> str:
    p99 = _n(row.p99_ms)
    if row.runs > 1:
        p99 += f" ({_n(row.p99_range[0])}-{_n(row.p99_range[1])})"
    return f"{_n(row.p50_ms)} / {p99} / {_n(row.max_ms)}"


def _cpu(row: Row) -> str:
    """Server CPU per op; with several runs, the median and (min-max)."""
    if row.runs > 1:
        lo, hi = row.server_us_range
        return f"{_n(row.server_us)} ({_n(lo)}-{_n(hi)})"
    return _n(row.server_us)


def _cells(rows: Sequence[Row | None], cell: Callable[[Row], str]) -> list[str]:
    """A cell per server's row; "-" where the server did not run the workload."""
    return [cell(r) if r else "-" for r in rows]


def _each(rows: Sequence[Row | None], cell: Callable[[Row], str], sep: str = " / ") -> str:
    return sep.join(_cells(rows, cell))


# --- rows of one server, and side by side -------------------------------------------------------

ROW_COLUMNS = ("workload", "server", "ops/s", "p50/p99/max ms", "srv us/op", "srv cores",
               "RSS MiB", "cli us/op", "cli cores", "others", "check")  # fmt: skip


def rows_table(rows: list[Row]) -> Table:
    return Table(
        ROW_COLUMNS,
        [
            [
                r.description,
                r.server,
                f"{_n(r.rate)} {r.unit}s",
                _lat(r),
                _cpu(r),
                f"{r.server_cores:.2f}",
                f"{r.rss_mib:.1f}",
                _n(r.client_us),
                f"{r.client_cores:.2f}",
                f"{r.others_cores:.2f}",
                r.check + (f"; {r.errors} errors: {r.error_samples[:2]}" if r.errors else ""),
            ]
            for r in rows
        ],
    )


def by_workload(rows: list[Row], servers: tuple[str, ...]) -> list[list[Row | None]]:
    """Per workload, in the order first measured: each server's row (None: it did not run it)."""
    runs: dict[str, dict[str, Row]] = {}
    for r in rows:
        runs.setdefault(r.key, {})[r.server] = r
    return [[each.get(s) for s in servers] for each in runs.values()]


COMPARE_COLUMNS = ("workload", "kestreld ops/s", "memcached ops/s", "k p50/p99/max ms",
                   "m p50/p99/max ms", "k srv us/op", "m srv us/op", "CPU/op k/m", "p99 k/m",
                   "k RSS MiB", "m RSS MiB", "cli cores k/m", "others k/m", "check")  # fmt: skip


def compare_table(rows: list[Row]) -> Table:
    """kestreld and memcached side by side, with the ratios."""
    cells = []
    for k, m in by_workload(rows, ("kestreld", "memcached")):
        both = (k, m)
        ref = k or m
        assert ref is not None
        cells.append(
            [
                ref.description + (f" ({m.note})" if m and m.note else ""),
                *_cells(both, lambda r: _n(r.rate)),
                *_cells(both, _lat),
                *_cells(both, _cpu),
                _ratio(k.server_us, m.server_us) if k and m else "-",
                _ratio(k.p99_ms, m.p99_ms) if k and m else "-",
                *_cells(both, lambda r: f"{r.rss_mib:.1f}"),
                _each(both, lambda r: f"{r.client_cores:.2f}", "/") if k else "-",
                _each(both, lambda r: f"{r.others_cores:.2f}", "/") if k else "-",
                (k.check if k else "-")
                + (f"; {k.errors} errors" if k and k.errors else "")
                + (f"; memcached {m.errors} errors" if m and m.errors else ""),
            ]
        )
    return Table(COMPARE_COLUMNS, cells)


DARNER_COLUMNS = ("workload", "kestreld us/op", "Darner us/op", "memcached us/op",
                  "CPU/op k/Darner", "CPU/op k/m", "ops/s k / Darner / m", "p99 ms k / Darner / m",
                  "RSS MiB k / Darner / m", "check k / Darner")  # fmt: skip


def darner_table(rows: list[Row]) -> Table:
    """Server CPU per operation of the three servers, the rows Darner ran (same load generator,
    same rounds); the ratios are what holds on a busy machine."""
    cells = []
    for k, d, m in by_workload(rows, ("kestreld", "darner", "memcached")):
        if d is None:
            continue
        three = (k, d, m)
        cells.append(
            [
                d.description + (f" ({m.note})" if m and m.note else ""),
                *_cells(three, _cpu),
                _ratio(k.server_us, d.server_us) if k else "-",
                _ratio(k.server_us, m.server_us) if k and m else "-",
                _each(three, lambda r: _n(r.rate)),
                _each(three, lambda r: _n(r.p99_ms)),
                _each(three, lambda r: f"{r.rss_mib:.1f}"),
                f"{k.check if k else '-'} / {d.check}"
                + (f"; Darner {d.errors} errors: {d.error_samples[:2]}" if d.errors else ""),
            ]
        )
    return Table(DARNER_COLUMNS, cells)


# --- targets --------------------------------------------------------------------------------------


@dataclass(slots=True)
class Target:
    name: str
    figure: str  # what was measured, with its reference
    limit: str
    value: float | None  # the compared number (a ratio or an absolute figure)
    bound: float
    higher_is_better: bool = False

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value >= self.bound if self.higher_is_better else self.value <= self.bound

    @property
    def margin(self) -> str:
        if self.value is None:
            return "not measured"
        f = self.value / self.bound
        pct = abs(f - 1)
        pct_text = f"{pct:.1%}" if pct < 0.1 else f"{pct:.0%}"
        if self.higher_is_better:
            return f"{pct_text} {'above' if f >= 1 else 'below'} the floor"
        return f"{pct_text} {'under' if f <= 1 else 'over'} the limit"

    def cells(self) -> list[str]:
        verdict = {True: "MET", False: "MISSED", None: "n/a"}[self.met]
        return [self.name, self.figure, self.limit, verdict, self.margin]


TARGET_COLUMNS = ("target", "measured", "limit", "verdict", "margin")


def targets_table(targets: list[Target]) -> Table:
    return Table(TARGET_COLUMNS, [t.cells() for t in targets])


def versus(
    name: str, k: Row | None, ref: Row | None, label: str, bound: float, p99: bool = False
) -> Target:
    """kestreld's server CPU per operation (or p99) over a peer's, at most ``bound`` times."""
    unit, digits = ("ms", 2) if p99 else ("us", 1)
    kv = (k.p99_ms if p99 else k.server_us) if k else 0.0
    rv = (ref.p99_ms if p99 else ref.server_us) if ref else 0.0
    if not (k and rv):
        return Target(name, "-", f"<= {bound:g}x {label}", None, bound)
    figure = f"{kv:.{digits}f} {unit} vs {label} {rv:.{digits}f} {unit} = {kv / rv:.2f}x"
    return Target(name, figure, f"<= {bound:g}x {label}", kv / rv, bound)


#: The rows the targets read (see cli.compare_matrix).
SET_100, GET_100 = "set-1k-c100-d1", "get-1k-c100-d1"
RELIABLE_100, RELIABLE_GET_100 = "reliable-1k-p50c50-d1", "reliable-get-1k-c100-d1"
SYNC_100 = "set-sync0-1k-c100-d1"
#: Issue 28: kestreld's server CPU per item at or below Darner's, on these rows.
DARNER_ROWS = (
    (SET_100, "set, 100 conns"),
    (GET_100, "get, 100 conns"),
    (RELIABLE_GET_100, "reliable get, 100 conns"),
    (RELIABLE_100, "open/close loop, 50+50 conns"),
    ("set-1k-c1-d1", "set, 1 conn"),
    ("get-1k-c1-d1", "get, 1 conn"),
    ("reliable-get-1k-c1-d1", "reliable get, 1 conn"),
    ("reliable-1k-p1c1-d1", "open/close loop, 1+1 conns"),
)


#: Against memcached (issue 7; issue 28: a get and a reliable get against memcached's get):
#: (what, kestreld's row, memcached's row, its label, the bound, on p99 rather than CPU).
VERSUS_MEMCACHED = (
    ("server CPU per set, 1 KiB, 100 conns", SET_100, SET_100, "memcached", 2, False),
    ("server CPU per get, 1 KiB, 100 conns", GET_100, GET_100, "memcached", 2, False),
    ("open/close loop per item (set + get/close/open), 1 KiB, 50+50 conns",
     RELIABLE_100, GET_100, "memcached get", 3, False),
    ("p99 latency, set 1 KiB, 100 conns", SET_100, SET_100, "memcached", 2, True),
    ("p99 latency, get 1 KiB, 100 conns", GET_100, GET_100, "memcached", 2, True),
    ("server CPU per get, 1 KiB, 100 conns, against memcached's get",
     GET_100, GET_100, "memcached get", 1.1, False),
    ("server CPU per reliable get, 1 KiB, 100 conns, against memcached's get",
     RELIABLE_GET_100, GET_100, "memcached get", 1.3, False),
)  # fmt: skip


def evaluate(rows: list[Row], backlog: dict | None = None) -> list[Target]:
    """The targets against memcached, against Darner (issue 28) and of the backlog."""
    by = {(r.key, r.server): r for r in rows}
    out = [
        versus(name, by.get((k, "kestreld")), by.get((m, "memcached")), label, bound, p99)
        for name, k, m, label, bound, p99 in VERSUS_MEMCACHED
    ]
    sync = by.get((SYNC_100, "kestreld"))
    figure = f"{sync.rate:,.0f} sets/s" if sync else "-"
    name = "sync_journal = 0, 100 producers, 1 KiB"
    rate = sync.rate if sync else None
    out.insert(5, Target(name, figure, ">= 10,000 sets/s", rate, 10_000, higher_is_better=True))
    out += [
        versus(f"server CPU per item, {what}, 1 KiB", by.get((key, "kestreld")), d, "Darner", 1)
        for key, what in DARNER_ROWS
        if (d := by.get((key, "darner"))) is not None
    ]
    if backlog:
        b = backlog
        name = f"RSS with {b['backlog_mib']:,.0f} MiB queued, "
        name += f"max_memory_size {b['max_memory_mib']:.0f} MiB"
        figure = f"{b['rss_max_mib']:.1f} MiB (max of loading, idle, restart, drain)"
        out.append(Target(name, figure, "< 100 MiB", b["rss_max_mib"], 100.0))
        figure = f"{b['first_item_s']:.2f} s from process start"
        name = "first item served after restart on that backlog"
        out.append(Target(name, figure, "< 1 s", b["first_item_s"], 1.0))
    return out
