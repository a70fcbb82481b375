"""The latency histograms behind /metrics, /stats.json and the live page (sans-IO)."""

from __future__ import annotations

import pytest

from kestreld.stats.latency import LATENCY_BUCKETS, LatencyHistogram, LatencyHistograms


def test_prometheus_sees_its_19_bounds_however_fine_the_counting():
    h = LatencyHistogram()
    h.observe(0.0003)
    les = [le for le, _ in h.cumulative()]
    assert len(les) == len(LATENCY_BUCKETS) + 1 and les[-1] == "+Inf"
    assert dict(h.cumulative())["0.0005"] == 1 and dict(h.cumulative())["0.00025"] == 0


def test_percentiles_are_within_a_quarter_of_the_value():
    h = LatencyHistogram()
    for ms in range(1, 101):
        h.observe(ms / 1000)
    assert h.percentile(0.5) == pytest.approx(0.050, rel=0.25)
    assert h.percentile(0.99) == pytest.approx(0.099, rel=0.25)
    assert h.percentile(1.0) == 0.1  # never above the largest value seen
    assert (h.low, h.high, h.count) == (0.001, 0.1, 100)


def test_minus_keeps_only_what_came_after_and_narrows_the_extremes():
    h = LatencyHistogram()
    h.observe(0.001)
    before = h.copy()
    h.observe(66.0)
    h.observe(70.0)
    window = h.minus(before)
    assert window.count == 2
    assert window.total == pytest.approx(136.0)
    assert 50 <= window.low <= 66 and window.high == 70.0
    assert h.minus(h.copy()).count == 0


def test_merge_adds_readers_into_the_server_wide_delivery_latency():
    latency = LatencyHistograms()
    latency.observe_delivery("q", 10)
    latency.observe_delivery("q+r", 3000)
    total = latency.delivery()
    assert (total.count, total.low, total.high) == (2, 0.01, 3.0)


def test_a_snapshot_shares_histograms_that_counted_nothing_since_the_last():
    latency = LatencyHistograms()
    latency.observe_delivery("quiet", 5)
    latency.observe_delivery("busy", 5)
    first = latency.snapshot()
    latency.observe_delivery("busy", 7)
    second = latency.snapshot(first)
    assert second.delivered["quiet"] is first.delivered["quiet"]
    assert second.delivered["busy"] is not first.delivered["busy"]
    assert second.delivered["busy"].count == 2 and first.delivered["busy"].count == 1
