"""The client following ZooKeeper server sets: real ZooKeeper, real kestreld processes.

``Client(zookeeper="host:port/path_prefix")`` writes to the write set and
reads from the read set, and follows both while it runs: a server drained
with writeavoid -> readonly -> quiescent gets no new writes once it left the
write set, its open items still confirm, and a server that joins is used.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from kazoo.client import KazooClient
from kestreld_process import Conn
from structlog.testing import capture_logs
from waiting import wait_until
from zookeeper import ZooKeeperProcess, available

from kestreld.client import AsyncClient, Client
from kestreld.client.discovery import Discovery, split_connect_string

needs_zookeeper = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    if available() is not None:
        pytest.skip(str(available()))
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    yield zk
    zk.stop()


@pytest.fixture
def prefix(request) -> str:
    return "/kestrel/" + "".join(c if c.isalnum() else "_" for c in request.node.name)


def zk_config(hosts: str, prefix: str) -> str:
    return f'[zookeeper]\nhosts = "{hosts}"\npath_prefix = "{prefix}"\nsession_timeout = "2s"\n'


def command(proc, line: str) -> bytes:
    conn = Conn(proc.connect())
    try:
        conn.send(line + "\r\n")
        return conn.line()
    finally:
        conn.close()


def stats(proc) -> dict[str, str]:
    conn = Conn(proc.connect())
    try:
        return conn.stats()
    finally:
        conn.close()


def address(proc) -> str:
    return f"127.0.0.1:{proc.port}"


def addresses(states) -> list[str]:
    return sorted(s.address for s in states)


# --- the connect string ---------------------------------------------------------------------


def test_a_connect_string_is_hosts_then_the_path_prefix():
    assert split_connect_string("zk1:2181,zk2:2181/kestrel/prod") == (
        "zk1:2181,zk2:2181",
        "/kestrel/prod",
    )
    assert split_connect_string("zk1/kestrel/") == ("zk1", "/kestrel")


@pytest.mark.parametrize("bad", ["zk1:2181", "/kestrel", "zk1:2181/", "zk1:x/k", "zk1//k"])
def test_a_connect_string_without_hosts_or_path_is_refused(bad):
    with pytest.raises(ValueError, match="zookeeper="):
        split_connect_string(bad)


def test_servers_and_zookeeper_are_either_or():
    with pytest.raises(ValueError, match="not several"):
        Client(["127.0.0.1:22133"], zookeeper="127.0.0.1:1/kestrel")


# --- following the sets ---------------------------------------------------------------------


@needs_zookeeper
def test_discovery_follows_every_status_change(make_server, zookeeper, prefix):
    a = make_server(zk_config(zookeeper.hosts, prefix))
    b = make_server(zk_config(zookeeper.hosts, prefix))
    discovery = Discovery(f"{zookeeper.hosts}{prefix}")
    seen: list[tuple[list, list]] = []
    discovery.subscribe(lambda read, write: seen.append((read, write)))
    try:
        assert discovery.start()
        both = sorted([("127.0.0.1", a.port), ("127.0.0.1", b.port)])
        wait_until(lambda: sorted(discovery.write_servers()) == both, "both in the write set")
        # The read and write sets are watched apart: one may be seen a moment before the other.
        wait_until(lambda: sorted(discovery.read_servers()) == both, "both in the read set")
        only_b = [("127.0.0.1", b.port)]
        assert command(a, "status writeavoid") == b"END"
        wait_until(lambda: discovery.write_servers() == only_b, "a left the write set")
        assert sorted(discovery.read_servers()) == both
        assert command(a, "status quiescent") == b"END"
        wait_until(lambda: discovery.read_servers() == only_b, "a left the read set")
        assert seen[-1] == (only_b, only_b)
    finally:
        discovery.close()


@needs_zookeeper
def test_a_member_that_cannot_be_parsed_is_left_out_with_a_warning(make_server, zookeeper, prefix):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    other = KazooClient(hosts=zookeeper.hosts)
    other.start(timeout=30)
    try:
        other.create(
            f"{prefix}/read/member_", b"{not json", ephemeral=True, sequence=True, makepath=True
        )
        discovery = Discovery(f"{zookeeper.hosts}{prefix}")
        try:
            with capture_logs() as logs:
                discovery.start()
                wait_until(
                    lambda: discovery.read_servers() == [("127.0.0.1", proc.port)], "read set"
                )
            assert any(e["event"] == "server_set_member_unparsable" for e in logs)
        finally:
            discovery.close()
    finally:
        other.stop()
        other.close()


@needs_zookeeper
def test_the_client_follows_two_servers_as_one_drains_and_another_joins_losing_no_item(
    make_server, zookeeper, prefix
):
    a = make_server(zk_config(zookeeper.hosts, prefix))
    b = make_server(zk_config(zookeeper.hosts, prefix))
    client = Client(zookeeper=f"{zookeeper.hosts}{prefix}", poll_interval=0.05)
    produced: list[bytes] = []
    consumed: list[bytes] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            i = 0
            while not done.is_set():
                data = b"item-%d" % i
                if client.put("jobs", data):
                    produced.append(data)
                i += 1
                time.sleep(0.005)
        except BaseException as e:  # the test fails below, not silently in a thread
            errors.append(e)

    def consume(stop: threading.Event) -> None:
        try:
            while not stop.is_set():
                with client.reserve("jobs", timeout=0.2) as item:
                    if item is not None:
                        consumed.append(item.data)
        except BaseException as e:
            errors.append(e)

    try:
        wait_until(
            lambda: addresses(client.cluster.writers()) == sorted([address(a), address(b)]),
            "both servers in the client's write set",
        )
        stop_consuming = threading.Event()
        producer = threading.Thread(target=produce)
        consumer = threading.Thread(target=consume, args=(stop_consuming,))
        producer.start()
        consumer.start()
        wait_until(lambda: len(produced) >= 100, "items flowing")
        wait_until(lambda: int(stats(a)["cmd_set"]) > 0, "a takes writes")

        # Drain a: out of the write set first, then read-only, then quiescent.
        assert command(a, "status writeavoid") == b"END"
        wait_until(
            lambda: addresses(client.cluster.writers()) == [address(b)], "a out of the write set"
        )
        time.sleep(0.2)  # a put already under way when the set changed may still land
        sets_on_a = int(stats(a)["cmd_set"])
        mark = len(produced)
        wait_until(lambda: len(produced) >= mark + 100, "more items, all elsewhere")
        assert int(stats(a)["cmd_set"]) == sets_on_a, "a got writes after leaving the write set"
        assert command(a, "status readonly") == b"END"
        wait_until(lambda: int(stats(a)["curr_items"]) == 0, "a drained by the consumer")
        assert command(a, "status quiescent") == b"END"
        wait_until(
            lambda: address(a) not in addresses(client.cluster.servers), "a out of the read set"
        )

        # c joins: the client writes to it and reads from it without a restart.
        c = make_server(zk_config(zookeeper.hosts, prefix))
        wait_until(
            lambda: addresses(client.cluster.writers()) == sorted([address(b), address(c)]),
            "c in the client's write set",
        )
        wait_until(lambda: int(stats(c)["cmd_set"]) >= 20, "c takes writes")
        done.set()
        producer.join(30)
        wait_until(lambda: len(consumed) >= len(produced), "everything consumed", 60)
        stop_consuming.set()
        consumer.join(30)
    finally:
        done.set()
        client.close()
    assert errors == []
    assert sorted(consumed) == sorted(produced)  # every stored item, each once
    assert int(stats(a)["curr_items"]) == 0


@needs_zookeeper
def test_an_item_opened_on_a_server_that_leaves_both_sets_still_confirms(
    make_server, zookeeper, prefix
):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    with Client(zookeeper=f"{zookeeper.hosts}{prefix}") as client:
        wait_until(lambda: client.cluster.writers(), "the server in the write set")
        assert client.put("jobs", b"one")
        item = client.open("jobs", timeout=5)
        assert item is not None and item.data == b"one"
        assert command(proc, "status quiescent") == b"END"
        wait_until(lambda: client.cluster.servers == [], "out of the read set")
        assert client.confirm(item)
    assert int(stats(proc)["curr_items"]) == 0
    assert stats(proc).get("queue_jobs_open_transactions") in (None, "0")


@needs_zookeeper
def test_the_async_client_follows_the_sets(make_server, zookeeper, prefix):
    a = make_server(zk_config(zookeeper.hosts, prefix))

    async def scenario() -> None:
        discovery = Discovery(f"{zookeeper.hosts}{prefix}")
        await asyncio.to_thread(discovery.start)
        try:
            async with AsyncClient(discovery=discovery) as client:
                wait_until(lambda: client.cluster.writers(), "a in the write set")
                assert await client.put("jobs", b"first")
                assert command(a, "status readonly") == b"END"
                deadline = time.monotonic() + 30
                while client.cluster.writers() and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert client.cluster.writers() == []
                assert await client.get("jobs", timeout=2) == b"first"
        finally:
            await asyncio.to_thread(discovery.close)

    asyncio.run(scenario())
