"""The server's clocks read the same clocks as the ``time`` module, in both builds."""

from __future__ import annotations

import time

from kestreld.journal.clock import monotonic, now_ms


def test_now_ms_is_the_wall_clock_in_whole_milliseconds():
    before = time.time_ns() // 1_000_000
    stamp = now_ms()
    after = time.time_ns() // 1_000_000
    assert isinstance(stamp, int)
    assert before <= stamp <= after


def test_monotonic_is_time_monotonic_so_values_from_both_compare():
    before = time.monotonic()
    reading = monotonic()
    after = time.monotonic()
    assert isinstance(reading, float)
    assert before <= reading <= after
    assert monotonic() >= reading  # never goes back
