"""Busy polling (``busy_poll_us``): the choice between polling and sleeping by measured CPU
(a fake CPU clock), the poll's back-off on a running loop, and a real server that polls
between a client's requests and answers them as without."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from pymemcache.client.base import Client

from kestreld import compiled
from kestreld.bench.servers import cpu_seconds
from kestreld.config import ConfigError, build_config
from kestreld.loop.busy_poll import (
    DEFAULT_LIMIT_US,
    EXPLORE,
    MAX_BACK_OFF,
    MAX_REST,
    PERIOD,
    BusyPoll,
)


def _run_out(poll: BusyPoll) -> None:
    """A request arrives long after the answer: any poll since then ran out."""
    poll.arrived(poll.done + 1.0)


def _always_polling(limit_us: int) -> BusyPoll:
    """A poll that prefers polling and never measures: the back-off on its own."""
    poll = BusyPoll(limit_us)
    poll.prefer = True
    poll.explore = 0
    return poll


class _CpuClock:
    """A fake CPU clock for the choice: the test moves it by what each cycle costs."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _answer(poll: BusyPoll, clock: _CpuClock, polling_us: float, sleeping_us: float) -> bool:
    """One request answered and the next one arriving (within the poll's limit): the
    cycle costs ``polling_us`` when the answer was followed by a poll, else ``sleeping_us``.
    Needs a running loop (a poll is put on it).  True when the answer polled."""
    poll.served(True)
    polled = poll.polled
    poll.arrived(poll.done + 1e-6)
    clock.now += (polling_us if polled else sleeping_us) * 1e-6
    return polled


def _measured(limit_us: int = 30) -> tuple[BusyPoll, _CpuClock]:
    poll = BusyPoll(limit_us)
    clock = poll.cpu_clock = _CpuClock()
    return poll, clock


async def test_polling_is_preferred_when_a_cycle_with_a_poll_costs_less():
    poll, clock = _measured()
    assert not poll.prefer  # sleeping until measured
    for _ in range(4 * PERIOD):
        _answer(poll, clock, polling_us=20, sleeping_us=30)
    assert poll.prefer
    polled = sum(_answer(poll, clock, 20, 30) for _ in range(16 * PERIOD))
    # Polls but for the measured sleeps (EXPLORE a period, fewer once far apart).
    assert 16 * (PERIOD - EXPLORE) <= polled < 16 * PERIOD
    stats = dict(poll.stats())
    assert stats["busy_poll_preferred"] == 1
    assert 9_000 <= stats["busy_poll_gain_ns"] <= 11_000  # 10 µs a request saved


async def test_sleeping_stays_preferred_when_a_poll_costs_more_and_windows_thin_out():
    poll, clock = _measured()
    polled = sum(_answer(poll, clock, polling_us=45, sleeping_us=30) for _ in range(64 * PERIOD))
    assert not poll.prefer
    # A poll costs half a cycle more: after each window the next ones wait longer, up to
    # one period with a window in MAX_REST + 1: far fewer polls than EXPLORE a period.
    assert poll.rest == MAX_REST
    assert polled < 64 * EXPLORE / 4
    assert dict(poll.stats())["busy_poll_gain_ns"] == -15_000


async def test_the_preference_follows_a_client_that_changes():
    poll, clock = _measured()
    for _ in range(8 * PERIOD):
        _answer(poll, clock, polling_us=20, sleeping_us=30)
    assert poll.prefer
    for _ in range(40 * PERIOD):  # now polls run long: a slower client
        _answer(poll, clock, polling_us=45, sleeping_us=30)
    assert not poll.prefer
    for _ in range(40 * PERIOD):
        _answer(poll, clock, polling_us=20, sleeping_us=30)
    assert poll.prefer


async def test_one_dear_cycle_does_not_turn_the_choice():
    """A checkpoint or a collection lands in one measured cycle: each block leaves out its
    dearest cycle, so a 5 ms cycle among the polls changes nothing."""
    poll, clock = _measured()
    for _ in range(4 * PERIOD):  # near enough to measure every period
        _answer(poll, clock, polling_us=25, sleeping_us=30)
    assert poll.prefer and poll.rest == 0
    while not (poll.left <= 1 and poll.step == EXPLORE + 4):  # into the window's polls
        _answer(poll, clock, 25, 30)
    _answer(poll, clock, polling_us=5000, sleeping_us=5000)
    for _ in range(PERIOD):
        _answer(poll, clock, 25, 30)
    assert poll.prefer
    assert 4_000 <= dict(poll.stats())["busy_poll_gain_ns"] <= 6_000


async def test_a_second_client_ends_the_measured_cycle():
    """Cycles are measured only from one answer to a lone client to the next: the CPU
    spent while other clients were served never counts for either way."""
    poll, clock = _measured()
    poll.served(True)
    assert poll.cpu_at != 0.0
    poll.served(False)
    assert poll.cpu_at == 0.0


async def test_polls_that_keep_running_out_back_off_up_to_the_limit():
    poll = _always_polling(50)
    skipped = []
    run = 0
    for _ in range(400):
        poll.served(True)
        if poll.polled:
            if run:
                skipped.append(run)
            run = 0
        else:
            run += 1
        _run_out(poll)
    assert skipped[:7] == [1, 2, 4, 8, 16, 32, 64]
    assert set(skipped[7:]) == {MAX_BACK_OFF}


async def test_a_request_within_the_limit_ends_the_back_off():
    poll = _always_polling(50)
    for _ in range(20):
        poll.served(True)
        _run_out(poll)
    assert poll.skip > 0
    poll.served(True)  # skipped
    assert not poll.polled
    poll.arrived(poll.done + 10e-6)  # 10 µs after the answer: a poll would have caught it
    assert poll.skip == 0 and poll.back_off == 0
    poll.served(True)
    assert poll.polled


async def test_the_poll_keeps_the_loop_running_until_its_limit_then_sleeps():
    poll = _always_polling(3000)  # 3 ms
    poll.served(True)
    turns = 0
    started = time.monotonic()
    while poll.polling and time.monotonic() - started < 1.0:
        await asyncio.sleep(0)
        turns += 1
    elapsed = time.monotonic() - started
    assert not poll.polling
    assert elapsed >= 0.0025 and turns > 10  # many non-blocking turns of the loop
    assert poll.caught == 0


async def test_a_request_during_the_poll_is_caught():
    poll = _always_polling(10_000)
    poll.served(True)
    await asyncio.sleep(0)
    poll.arrived(time.monotonic())
    assert poll.caught == 1 and poll.ran_out == 0


async def test_only_a_lone_client_is_polled_for():
    poll = _always_polling(50)
    poll.served(False)  # other clients connected: their requests come anyway
    assert not poll.polled and not poll.polling and poll.done == 0.0
    poll.served(True)
    assert poll.polled and poll.polling


async def test_off_means_no_poll_and_no_stats():
    poll = BusyPoll(0)
    poll.served(True)
    assert not poll.polled and not poll.polling and poll.done == 0.0
    assert poll.stats() == []


def test_no_running_loop_means_no_poll():
    poll = _always_polling(50)
    poll.served(True)
    assert not poll.polling and not poll.polled


@pytest.mark.parametrize("value", [-1, 10_001, "fast"])
def test_bad_busy_poll_values_name_the_key(value):
    with pytest.raises(ConfigError) as e:
        build_config({"busy_poll_us": value})
    assert "busy_poll_us" in str(e.value)


def test_the_default_is_the_builds():
    """Left out of the config, busy_poll_us is 30 µs compiled and 0 (never) in plain
    Python, where polling measured no gain."""
    assert build_config({}).busy_poll_us is None
    built = compiled.is_compiled("kestreld.loop.busy_poll")
    assert DEFAULT_LIMIT_US == (30 if built else 0)


def test_a_polling_server_answers_every_request_and_counts_its_polls(make_server):
    proc = make_server("busy_poll_us = 200\n")
    client = Client(("127.0.0.1", proc.port), timeout=10)
    try:
        for i in range(300):
            assert client.set("bp", b"item%d" % i)
        got = [client.get("bp") for _ in range(300)]
        assert got == [b"item%d" % i for i in range(300)]
        assert client.get("bp") is None
        stats = client.stats()
        assert stats[b"busy_poll_us"] == 200
        polls = stats[b"busy_poll_caught"] + stats[b"busy_poll_ran_out"]
        assert polls > 0
        # A blocking client sends its next request well within 200 µs of the reply:
        # most polls catch it.
        assert stats[b"busy_poll_caught"] > stats[b"busy_poll_ran_out"]
    finally:
        client.close()


def test_a_server_measures_which_way_is_cheaper(make_server):
    """The compiled build's default: the server polls for at most 30 µs, tries both ways on
    a lone client (a window starts with polls while sleeping is preferred) and shows its
    choice."""
    proc = make_server("busy_poll_us = 30\n")
    with socket.create_connection(("127.0.0.1", proc.port)) as s:
        for i in range(3 * PERIOD):
            s.sendall(b"set d 0 0 4\r\n%04d\r\n" % (i % 10_000))
            assert s.recv(100) == b"STORED\r\n"
    client = Client(("127.0.0.1", proc.port), timeout=10)
    try:
        stats = client.stats()
        assert stats[b"busy_poll_us"] == 30
        # Polls were tried (fewer than EXPLORE a period when they ran out and backed off).
        assert stats[b"busy_poll_caught"] + stats[b"busy_poll_ran_out"] > 0
        assert stats[b"busy_poll_preferred"] in (0, 1)
        assert b"busy_poll_gain_ns" in stats
        assert stats[b"curr_items"] == 3 * PERIOD
    finally:
        client.close()


def test_a_polling_server_does_not_poll_between_two_clients(make_server):
    proc = make_server("busy_poll_us = 200\n")
    first = Client(("127.0.0.1", proc.port), timeout=10)
    second = Client(("127.0.0.1", proc.port), timeout=10)
    try:
        second.version()  # both connected from here on
        before = first.stats()
        for i in range(100):
            assert first.set("two", b"a%d" % i, noreply=False)
            assert second.get("two") == b"a%d" % i
        after = first.stats()
        for key in (b"busy_poll_caught", b"busy_poll_ran_out"):
            assert after[key] == before[key]
    finally:
        first.close()
        second.close()


def test_an_idle_polling_server_sleeps(make_server):
    """After the last request the poll runs out once and the server uses no CPU."""
    proc = make_server("busy_poll_us = 5000\n")
    with socket.create_connection(("127.0.0.1", proc.port)) as s:
        s.sendall(b"set idle 0 0 1\r\nx\r\n")
        assert s.recv(100) == b"STORED\r\n"
        time.sleep(0.2)
        before = cpu_seconds(proc.proc.pid)
        time.sleep(1.0)
        after = cpu_seconds(proc.proc.pid)
    assert after - before < 0.2  # the periodic timers only; a poll would take the second


def test_a_server_without_busy_poll_shows_no_poll_stats(make_server):
    proc = make_server("busy_poll_us = 0\n")
    client = Client(("127.0.0.1", proc.port), timeout=10)
    try:
        assert not any(k.startswith(b"busy_poll") for k in client.stats())
    finally:
        client.close()


def test_a_server_left_to_its_default_polls_as_its_build_says(make_server):
    proc = make_server("")
    client = Client(("127.0.0.1", proc.port), timeout=10)
    try:
        stats = client.stats()
        if DEFAULT_LIMIT_US:
            assert stats[b"busy_poll_us"] == DEFAULT_LIMIT_US
        else:
            assert not any(k.startswith(b"busy_poll") for k in stats)
    finally:
        client.close()
