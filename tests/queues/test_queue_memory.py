"""Resident memory comes back after a burst is drained (issue 55), on a real server."""

from __future__ import annotations

import time

import pytest

from kestreld.bench.servers import rss
from kestreld.queues.item import memory_overhead
from kestreld.testing.process import Conn

MiB = 1024 * 1024
ITEM = b"x" * 1024


def grow(c: Conn, queue: str, n: int, batch: int = 512) -> None:
    request = b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(ITEM), ITEM)
    for done in range(0, n, batch):
        k = min(batch, n - done)
        c.send(request * k)
        for _ in range(k):
            assert c.line() == b"STORED"


def drain(c: Conn, queue: str, n: int, batch: int = 512) -> None:
    for done in range(0, n, batch):
        k = min(batch, n - done)
        c.send(b"get %s\r\n" % queue.encode() * k)
        for _ in range(k):
            assert c.read_value() == ITEM


@pytest.mark.one_process  # the RSS of the server's one process
def test_rss_comes_back_when_the_get_that_empties_a_burst_is_served(make_server):
    server = make_server()
    c = Conn(server.connect())
    time.sleep(0.5)
    idle = rss(server.pid)
    grow(c, "burst", 49_152)  # 48 MiB of items, all in memory
    assert rss(server.pid) > idle + 40 * MiB
    drain(c, "burst", 49_152)
    assert rss(server.pid) < idle + 16 * MiB  # given back before the last get was answered
    c.close()


@pytest.mark.one_process  # the RSS of the server's one process
def test_rss_with_a_backlog_stays_near_max_memory_size(make_server):
    server = make_server('max_memory_size = "8MiB"\n')
    c = Conn(server.connect())
    time.sleep(0.5)
    idle = rss(server.pid)
    grow(c, "backlog", 40_960)  # 40 MiB queued, 8 MiB of it in memory
    assert rss(server.pid) < idle + 8 * MiB + 16 * MiB
    drain(c, "backlog", 40_960)
    assert c.get("backlog") is None
    c.close()


def test_items_in_memory_are_charged_what_they_cost_beside_their_data(make_server):
    server = make_server('max_memory_size = "4MiB"\n')
    c = Conn(server.connect())
    grow(c, "charged", 8_192)  # 8 MiB queued
    stats = c.stats()
    in_memory, data = int(stats["queue_charged_mem_items"]), int(stats["queue_charged_mem_bytes"])
    assert data == in_memory * len(ITEM)
    # Each item costs its data and at least the record and the value's header beside it.
    assert data + in_memory * 80 <= 4 * MiB
    # And memory is filled to within an item or two of the bound.
    assert data + in_memory * memory_overhead() > 4 * MiB - 2 * (memory_overhead() + len(ITEM))
    c.close()


@pytest.mark.one_process  # the RSS of the server's one process
def test_rss_with_a_backlog_stays_within_max_memory_size(make_server):
    server = make_server('max_memory_size = "32MiB"\n')
    c = Conn(server.connect())
    time.sleep(0.5)
    idle = rss(server.pid)
    grow(c, "backlog", 65_536)  # 64 MiB queued, at most 32 MiB of memory for it
    assert rss(server.pid) < idle + 32 * MiB + 4 * MiB
    c.close()


@pytest.mark.one_process  # the RSS of the server's one process
def test_rss_comes_back_when_a_burst_is_flushed(make_server):
    server = make_server()
    c = Conn(server.connect())
    time.sleep(0.5)
    idle = rss(server.pid)
    grow(c, "flushed", 49_152)
    c.send(b"flush flushed\r\n")
    assert c.line() == b"END"
    assert rss(server.pid) < idle + 16 * MiB
    c.close()
