"""The asyncio client, ``kestreld.client.AsyncClient``, against real kestreld processes.

The same contract as the blocking client (tests/client/test_client.py), awaited:
single-server behaviour on the module's ``server``, cluster behaviour on a
module-scoped cluster of three servers that some tests kill and restart.
"""

from __future__ import annotations

import asyncio
import collections
import socket
import time

import pytest
from kestreld_process import Conn, KestreldProcess

from kestreld.client import AsyncClient, ConnectionFailed, ItemState, NoServerAvailable

pytestmark = pytest.mark.timeout(120)


def address(proc: KestreldProcess) -> str:
    return f"127.0.0.1:{proc.port}"


def items_on(proc: KestreldProcess, queue: str) -> int:
    """Items of ``queue`` on one server, asked over a raw connection."""
    conn = Conn(proc.connect())
    try:
        return int(conn.stats().get(f"queue_{queue}_items", 0))
    finally:
        conn.close()


def dead_address() -> str:
    """A loopback port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    procs = [KestreldProcess(tmp_path_factory.mktemp(f"node{i}") / "queues") for i in range(3)]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            try:
                proc.stop()
            except Exception:
                proc.kill()


@pytest.fixture
async def client(server):
    async with AsyncClient([address(server)]) as c:
        yield c


@pytest.fixture
async def cluster_client(cluster):
    async with AsyncClient(
        [address(p) for p in cluster], down_period=0.5, max_down_period=1.0
    ) as c:
        yield c


# --- put, get, peek ---------------------------------------------------------------------


async def test_put_then_get_returns_the_item_and_empties_the_queue(client, qname):
    assert await client.put(qname, b"hello") is True
    assert await client.get(qname) == b"hello"
    assert await client.get(qname) is None


async def test_get_with_timeout_waits_for_an_item_put_later(client, qname):
    async def put_later() -> None:
        await asyncio.sleep(0.3)
        await client.put(qname, b"late")

    producer = asyncio.create_task(put_later())
    started = time.monotonic()
    assert await client.get(qname, timeout=5.0) == b"late"
    assert 0.2 < time.monotonic() - started < 4.0
    await producer


async def test_get_with_timeout_gives_up_after_the_timeout(client, qname):
    started = time.monotonic()
    assert await client.get(qname, timeout=0.4) is None
    assert 0.35 < time.monotonic() - started < 3.0


async def test_many_waiting_tasks_each_get_one_item(client, qname):
    waiters = [asyncio.create_task(client.get(qname, timeout=10.0)) for _ in range(10)]
    await asyncio.sleep(0.2)
    assert await client.put_many(qname, [str(i) for i in range(10)]) == 10
    got = await asyncio.gather(*waiters)
    assert sorted(int(data) for data in got) == list(range(10))


async def test_peek_leaves_the_item_in_place(client, qname):
    await client.put(qname, b"a")
    assert await client.peek(qname) == b"a"
    assert await client.get(qname) == b"a"


async def test_put_many_stores_every_item_in_order_across_pipelines(client, server, qname):
    items = [f"item-{i}".encode() for i in range(2500)]
    assert await client.put_many(qname, items) == 2500
    assert items_on(server, qname) == 2500
    async with client.reliable_reads(qname, timeout=0.2) as reads:
        got = [item.data async for item in reads]
    assert got == items


async def test_illegal_names_are_refused_before_sending(client, qname):
    with pytest.raises(ValueError):
        await client.put("a b", b"x")
    with pytest.raises(ValueError, match="fanout"):
        await client.put(f"{qname}+audit", b"x")


# --- reliable reads -----------------------------------------------------------------------


async def test_reserve_confirms_the_item_when_the_block_succeeds(client, server, qname):
    await client.put(qname, b"job")
    async with client.reserve(qname, timeout=1.0) as item:
        assert item is not None and item.data == b"job" and item.is_open
    assert item.state is ItemState.CONFIRMED
    assert await client.get(qname) is None
    assert (await client.stats())[address(server)].queue(qname)["open_transactions"] == 0


async def test_reserve_aborts_the_item_when_the_block_raises(client, qname):
    await client.put_many(qname, [b"first", b"second"])
    with pytest.raises(RuntimeError, match="boom"):
        async with client.reserve(qname, timeout=1.0) as item:
            assert item.data == b"first"
            raise RuntimeError("boom")
    assert item.state is ItemState.ABORTED
    assert [await client.get(qname), await client.get(qname)] == [b"first", b"second"]


async def test_reserve_aborts_the_item_when_its_task_is_cancelled(client, qname):
    await client.put(qname, b"cancelled")
    reserved = asyncio.Event()

    async def worker() -> None:
        async with client.reserve(qname, timeout=1.0) as item:
            assert item is not None
            reserved.set()
            await asyncio.sleep(30)

    task = asyncio.create_task(worker())
    await asyncio.wait_for(reserved.wait(), 5)
    assert await client.get(qname) is None  # held by the worker
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await client.get(qname, timeout=2.0) == b"cancelled"


async def test_a_cancelled_blocking_read_does_not_swallow_an_item(client, qname):
    task = asyncio.create_task(client.open(qname, timeout=10.0))
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await client.put(qname, b"for-the-next-reader")
    assert await client.get(qname, timeout=2.0) == b"for-the-next-reader"


async def test_open_confirm_and_abort_by_hand(client, qname):
    await client.put_many(qname, [b"a", b"b"])
    first = await client.open(qname)
    second = await client.open(qname)
    assert await client.abort(first) is True
    assert await client.confirm(second) is True
    assert await client.confirm(second) is False
    assert [await client.get(qname), await client.get(qname)] == [b"a", None]


async def test_reliable_reads_confirm_and_open_in_one_round_trip(client, server, qname):
    await client.put_many(qname, [str(i) for i in range(50)])
    before = (await client.stats())[address(server)].values["cmd_get"]
    async with client.reliable_reads(qname, timeout=0.1) as reads:
        seen = [item.data async for item in reads]
    assert seen == [str(i).encode() for i in range(50)]
    gets = (await client.stats())[address(server)].values["cmd_get"] - before
    assert 50 <= gets <= 53
    assert (await client.stats())[address(server)].queue(qname)["open_transactions"] == 0


async def test_reliable_reads_abort_the_item_in_hand_when_the_loop_raises(client, qname):
    await client.put_many(qname, [b"a", b"b", b"c"])
    with pytest.raises(KeyError):
        async with client.reliable_reads(qname, timeout=0.2) as reads:
            async for item in reads:
                if item.data == b"b":
                    raise KeyError("b")
    assert [await client.get(qname) for _ in range(3)] == [b"b", b"c", None]


# --- stats and administration ---------------------------------------------------------------


async def test_stats_are_parsed_into_numbers_per_server_and_per_queue(client, server, qname):
    await client.put(f"{qname}_total", b"1")
    await client.put_many(qname, [b"1", b"2"])
    stats = (await client.stats())[address(server)]
    assert stats.values["version"] == "1.0.0"
    assert isinstance(stats.values["uptime"], int)
    assert stats.queue(qname)["items"] == 2
    assert stats.queue(f"{qname}_total")["items"] == 1


async def test_version_status_flush_and_delete_reach_every_server(cluster_client, cluster, qname):
    addresses = {address(p) for p in cluster}
    assert await cluster_client.version() == dict.fromkeys(addresses, "1.0.0")
    assert await cluster_client.status() == dict.fromkeys(addresses, "UP")
    for proc in cluster:
        conn = Conn(proc.connect())
        assert conn.set(qname, "x") == b"STORED"
        conn.close()
    await cluster_client.flush(qname)
    assert [items_on(p, qname) for p in cluster] == [0, 0, 0]
    await cluster_client.delete(qname)
    assert all(qname not in s.queues for s in (await cluster_client.stats()).values())


# --- cluster ------------------------------------------------------------------------------------


async def test_items_put_through_the_cluster_are_consumed_exactly_once_by_reliable_readers(
    cluster, qname
):
    addresses = [address(p) for p in cluster]
    expected = [f"job-{i}" for i in range(600)]
    consumed: list[tuple[str, str]] = []
    done = asyncio.Event()
    deadline = time.monotonic() + 60

    def record(item) -> None:
        consumed.append((item.data.decode(), item.server))
        if len(consumed) >= len(expected):
            done.set()

    async def produce(client: AsyncClient, part: list[str], many: bool) -> None:
        if many:
            for start in range(0, len(part), 50):
                batch = part[start : start + 50]
                assert await client.put_many(qname, batch) == len(batch)
        else:
            for data in part:
                assert await client.put(qname, data)

    async def consume_iterator(client: AsyncClient, switch_after: int) -> None:
        while not done.is_set() and time.monotonic() < deadline:
            async with client.reliable_reads(qname, 0.3, switch_after=switch_after) as reads:
                async for item in reads:
                    record(item)
                    if done.is_set():
                        break

    async def consume_reserve(client: AsyncClient) -> None:
        while not done.is_set() and time.monotonic() < deadline:
            async with client.reserve(qname, timeout=0.3) as item:
                if item is not None:
                    record(item)

    async with AsyncClient(addresses) as producer, AsyncClient(addresses) as consumer:
        await asyncio.wait_for(
            asyncio.gather(
                produce(producer, expected[:300], False),
                produce(producer, expected[300:], True),
                consume_iterator(consumer, 100),
                consume_iterator(consumer, 3),
                consume_reserve(consumer),
            ),
            90,
        )
        counts = collections.Counter(data for data, _ in consumed)
        assert sorted(counts) == sorted(expected)
        assert set(counts.values()) == {1}
        assert {server for _, server in consumed} == set(addresses)
        for stats in (await consumer.stats()).values():
            assert stats.queue(qname)["items"] == 0
            assert stats.queue(qname)["open_transactions"] == 0


async def test_a_killed_server_is_avoided_and_its_items_come_back_after_it_restarts(cluster, qname):
    victim = cluster[0]
    addresses = [address(p) for p in cluster]
    before_kill = [f"a-{i}" for i in range(300)]
    during_outage = [f"b-{i}" for i in range(60)]
    consumed: list[tuple[str, str]] = []
    async with AsyncClient(addresses, down_period=0.3, max_down_period=1.0) as c:
        for data in before_kill:
            assert await c.put(qname, data)
        assert items_on(victim, qname) > 0
        held = None
        while len(consumed) < 90 or held is None:
            item = await c.open(qname, timeout=1.0)
            assert item is not None
            if held is None and item.server == address(victim):
                held = item
                continue
            consumed.append((item.data.decode(), item.server))
            assert await c.confirm(item)

        await asyncio.to_thread(victim.kill)
        try:
            assert await c.confirm(held) is False
            for data in during_outage:
                assert await c.put(qname, data)
            while True:
                async with c.reserve(qname, timeout=0.5) as item:
                    if item is None:
                        break
                    consumed.append((item.data.decode(), item.server))
                    assert item.server != address(victim)
            assert c.cluster.server(address(victim)).failures >= 1
        finally:
            await asyncio.to_thread(victim.start)

        missing = set(before_kill + during_outage) - {data for data, _ in consumed}
        assert held.data.decode() in missing
        deadline = time.monotonic() + 30
        while missing and time.monotonic() < deadline:
            async with c.reserve(qname, timeout=1.0) as item:
                if item is not None:
                    consumed.append((item.data.decode(), item.server))
                    missing.discard(item.data.decode())
        assert not missing
        assert c.cluster.server(address(victim)).failures == 0
    counts = collections.Counter(data for data, _ in consumed)
    assert {server for data, server in consumed if counts[data] > 1} <= {address(victim)}


# --- failover ----------------------------------------------------------------------------------


async def test_a_dead_server_is_marked_down_then_retried_after_its_down_period(cluster, qname):
    victim = cluster[1]
    async with AsyncClient([address(p) for p in cluster], down_period=1.0) as c:
        state = c.cluster.server(address(victim))
        await asyncio.to_thread(victim.kill)
        try:
            for _ in range(200):
                assert await c.put(qname, b"x")
                if state.failures:
                    break
            assert state.failures == 1
            for _ in range(30):
                assert await c.put(qname, b"y")
            assert state.failures == 1  # not tried again during its down period
        finally:
            await asyncio.to_thread(victim.start)
        await asyncio.sleep(max(0.0, state.down_until - c.cluster.clock()) + 0.05)
        for _ in range(60):
            assert await c.put(qname, b"z")
        assert state.failures == 0
        assert items_on(victim, qname) > 0


async def test_reads_and_writes_fail_over_to_the_live_servers(server, qname):
    async with AsyncClient([dead_address(), address(server)]) as c:
        for i in range(20):
            assert await c.put(qname, str(i))
        assert sorted([int(await c.get(qname)) for _ in range(20)]) == list(range(20))


async def test_every_server_unreachable_raises_no_server_available(qname):
    async with AsyncClient([dead_address(), dead_address()], down_period=0.1) as c:
        with pytest.raises(NoServerAvailable):
            await c.put(qname, b"x")
        with pytest.raises(NoServerAvailable):
            await c.get(qname, timeout=0.3)


async def test_stats_and_flush_leave_a_server_marked_down_alone_until_its_retry_time(server, qname):
    dead = dead_address()
    async with AsyncClient([address(server), dead], down_period=30.0) as c:
        assert set(await c.stats()) == {address(server)}  # the first call finds it dead
        state = c.cluster.server(dead)
        assert state.failures == 1
        until = state.down_until
        for _ in range(3):
            assert set(await c.stats()) == {address(server)}
            with pytest.raises(ConnectionFailed, match="marked down"):
                await c.flush(qname)
        assert state.failures == 1 and state.down_until == until  # back-off not raised
