"""Busy polling (``busy_poll_us``): the poll's back-off on a running loop, and a real server
that polls between a client's requests and answers them as without."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest
from pymemcache.client.base import Client

from kestreld.bench.servers import cpu_seconds
from kestreld.config import ConfigError, build_config
from kestreld.protocol.busy_poll import MAX_BACK_OFF, BusyPoll


def _run_out(poll: BusyPoll) -> None:
    """A request arrives long after the answer: any poll since then ran out."""
    poll.arrived(poll.done + 1.0)


async def test_polls_that_keep_running_out_back_off_up_to_the_limit():
    poll = BusyPoll(50)
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
    poll = BusyPoll(50)
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
    poll = BusyPoll(3000)  # 3 ms
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
    poll = BusyPoll(10_000)
    poll.served(True)
    await asyncio.sleep(0)
    poll.arrived(time.monotonic())
    assert poll.caught == 1 and poll.ran_out == 0


async def test_only_a_lone_client_is_polled_for():
    poll = BusyPoll(50)
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
    poll = BusyPoll(50)
    poll.served(True)
    assert not poll.polling and not poll.polled


@pytest.mark.parametrize("value", [-1, 10_001, "fast"])
def test_bad_busy_poll_values_name_the_key(value):
    with pytest.raises(ConfigError) as e:
        build_config({"busy_poll_us": value})
    assert "busy_poll_us" in str(e.value)


def test_default_is_off():
    assert build_config({}).busy_poll_us == 0


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


def test_a_server_without_busy_poll_shows_no_poll_stats(server):
    client = Client(("127.0.0.1", server.port), timeout=10)
    try:
        assert not any(k.startswith(b"busy_poll") for k in client.stats())
    finally:
        client.close()
