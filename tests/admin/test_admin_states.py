"""The live page's states: one definition (``kestreld.admin.page.STATES``), computed by
``attention()`` from the admin port's samples, at times the test chooses (no server, no
sleeping), and said in the same words by docs/operations.md."""

from __future__ import annotations

import re

import repo

from kestreld.admin.ostrich import AdminSnapshot
from kestreld.admin.page import STALL_SECONDS, STATES, Attention, attention, overview
from kestreld.admin.window import SAMPLE_SECONDS, Sample, StatsWindow
from kestreld.state import ServerStatus
from kestreld.stats.collector import StatsSnapshot
from kestreld.stats.latency import LatencyHistograms

DOCS = repo.DOCS / "operations.md"


class Watched:
    """One queue, ``jobs``, as the admin port samples it every 5 s on a clock the test moves."""

    def __init__(self) -> None:
        self.window = StatsWindow()
        self.now = 0.0
        self.items = 0
        self.put = 0
        self.delivered = 0

    def _latency(self) -> LatencyHistograms:
        latency = LatencyHistograms()
        for _ in range(self.delivered):
            latency.observe_delivery("jobs", 10)
        return latency

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass, a sample every SAMPLE_SECONDS (the first at 0)."""
        end = self.now + seconds
        while self.now <= end:
            flows = {"jobs": (self.put, self.delivered, self.items)}
            self.window.add(Sample(self.now, {}, self._latency(), flows))
            self.now += SAMPLE_SECONDS
        self.now = end

    def state(self, oldest_ms: int) -> str:
        values = {"items": self.items, "oldest_item_age": oldest_ms}
        stats = StatsSnapshot(server=[], queues=[("jobs", values)], status=ServerStatus.UP)
        snapshot = AdminSnapshot(stats, self._latency(), {})
        [row] = overview(snapshot, self.window, self.now, {})["rows"]
        return row["attention"]


def test_items_that_arrived_seconds_ago_are_growing_not_stalled() -> None:
    # the report: 28 s after start, the oldest item 7.6 s old, nothing taken yet
    q = Watched()
    q.advance(20)
    q.items = q.put = 5
    q.advance(8)
    assert q.state(oldest_ms=7_600) == Attention.GROWING


def test_items_waiting_a_minute_with_nothing_handed_out_are_stalled() -> None:
    q = Watched()
    q.items = q.put = 5
    q.advance(90)
    assert q.state(oldest_ms=90_000) == Attention.STALLED


def test_old_items_are_not_stalled_in_the_servers_first_minute() -> None:
    # items restored from the journal, hours old: the server has watched for 40 s only
    q = Watched()
    q.items = 5
    q.advance(40)
    assert q.state(oldest_ms=7_200_000) == Attention.BUSY
    q.advance(STALL_SECONDS - 40 + SAMPLE_SECONDS)
    assert q.state(oldest_ms=7_200_000) == Attention.STALLED


def test_one_item_handed_out_in_the_last_minute_is_not_stalled() -> None:
    q = Watched()
    q.items = q.put = 6
    q.advance(80)
    q.items, q.delivered = 5, 1
    q.advance(20)
    assert q.state(oldest_ms=100_000) == Attention.BUSY
    q.advance(STALL_SECONDS)  # that hand-off leaves the window
    assert q.state(oldest_ms=160_000) == Attention.STALLED


def test_an_oldest_item_younger_than_a_minute_is_never_stalled() -> None:
    q = Watched()
    q.items = q.put = 5
    q.advance(120)
    assert q.state(oldest_ms=59_999) == Attention.BUSY


def test_an_empty_queue_is_idle_and_one_that_was_read_is_busy() -> None:
    q = Watched()
    q.advance(120)
    assert q.state(oldest_ms=0) == Attention.IDLE
    q.put = q.delivered = 3
    q.advance(10)
    assert q.state(oldest_ms=0) == Attention.BUSY


def test_the_state_function_at_its_bounds() -> None:
    minute_ms = STALL_SECONDS * 1000
    assert attention(1, minute_ms, 0, 0, STALL_SECONDS) == Attention.STALLED
    assert attention(1, minute_ms, 0, 0, STALL_SECONDS - 0.1) == Attention.BUSY
    assert attention(1, minute_ms - 1, 0, 0, STALL_SECONDS) == Attention.BUSY
    assert attention(1, minute_ms, 1, 0, STALL_SECONDS) == Attention.BUSY
    assert attention(1, minute_ms, 0, 1, STALL_SECONDS) == Attention.STALLED  # stalled first
    assert attention(2, 1_000, 0, 1, 10) == Attention.GROWING
    assert attention(0, 0, 0, 0, STALL_SECONDS) == Attention.IDLE


def test_the_docs_define_each_state_in_the_codes_words() -> None:
    docs = re.sub(r"\s+", " ", DOCS.read_text())
    for state, meaning in STATES.items():
        assert f"**{state.value}**: {meaning}" in docs, state


def test_the_page_document_carries_the_definitions() -> None:
    q = Watched()
    q.advance(5)
    stats = StatsSnapshot(server=[], queues=[], status=ServerStatus.UP)
    doc = overview(AdminSnapshot(stats, LatencyHistograms(), {}), q.window, q.now, {})
    assert doc["states"] == {state.value: meaning for state, meaning in STATES.items()}


def test_a_queue_created_since_the_window_began_grows_from_nothing() -> None:
    q = Watched()
    q.advance(30)
    values = {"items": 3, "oldest_item_age": 2_000}
    stats = StatsSnapshot(server=[], queues=[("new", values)], status=ServerStatus.UP)
    doc = overview(AdminSnapshot(stats, LatencyHistograms(), {}), q.window, q.now, {})
    [row] = doc["rows"]
    assert (row["grew"], row["attention"]) == (3, Attention.GROWING)
