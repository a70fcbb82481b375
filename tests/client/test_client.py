"""The blocking client, ``kestreld.client.Client``, against real kestreld processes.

Single-server behaviour uses the module's ``server``; cluster behaviour a
module-scoped cluster of three servers (one of which some tests kill and
restart on the same port).  Pure helpers (keys, expiry, server choice,
stats parsing) are specified without a server at the end.
"""

from __future__ import annotations

import collections
import random
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from kestreld_process import Conn, KestreldProcess

from kestreld.client import (
    Client,
    ConnectionFailed,
    ItemState,
    NoServerAvailable,
    ServerError,
)
from kestreld.client.cluster import Cluster, parse_server
from kestreld.client.stats import parse_stats
from kestreld.client.wire import exptime, read_key

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


def raw_set(proc: KestreldProcess, queue: str, data: str) -> None:
    """Put an item on one particular server, bypassing the client."""
    conn = Conn(proc.connect())
    try:
        assert conn.set(queue, data) == b"STORED"
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
def client(server):
    with Client([address(server)]) as c:
        yield c


@pytest.fixture
def cluster_client(cluster):
    with Client([address(p) for p in cluster], down_period=0.5, max_down_period=1.0) as c:
        yield c


# --- put, get, peek ---------------------------------------------------------------------


def test_put_then_get_returns_the_item_and_empties_the_queue(client, qname):
    assert client.put(qname, b"hello") is True
    assert client.get(qname) == b"hello"
    assert client.get(qname) is None


def test_text_is_stored_as_utf8(client, qname):
    client.put(qname, "naïve ☃")
    assert client.get(qname) == "naïve ☃".encode()


def test_get_without_timeout_does_not_wait(client, qname):
    started = time.monotonic()
    assert client.get(qname) is None
    assert time.monotonic() - started < 0.5


def test_get_with_timeout_waits_for_an_item_put_later(client, server, qname):
    producer = Client([address(server)])
    timer = threading.Timer(0.3, producer.put, args=(qname, b"late"))
    timer.start()
    try:
        started = time.monotonic()
        assert client.get(qname, timeout=5.0) == b"late"
        assert 0.2 < time.monotonic() - started < 4.0
    finally:
        timer.join()
        producer.close()


def test_get_with_timeout_gives_up_after_the_timeout(client, qname):
    started = time.monotonic()
    assert client.get(qname, timeout=0.4) is None
    assert 0.35 < time.monotonic() - started < 3.0


def test_a_timeout_too_short_to_wait_still_asks_once(client, qname):
    client.put(qname, b"there")
    assert client.get(qname, timeout=1e-9) == b"there"


def test_peek_leaves_the_item_in_place(client, qname):
    client.put(qname, b"a")
    client.put(qname, b"b")
    assert client.peek(qname) == b"a"
    assert client.peek(qname) == b"a"
    assert client.get(qname) == b"a"


def test_an_item_put_with_an_expiry_is_gone_after_it(client, qname):
    client.put(qname, b"short-lived", expiry=timedelta(seconds=1))
    client.put(qname, b"forever")
    time.sleep(1.2)
    assert client.get(qname) == b"forever"


def test_illegal_names_and_puts_to_a_fanout_reader_are_refused_before_sending(client, qname):
    for bad in ("", "a b", "a/b", "../x", "q+", "a+b+c", "x" * 201):
        with pytest.raises(ValueError):
            client.put(bad, b"x")
    with pytest.raises(ValueError, match="fanout"):
        client.put(f"{qname}+audit", b"x")


def test_option_and_reader_keys_pass_pymemcache_key_checks(client, qname):
    # "/", "=" and "+" in keys: jobs/t=10/open, q+r
    assert client.get(f"{qname}+audit", timeout=0.01) is None  # creates the reader
    client.put(qname, b"both")
    assert client.get(f"{qname}+audit", timeout=0.5) == b"both"
    with client.reserve(qname, timeout=0.5) as item:
        assert item is not None and item.data == b"both"


def test_put_many_stores_every_item_in_order_across_pipelines(client, server, qname):
    items = [f"item-{i}".encode() for i in range(2500)]  # three pipelines of at most 1000
    assert client.put_many(qname, items) == 2500
    assert items_on(server, qname) == 2500
    got = []
    with client.reliable_reads(qname, timeout=0.2) as reads:
        got = [item.data for item in reads]
    assert got == items


def test_put_and_put_many_report_items_a_full_queue_refused(make_server, qname):
    proc = make_server("max_items = 3")
    with Client([address(proc)]) as c:
        assert c.put_many(qname, [b"1", b"2"]) == 2
        assert c.put_many(qname, [b"3", b"4", b"5"]) == 1
        assert c.put(qname, b"6") is False
        assert items_on(proc, qname) == 3


# --- reliable reads -----------------------------------------------------------------------


def test_reserve_confirms_the_item_when_the_block_succeeds(client, server, qname):
    client.put(qname, b"job")
    with client.reserve(qname, timeout=1.0) as item:
        assert item is not None and item.data == b"job" and item.is_open
        assert item.server == address(server)
    assert item.state is ItemState.CONFIRMED
    assert client.get(qname) is None
    assert client.stats()[address(server)].queue(qname)["open_transactions"] == 0


def test_reserve_aborts_the_item_when_the_block_raises(client, qname):
    client.put(qname, b"first")
    client.put(qname, b"second")
    with pytest.raises(RuntimeError, match="boom"):
        with client.reserve(qname, timeout=1.0) as item:
            assert item.data == b"first"
            raise RuntimeError("boom")
    assert item.state is ItemState.ABORTED
    assert [client.get(qname), client.get(qname)] == [b"first", b"second"]


def test_reserve_gives_none_when_no_item_comes_in_time(client, qname):
    with client.reserve(qname, timeout=0.2) as item:
        assert item is None


def test_reserve_leaves_an_item_the_block_closed_itself_alone(client, qname):
    client.put(qname, b"x")
    with client.reserve(qname, timeout=1.0) as item:
        assert client.abort(item) is True
    assert item.state is ItemState.ABORTED
    assert client.get(qname) == b"x"


def test_an_item_reserved_by_a_crashed_process_goes_back_to_the_queue(client, server, qname):
    client.put(qname, b"crash-me")
    code = (
        "import sys, time\n"
        "from kestreld.client import Client\n"
        f"c = Client([{address(server)!r}])\n"
        f"with c.reserve({qname!r}, timeout=5) as item:\n"
        "    print(item.data.decode(), flush=True)\n"
        "    time.sleep(60)\n"
    )
    worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    try:
        assert worker.stdout.readline().strip() == b"crash-me"
        assert client.get(qname) is None  # held by the worker
    finally:
        worker.kill()
        worker.wait()
        worker.stdout.close()
    assert client.get(qname, timeout=5.0) == b"crash-me"


def test_open_confirm_and_abort_by_hand(client, qname):
    client.put(qname, b"a")
    client.put(qname, b"b")
    first = client.open(qname)
    second = client.open(qname)
    assert (first.data, second.data) == (b"a", b"b")
    assert client.abort(first) is True
    assert client.confirm(second) is True
    assert client.confirm(second) is False  # no longer open
    assert client.abort(first) is False
    assert client.get(qname) == b"a"
    assert client.get(qname) is None


def test_reliable_reads_yield_every_item_once_and_leave_nothing_open(client, server, qname):
    client.put_many(qname, [b"a", b"b", b"c"])
    with client.reliable_reads(qname, timeout=0.2) as reads:
        seen = [item.data for item in reads]
    assert seen == [b"a", b"b", b"c"]
    assert client.stats()[address(server)].queue(qname)["open_transactions"] == 0
    assert client.get(qname) is None


def test_reliable_reads_confirm_and_open_in_one_round_trip(client, server, qname):
    client.put_many(qname, [str(i) for i in range(50)])
    before = client.stats()[address(server)].values["cmd_get"]
    with client.reliable_reads(qname, timeout=0.1) as reads:
        assert len(list(reads)) == 50
    gets = client.stats()[address(server)].values["cmd_get"] - before
    # one get/open, 49 close/open hits, one close/open miss, one blocking get at the end
    assert 50 <= gets <= 53


def test_reliable_reads_abort_the_item_in_hand_when_the_loop_raises(client, qname):
    client.put_many(qname, [b"a", b"b", b"c"])
    with pytest.raises(KeyError):
        with client.reliable_reads(qname, timeout=0.2) as reads:
            for item in reads:
                if item.data == b"b":
                    raise KeyError("b")
    assert [client.get(qname), client.get(qname), client.get(qname)] == [b"b", b"c", None]


def test_reliable_reads_confirm_the_item_in_hand_on_break(client, qname):
    client.put_many(qname, [b"a", b"b"])
    with client.reliable_reads(qname, timeout=0.2) as reads:
        item = next(reads)
    assert item.data == b"a"
    assert item.state is ItemState.CONFIRMED
    assert client.get(qname) == b"b"


def test_reliable_reads_on_a_server_being_drained_confirm_the_item_in_hand(client, server, qname):
    client.put_many(qname, [b"a", b"b"])
    try:
        with client.reliable_reads(qname, timeout=0.2) as reads:
            first = next(reads)
            client.set_status(address(server), "quiescent")
            assert list(reads) == []  # a quiescent server hands out nothing
    finally:
        client.set_status(address(server), "up")
    assert first.state is ItemState.CONFIRMED
    assert [client.get(qname), client.get(qname)] == [b"b", None]


# --- stats and administration ---------------------------------------------------------------


def test_stats_are_parsed_into_numbers_per_server_and_per_queue(client, server, qname):
    client.put(f"{qname}_total", b"1")  # "queue_<q>_total_items" is ambiguous in plain stats
    client.put_many(qname, [b"1", b"2"])
    stats = client.stats()[address(server)]
    assert stats.server == address(server)
    assert stats.values["version"] == "1.0.0"
    assert isinstance(stats.values["curr_items"], int)
    assert isinstance(stats.values["reserved_memory_ratio"], float)
    assert stats.queue(qname)["items"] == 2
    assert stats.queue(f"{qname}_total")["items"] == 1
    assert stats.queue("no_such_queue") == {}
    assert not [key for key in stats.values if key.startswith(f"queue_{qname}")]


def test_version_and_status_are_reported_per_server(cluster_client, cluster):
    addresses = {address(p) for p in cluster}
    assert cluster_client.version() == dict.fromkeys(addresses, "1.0.0")
    assert cluster_client.status() == dict.fromkeys(addresses, "UP")
    with pytest.raises(ValueError):
        cluster_client.set_status(address(cluster[0]), "sleepy")


def test_flush_and_delete_reach_every_server(cluster_client, cluster, qname):
    for proc in cluster:
        raw_set(proc, qname, "x")
    cluster_client.flush(qname)
    assert [items_on(p, qname) for p in cluster] == [0, 0, 0]
    cluster_client.delete(qname)
    assert all(qname not in stats.queues for stats in cluster_client.stats().values())


def test_a_readonly_server_is_skipped_by_puts(cluster_client, cluster, qname):
    readonly = address(cluster[0])
    cluster_client.set_status(readonly, "readonly")
    try:
        assert cluster_client.status()[readonly] == "READONLY"
        for i in range(30):
            assert cluster_client.put(qname, str(i)) is True
    finally:
        cluster_client.set_status(readonly, "up")
    assert items_on(cluster[0], qname) == 0
    assert items_on(cluster[1], qname) + items_on(cluster[2], qname) == 30


def test_a_put_every_server_refuses_raises_the_server_error(make_server, qname):
    proc = make_server()
    with Client([address(proc)]) as c:
        c.set_status(address(proc), "readonly")
        with pytest.raises(ServerError, match="(?i)readonly"):
            c.put(qname, b"x")


# --- cluster ------------------------------------------------------------------------------------


def test_reads_find_items_on_every_server(cluster_client, cluster, qname):
    for proc in cluster:
        for i in range(3):
            raw_set(proc, qname, f"{proc.port}-{i}")
    got = [cluster_client.get(qname) for _ in range(9)]
    assert sorted(got) == sorted(f"{p.port}-{i}".encode() for p in cluster for i in range(3))
    assert cluster_client.get(qname) is None


def test_a_blocking_read_sees_an_item_that_arrives_on_any_server(cluster_client, cluster, qname):
    for proc in cluster:
        timer = threading.Timer(0.3, raw_set, args=(proc, qname, str(proc.port)))
        timer.start()
        try:
            assert cluster_client.get(qname, timeout=5.0) == str(proc.port).encode()
        finally:
            timer.join()


def test_items_put_through_the_cluster_are_consumed_exactly_once_by_reliable_readers(
    cluster, qname
):
    addresses = [address(p) for p in cluster]
    expected = [f"job-{i}" for i in range(600)]
    consumed: list[tuple[str, str]] = []
    lock = threading.Lock()
    done = threading.Event()
    deadline = time.monotonic() + 60

    def record(item) -> None:
        with lock:
            consumed.append((item.data.decode(), item.server))
            if len(consumed) >= len(expected):
                done.set()

    def produce(part: list[str], many: bool) -> None:
        with Client(addresses) as c:
            if many:
                for start in range(0, len(part), 50):
                    assert c.put_many(qname, part[start : start + 50]) == len(
                        part[start : start + 50]
                    )
            else:
                for data in part:
                    assert c.put(qname, data)

    def consume_iterator(switch_after: int) -> None:
        with Client(addresses) as c:
            while not done.is_set() and time.monotonic() < deadline:
                with c.reliable_reads(qname, timeout=0.3, switch_after=switch_after) as reads:
                    for item in reads:
                        record(item)
                        if done.is_set():
                            break

    def consume_reserve() -> None:
        with Client(addresses) as c:
            while not done.is_set() and time.monotonic() < deadline:
                with c.reserve(qname, timeout=0.3) as item:
                    if item is not None:
                        record(item)

    threads = [
        threading.Thread(target=produce, args=(expected[:300], False)),
        threading.Thread(target=produce, args=(expected[300:], True)),
        threading.Thread(target=consume_iterator, args=(100,)),
        threading.Thread(target=consume_iterator, args=(3,)),
        threading.Thread(target=consume_reserve),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    counts = collections.Counter(data for data, _ in consumed)
    assert sorted(counts) == sorted(expected)
    assert set(counts.values()) == {1}
    assert {server for _, server in consumed} == set(addresses)  # every server had a share
    with Client(addresses) as c:
        for stats in c.stats().values():
            assert stats.queue(qname)["items"] == 0
            assert stats.queue(qname)["open_transactions"] == 0


def test_a_killed_server_is_avoided_and_its_items_come_back_after_it_restarts(cluster, qname):
    victim = cluster[2]
    addresses = [address(p) for p in cluster]
    before_kill = [f"a-{i}" for i in range(300)]
    during_outage = [f"b-{i}" for i in range(60)]
    consumed: list[tuple[str, str]] = []
    with Client(addresses, down_period=0.3, max_down_period=1.0) as c:
        for data in before_kill:
            assert c.put(qname, data)
        assert items_on(victim, qname) > 0
        held = None
        while len(consumed) < 90 or held is None:  # consume some; keep one of the victim's open
            item = c.open(qname, timeout=1.0)
            assert item is not None
            if held is None and item.server == address(victim):
                held = item
                continue
            consumed.append((item.data.decode(), item.server))
            assert c.confirm(item)

        victim.kill()
        try:
            assert c.confirm(held) is False  # the connection died with the server
            for data in during_outage:
                assert c.put(qname, data)
            while True:  # everything the live servers hold
                with c.reserve(qname, timeout=0.5) as item:
                    if item is None:
                        break
                    consumed.append((item.data.decode(), item.server))
                    assert item.server != address(victim)
            state = c.cluster.server(address(victim))
            assert state.failures >= 1 and state.last_error
        finally:
            victim.start()

        missing = set(before_kill + during_outage) - {data for data, _ in consumed}
        assert held.data.decode() in missing
        deadline = time.monotonic() + 30
        while missing and time.monotonic() < deadline:
            with c.reserve(qname, timeout=1.0) as item:
                if item is not None:
                    consumed.append((item.data.decode(), item.server))
                    missing.discard(item.data.decode())
        assert not missing
        assert c.cluster.server(address(victim)).failures == 0
    counts = collections.Counter(data for data, _ in consumed)
    duplicated_from = {server for data, server in consumed if counts[data] > 1}
    assert duplicated_from <= {address(victim)}  # only a crash can redeliver a confirmed item
    assert all(server != address(victim) for data, server in consumed if data.startswith("b-"))


# --- failover ----------------------------------------------------------------------------------


def test_a_dead_server_is_marked_down_then_retried_after_its_down_period(cluster, qname):
    victim = cluster[1]
    with Client([address(p) for p in cluster], down_period=1.0) as c:
        state = c.cluster.server(address(victim))
        victim.kill()
        try:
            for _ in range(200):  # writes pick servers at random: until one picks the victim
                assert c.put(qname, b"x")
                if state.failures:
                    break
            assert state.failures == 1
            assert not state.is_up(c.cluster.clock())
            for _ in range(30):
                assert c.put(qname, b"y")
            assert state.failures == 1  # not tried again during its down period
        finally:
            victim.start()
        time.sleep(max(0.0, state.down_until - c.cluster.clock()) + 0.05)
        for _ in range(60):
            assert c.put(qname, b"z")
        assert state.failures == 0
        assert items_on(victim, qname) > 0


def test_the_down_period_doubles_while_a_server_stays_dead(server, qname):
    dead = dead_address()
    with Client([address(server), dead], down_period=0.3, max_down_period=0.6) as c:
        state = c.cluster.server(dead)
        for expected_failures, expected_period in ((1, 0.3), (2, 0.6), (3, 0.6)):
            time.sleep(max(0.0, state.down_until - c.cluster.clock()))
            for _ in range(200):
                before = c.cluster.clock()
                c.put(qname, b"x")
                after = c.cluster.clock()
                if state.failures == expected_failures:
                    break
            assert state.failures == expected_failures
            # The failure happened during that put: its down period runs from then,
            # however long the machine took to get here.
            assert before + expected_period <= state.down_until <= after + expected_period


def test_reads_and_writes_fail_over_to_the_live_servers(server, qname):
    with Client([dead_address(), address(server), dead_address()]) as c:
        for i in range(20):
            assert c.put(qname, str(i))
        assert sorted(int(c.get(qname)) for _ in range(20)) == list(range(20))
        assert c.get(qname, timeout=0.3) is None


def test_every_server_unreachable_raises_no_server_available(qname):
    with Client([dead_address(), dead_address()], down_period=0.1) as c:
        with pytest.raises(NoServerAvailable):
            c.put(qname, b"x")
        with pytest.raises(NoServerAvailable):
            c.get(qname, timeout=0.3)
        with pytest.raises(NoServerAvailable):
            c.stats()


def test_stats_and_flush_leave_a_server_marked_down_alone_until_its_retry_time(server, qname):
    dead = dead_address()
    with Client([address(server), dead], down_period=30.0, max_down_period=60.0) as c:
        assert set(c.stats()) == {address(server)}  # the first call finds it dead
        state = c.cluster.server(dead)
        assert state.failures == 1
        until = state.down_until
        for _ in range(3):
            assert set(c.stats()) == {address(server)}
            with pytest.raises(ConnectionFailed, match="marked down"):
                c.flush(qname)
        assert state.failures == 1 and state.down_until == until  # back-off not raised


def test_an_idle_connection_the_server_closed_is_not_taken_for_a_dead_server(make_server, qname):
    proc = make_server('client_timeout = "200ms"')
    with Client([address(proc)]) as c:
        assert c.put(qname, b"1")
        deadline = time.monotonic() + 5
        while not proc.events("idle_connection_closed") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.events("idle_connection_closed")
        assert c.put(qname, b"2")
        assert c.servers[0].failures == 0


# --- pure helpers --------------------------------------------------------------------------------


def test_read_keys_carry_the_options_in_protocol_form():
    assert read_key("jobs") == "jobs"
    assert read_key("jobs", wait=0.25, open=True, close=True) == "jobs/t=250/close/open"
    assert read_key("jobs", wait=0.0001) == "jobs/t=1"  # a short wait still waits
    assert read_key("q+r", abort=True) == "q+r/abort"
    with pytest.raises(ValueError):
        read_key("a" * 200 + "+" + "b" * 200, open=True)  # over memcache's 250 bytes


def test_expiry_is_sent_in_whole_seconds_and_long_ones_as_absolute_time():
    assert exptime(None) == 0
    assert exptime(0.2) == 1
    assert exptime(timedelta(minutes=2)) == 120
    assert exptime(2_000_000, now=1_700_000_000) == 1_702_000_000
    for bad in (0, -1, float("inf")):
        with pytest.raises(ValueError):
            exptime(bad)


def test_server_addresses_take_the_usual_forms():
    assert parse_server("10.0.0.1:22134") == ("10.0.0.1", 22134)
    assert parse_server("kestrel.local") == ("kestrel.local", 22133)
    assert parse_server("[::1]:22135") == ("::1", 22135)
    assert parse_server(("h", 1)) == ("h", 1)
    with pytest.raises(ValueError):
        parse_server("h:port")


def test_reads_start_one_server_further_each_time_so_none_starves():
    cluster = Cluster(["a:1", "b:1", "c:1"], rng=random.Random(7))
    firsts = [cluster.read_order()[0].host for _ in range(6)]
    assert sorted(firsts) == ["a", "a", "b", "b", "c", "c"]
    assert all(len(cluster.read_order()) == 3 for _ in range(3))


def test_writes_pick_servers_at_random_among_those_up():
    cluster = Cluster(["a:1", "b:1", "c:1"], rng=random.Random(7))
    cluster.mark_down(cluster.server("b:1"), "refused")
    firsts = collections.Counter(cluster.write_order()[0].host for _ in range(300))
    assert set(firsts) == {"a", "c"} and min(firsts.values()) > 100


def test_a_failure_seen_by_overlapping_requests_counts_once_and_success_clears_it():
    now = [100.0]
    cluster = Cluster(["a:1", "b:1"], down_period=1.0, max_down_period=4.0, clock=lambda: now[0])
    a = cluster.server("a:1")
    started = now[0]
    cluster.mark_down(a, "reset", started)
    cluster.mark_down(a, "reset", started)  # another connection of the same outage
    assert (a.failures, a.down_until) == (1, 101.0)
    assert [s.host for s in cluster.write_order()] == ["b"]
    cluster.mark_up(a, started)  # a success that began before the failure proves nothing
    assert a.failures == 1
    now[0] = 102.0
    cluster.mark_up(a, now[0])
    assert (a.failures, a.down_until) == (0, 0.0)


def test_when_every_server_is_down_all_are_offered_soonest_retry_first():
    now = [0.0]
    cluster = Cluster(["a:1", "b:1"], down_period=1.0, clock=lambda: now[0])
    cluster.mark_down(cluster.server("b:1"), "x")
    now[0] = 0.5
    cluster.mark_down(cluster.server("a:1"), "x")
    assert [s.host for s in cluster.write_order()] == ["b", "a"]
    assert [s.host for s in cluster.read_order()] == ["b", "a"]


def test_stats_parsing_tells_queue_keys_from_global_ones():
    stats = parse_stats(
        "h:1",
        [
            b"STAT uptime 5",
            b"STAT version 1.0.0",
            b"STAT reserved_memory_ratio 0.125",
            b"STAT queue_creates 2",
            b"STAT queue_a_items 1",
            b"STAT queue_a_total_items 7",
            b"STAT queue_a_total_items 3",
        ],
        [
            b"queue 'a' {",
            b"  items=1",
            b"  total_items=7",
            b"}",
            b"queue 'a_total' {",
            b"  items=3",
            b"}",
        ],
    )
    assert stats.values == {
        "uptime": 5,
        "version": "1.0.0",
        "reserved_memory_ratio": 0.125,
        "queue_creates": 2,
    }
    assert stats.queues == {"a": {"items": 1, "total_items": 7}, "a_total": {"items": 3}}
