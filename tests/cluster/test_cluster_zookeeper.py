"""ZooKeeper server sets: real kestreld processes and a real ZooKeeper (tests/support/zookeeper.py).

A server is a member of ``<path_prefix>/read`` while UP, WRITEAVOID or
READONLY and of ``<path_prefix>/write`` only while UP; members are ephemeral
sequential ``member_`` nodes holding Twitter's server-set JSON.  The tests
read the sets with their own ZooKeeper session (kazoo), as any Finagle
client would.
"""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError, NoNodeError
from kestreld_process import Conn
from waiting import wait_until
from zookeeper import ZooKeeperProcess, available

from kestreld.cluster.member import parse_member

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


@pytest.fixture(scope="module")
def zookeeper(tmp_path_factory):
    zk = ZooKeeperProcess(tmp_path_factory.mktemp("zookeeper"))
    zk.start()
    yield zk
    zk.stop()


@pytest.fixture
def own_zookeeper(tmp_path):
    """A ZooKeeper of this test alone (it will be stopped and started)."""
    zk = ZooKeeperProcess(tmp_path / "zookeeper")
    yield zk
    zk.stop()


@pytest.fixture
def prefix(request) -> str:
    return "/kestrel/" + "".join(c if c.isalnum() else "_" for c in request.node.name)


class Sets:
    """The server sets as a reader sees them: its own session, no credentials."""

    def __init__(self, hosts: str, prefix: str, auth: list | None = None) -> None:
        self.prefix = prefix
        self.zk = KazooClient(hosts=hosts, timeout=10.0, auth_data=auth)
        self.zk.start(timeout=30)

    def nodes(self, name: str) -> list[str]:
        path = f"{self.prefix}/{name}"
        if self.zk.exists(path) is None:
            return []
        return [f"{path}/{child}" for child in sorted(self.zk.get_children(path))]

    def members(self, name: str) -> list[dict]:
        out = []
        for node in self.nodes(name):
            try:
                data, _ = self.zk.get(node)
            except NoNodeError:  # left between the listing and the read
                continue
            out.append(json.loads(data))
        return out

    def ports(self, name: str) -> list[int]:
        return sorted(m["serviceEndpoint"]["port"] for m in self.members(name))

    def close(self) -> None:
        self.zk.stop()
        self.zk.close()


@pytest.fixture
def sets(zookeeper, prefix):
    s = Sets(zookeeper.hosts, prefix)
    yield s
    s.close()


def zk_config(hosts: str, prefix: str, extra: str = "", top: str = "") -> str:
    return (
        top + f'[zookeeper]\nhosts = "{hosts}"\npath_prefix = "{prefix}"\n'
        'session_timeout = "2s"\n' + extra
    )


def command(proc, line: bytes) -> bytes:
    """One request on a fresh connection; its first reply line."""
    conn = Conn(proc.connect())
    try:
        conn.send(line + b"\r\n")
        return conn.line()
    finally:
        conn.close()


def status(proc, word: str) -> bytes:
    return command(proc, f"status {word}".strip().encode())


def put(proc, queue: str, data: bytes) -> bytes:
    return command(proc, b"set %s 0 0 %d\r\n%s" % (queue.encode(), len(data), data))


def stat(proc, key: str) -> str | None:
    conn = Conn(proc.connect())
    try:
        return conn.stats().get(key)
    finally:
        conn.close()


def test_a_server_joins_both_sets_with_its_memcache_endpoint(make_server, zookeeper, prefix, sets):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("read") == [proc.port] == sets.ports("write"), "joined")
    expected = {
        "serviceEndpoint": {"host": "127.0.0.1", "port": proc.port},
        "additionalEndpoints": {"memcache": {"host": "127.0.0.1", "port": proc.port}},
        "status": "ALIVE",
    }
    assert sets.members("read") == [expected]
    assert sets.members("write") == [expected]
    for node in sets.nodes("read") + sets.nodes("write"):
        assert node.rsplit("/", 1)[1].startswith("member_")
        _, stat_ = sets.zk.get(node)
        assert stat_.ephemeralOwner != 0  # ephemeral: gone with the server's session
    assert proc.events("zookeeper_advertises_loopback")


def test_each_status_moves_the_server_in_and_out_of_the_sets(make_server, zookeeper, prefix, sets):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("write") == [proc.port], "joined the write set")
    expected = {  # status -> (in read set, in write set, writes stored)
        "writeavoid": (True, False, True),
        "readonly": (True, False, False),
        "quiescent": (False, False, False),
        "up": (True, True, True),
    }
    for word, (read, write, writes) in expected.items():
        assert status(proc, word) == b"END"
        want = ([proc.port] if read else [], [proc.port] if write else [])
        wait_until(
            lambda want=want: (sets.ports("read"), sets.ports("write")) == want, f"sets for {word}"
        )
        assert status(proc, "") == word.upper().encode()
        reply = put(proc, "jobs", b"x")
        assert (reply == b"STORED") is writes, (word, reply)
        if not writes:
            assert reply.startswith(b"SERVER_ERROR server is ")


def test_the_write_set_empties_before_writes_are_refused(make_server, zookeeper, prefix, sets):
    grace = 6.0
    proc = make_server(
        zk_config(zookeeper.hosts, prefix, top=f'status_change_grace_period = "{grace:g}s"\n')
    )
    wait_until(lambda: sets.ports("write") == [proc.port], "joined the write set")
    started = time.monotonic()
    assert status(proc, "readonly") == b"END"
    wait_until(lambda: sets.ports("write") == [], "left the write set")
    left_at = time.monotonic() - started
    assert sets.ports("read") == [proc.port]
    # Announced, not yet enforced: writes still stored, the reply names both statuses.
    assert put(proc, "jobs", b"during grace") == b"STORED"
    reply = status(proc, "")
    assert reply.startswith(b"UP (pending READONLY in "), reply
    assert time.monotonic() - started < grace, "the machine is too slow for this grace period"
    wait_until(lambda: put(proc, "jobs", b"late") != b"STORED", "writes refused")
    refused_at = time.monotonic() - started
    assert put(proc, "jobs", b"late") == b"SERVER_ERROR server is READONLY"
    assert status(proc, "") == b"READONLY"
    assert left_at < grace - 1.0 <= refused_at
    # Looser applies at once: UP again, writes stored and back in the write set.
    assert status(proc, "up") == b"END"
    assert put(proc, "jobs", b"again") == b"STORED"
    wait_until(lambda: sets.ports("write") == [proc.port], "back in the write set")


def test_a_killed_server_leaves_the_sets_when_its_session_times_out(
    make_server, zookeeper, prefix, sets
):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("read") == [proc.port] == sets.ports("write"), "joined")
    proc.kill()
    killed = time.monotonic()
    wait_until(lambda: sets.nodes("read") == [] == sets.nodes("write"), "members expired", 60)
    assert time.monotonic() - killed < 30  # 2 s session timeout, generous for a loaded box


def test_a_graceful_stop_leaves_both_sets_before_the_listeners_close(
    make_server, zookeeper, prefix, sets
):
    # A long session: only leaving explains the members' going at once.
    config = zk_config(zookeeper.hosts, prefix).replace('"2s"', '"60s"')
    proc = make_server(config)
    wait_until(lambda: sets.ports("read") == [proc.port] == sets.ports("write"), "joined")
    assert proc.stop() == 0
    assert sets.nodes("read") == [] and sets.nodes("write") == []
    names = [json.loads(line).get("event") for line in proc.log_lines if line.startswith("{")]
    assert names.index("server_sets_left") < names.index("stopped")


@pytest.mark.parametrize("wipe", [False, True], ids=["same_data", "wiped"])
def test_zookeeper_down_never_stops_the_queue_server_and_it_rejoins(
    make_server, own_zookeeper, prefix, wipe
):
    zk = own_zookeeper
    zk.start()
    proc = make_server(zk_config(zk.hosts, prefix, top="metrics_port = 0\n"))
    sets = Sets(zk.hosts, prefix)
    try:
        wait_until(lambda: sets.ports("write") == [proc.port], "joined")
    finally:
        sets.close()
    zk.stop()
    wait_until(lambda: stat(proc, "zookeeper_connected") == "0", "noticed ZooKeeper gone")
    assert scrape_gauge(proc, "kestreld_zookeeper_connected") == 0.0
    # Serving all along, and past the session timeout.
    for i in range(5):
        assert put(proc, "jobs", b"item %d" % i) == b"STORED"
        time.sleep(0.6)
    conn = Conn(proc.connect())
    assert conn.get("jobs") == b"item 0"
    conn.close()
    # The ensemble comes back (wiped: it lost every node and session): the server is in
    # both sets again, its old session resumed or a new one joined.
    zk.start(wipe=wipe)
    sets = Sets(zk.hosts, prefix)
    try:
        wait_until(
            lambda: sets.ports("read") == [proc.port] == sets.ports("write"), "re-joined", 60
        )
    except AssertionError:
        print("\n".join(proc.log_lines[-60:]))
        raise
    finally:
        sets.close()
    wait_until(lambda: stat(proc, "zookeeper_connected") == "1", "connected again")
    assert scrape_gauge(proc, "kestreld_zookeeper_connected") == 1.0
    wait_until(lambda: proc.events("zookeeper_disconnected"), "zookeeper_disconnected logged")


def test_a_server_started_while_zookeeper_is_down_serves_and_joins_later(
    make_server, own_zookeeper, prefix
):
    zk = own_zookeeper  # its port is chosen, nothing listens there yet
    proc = make_server(zk_config(zk.hosts, prefix))
    assert put(proc, "jobs", b"served") == b"STORED"
    assert stat(proc, "zookeeper_connected") == "0"
    zk.start()
    sets = Sets(zk.hosts, prefix)
    try:
        wait_until(lambda: sets.ports("write") == [proc.port], "joined once ZooKeeper came", 60)
    finally:
        sets.close()


def test_digest_credentials_keep_other_sessions_from_deleting_members(
    make_server, zookeeper, prefix, sets
):
    proc = make_server(
        zk_config(
            zookeeper.hosts,
            prefix,
            'credentials = "kestrel:secret"\nacl = "everyone_read_creator_all"\n',
        )
    )
    wait_until(lambda: sets.ports("read") == [proc.port] == sets.ports("write"), "joined")
    node = sets.nodes("write")[0]
    with pytest.raises(NoAuthError):
        sets.zk.delete(node)  # anyone may read, not delete
    with pytest.raises(NoAuthError):
        sets.zk.set(node, b"{}")
    other = Sets(zookeeper.hosts, prefix, auth=[("digest", "intruder:guess")])
    try:
        with pytest.raises(NoAuthError):
            other.zk.delete(node)
    finally:
        other.close()
    assert sets.nodes("write") == [node]


def test_a_member_deleted_by_someone_else_is_created_again(make_server, zookeeper, prefix, sets):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("write") == [proc.port], "joined")
    node = sets.nodes("write")[0]
    sets.zk.delete(node)
    wait_until(lambda: sets.ports("write") == [proc.port], "member re-created")
    assert sets.nodes("write") != [node]
    wait_until(lambda: proc.events("server_set_member_vanished"), "member_vanished logged")


def test_a_member_overwritten_by_someone_else_is_repaired(make_server, zookeeper, prefix, sets):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("read") == [proc.port], "joined")
    node = sets.nodes("read")[0]
    sets.zk.set(node, b"not json")

    def repaired() -> bool:
        data, _ = sets.zk.get(node)
        try:
            return parse_member(data).service_endpoint.port == proc.port
        except ValueError:
            return False

    wait_until(repaired, "member data repaired")


def scrape_gauge(proc, name: str) -> float:
    event = proc.events("metrics_listening")[-1]
    with urllib.request.urlopen(f"http://{event['address']}/metrics", timeout=10) as reply:
        for line in reply.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_advertise_address_is_the_host_in_the_members(make_server, zookeeper, prefix, sets):
    proc = make_server(
        zk_config(zookeeper.hosts, prefix, 'advertise_address = "kestrel-7.example.net"\n')
    )
    wait_until(lambda: sets.members("read"), "joined")
    member = sets.members("read")[0]
    assert member["serviceEndpoint"] == {"host": "kestrel-7.example.net", "port": proc.port}
    assert member["additionalEndpoints"]["memcache"] == member["serviceEndpoint"]
    assert proc.events("zookeeper_advertises_loopback") == []


def test_a_reload_names_a_changed_zookeeper_table_as_needing_a_restart(
    make_server, zookeeper, prefix, sets
):
    proc = make_server(zk_config(zookeeper.hosts, prefix))
    wait_until(lambda: sets.ports("write") == [proc.port], "joined")
    proc.config_path.write_text(zk_config(zookeeper.hosts, prefix + "_moved"))
    assert command(proc, b"reload") == b"Reloaded config; needs a restart to apply: zookeeper"
    assert sets.ports("write") == [proc.port]  # still where it joined
