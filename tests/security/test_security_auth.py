"""Authentication (auth_file) and roles on the memcache port, with real clients:
raw sockets, pymemcache, kestreld's own client, and real memcached ``-Y`` for the
refusal lines."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import subprocess
import time

import pytest
from kestreld_process import Conn
from waiting import wait_until

from kestreld.client import AsyncClient, AuthenticationFailed, Client, NoServerAvailable
from kestreld.security import hash_password

FAST = {"log2_n": 4}  # cheap hashes: the tests make and check many


def auth_file(tmp_path, lines: list[str]) -> str:
    path = tmp_path / "users"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def user(name: str, password: str, roles: str = "", patterns: str = "") -> str:
    fields = [name, hash_password(password, **FAST)]
    if roles or patterns:
        fields.append(roles or "read,write,admin")
    if patterns:
        fields.append(patterns)
    return ":".join(fields)


@pytest.fixture
def secured(make_server, tmp_path):
    path = auth_file(
        tmp_path,
        [
            user("alice", "secret"),
            user("reader", "r", "read"),
            user("writer", "w", "write"),
            user("orders", "o", "read,write,admin", "orders*"),
            user("ops", "a", "admin"),
        ],
    )
    return make_server(f'auth_file = "{path}"\n')


def login(proc, name: str, password: str) -> Conn:
    c = Conn(proc.connect())
    token = f"{name} {password}".encode()
    c.send(b"set any 0 0 %d\r\n%s\r\n" % (len(token), token))
    assert c.line() == b"STORED"
    return c


# --- memcached's auth set -------------------------------------------------------------------

#: (request bytes, the reply lines) of an unauthenticated connection; memcached 1.6 gives the same.
EXCHANGES = [
    (b"get foo\r\n", [b"CLIENT_ERROR unauthenticated"]),
    (b"version\r\n", [b"CLIENT_ERROR unauthenticated"]),
    (b"delete foo\r\n", [b"CLIENT_ERROR unauthenticated"]),
    (b"bogus\r\n", [b"CLIENT_ERROR unauthenticated"]),
    (b"set x 0 0 12\r\nalice secrex\r\n", [b"CLIENT_ERROR authentication failure"]),
    (b"set x 0 0 9\r\nnouser pw\r\n", [b"CLIENT_ERROR authentication failure"]),
    (b"set x 0 0 10\r\nalicesecre\r\n", [b"CLIENT_ERROR bad authentication token format"]),
    (b"set x 0 0 6\r\nalice \r\n", [b"CLIENT_ERROR bad authentication token format"]),
    (b"set x 0 0 0\r\n\r\n", [b"CLIENT_ERROR bad authentication token format"]),
    (b"set x 0 0 12\r\nalice secret\r\n", [b"STORED"]),
    (b"set x 0 0 13\r\nalice  secret\r\n", [b"STORED"]),
    (b"set x 0 0 14\r\nalice secret x\r\n", [b"STORED"]),
]
#: Pipelined: each refusal in order, the connection open after each.  (memcached 1.6.18
#: answers this one STORED, once: it reads a pipelined token wrongly.)
PIPELINED = (
    b"set x 0 0 11\r\nalice wrong\r\nget foo\r\nset x 0 0 12\r\nalice secret\r\n",
    [b"CLIENT_ERROR authentication failure", b"CLIENT_ERROR unauthenticated", b"STORED"],
)


def exchange(sock: socket.socket, request: bytes, count: int) -> list[bytes]:
    c = Conn(sock)
    c.send(request)
    lines = [c.line() for _ in range(count)]
    c.close()
    return lines


@pytest.mark.parametrize(("request_bytes", "replies"), [*EXCHANGES, PIPELINED])
def test_the_auth_set_and_refusals_are_memcacheds(secured, request_bytes, replies):
    assert exchange(secured.connect(), request_bytes, len(replies)) == replies


def test_memcached_with_an_auth_file_answers_the_same(tmp_path):
    """The refusal lines above, checked against real memcached -Y."""
    binary = shutil.which("memcached")
    if binary is None:
        pytest.skip("memcached is not installed")
    (tmp_path / "auth").write_text("alice:secret\n")
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    proc = subprocess.Popen(
        [binary, "-U", "0", "-l", "127.0.0.1", "-p", str(port), "-Y", str(tmp_path / "auth")]
        + (["-u", "root"] if os.geteuid() == 0 else []),  # memcached refuses root without -u
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        sock = wait_until(lambda: _connect(port), "memcached listening")
        sock.close()
        for request, replies in EXCHANGES:
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            assert exchange(sock, request, len(replies)) == replies, request
    finally:
        proc.terminate()
        proc.wait(10)


def _connect(port: int) -> socket.socket | None:
    try:
        return socket.create_connection(("127.0.0.1", port), timeout=10)
    except OSError:
        return None


def test_the_auth_set_stores_nothing_and_the_connection_is_then_served(secured):
    c = login(secured, "alice", "secret")
    assert c.get("any") is None  # nothing was stored under the auth set's key
    assert c.set("jobs", "one") == b"STORED"
    assert c.get("jobs") == b"one"
    assert c.stats()["queue_creates"] == "2"  # any (by the get) and jobs: no queue "any" item
    c.close()


def test_requests_behind_the_auth_set_run_as_the_user(secured):
    c = Conn(secured.connect())
    c.send(b"set k 0 0 12\r\nalice secret\r\nset jobs 0 0 3\r\none\r\nget jobs\r\n")
    assert c.line() == b"STORED"
    assert c.line() == b"STORED"
    assert c.read_value() == b"one"
    c.close()


def test_a_refused_client_may_try_again_and_nothing_it_sent_was_run(secured):
    c = Conn(secured.connect())
    c.send(b"set jobs 0 0 5\r\nhello\r\n")  # a plain set before auth: it is the auth attempt
    assert c.line() == b"CLIENT_ERROR bad authentication token format"
    c.send(b"add jobs 0 0 5\r\nhello\r\nflush_all\r\n")
    assert [c.line(), c.line()] == [b"CLIENT_ERROR unauthenticated"] * 2
    c.send(b"set k 0 0 12\r\nalice secret\r\n")
    assert c.line() == b"STORED"
    assert c.get("jobs") is None
    c.close()


def test_pymemcache_authenticates_with_the_auth_set(secured):
    client = secured.client()
    assert client.set("auth", b"alice secret", noreply=False) is True
    assert client.set("jobs", b"from pymemcache") is True
    assert client.get("jobs") == b"from pymemcache"
    client.close()


def test_a_noreply_auth_set_is_not_answered(secured):
    client = secured.client()  # pymemcache's set is noreply by default
    client.set("auth", b"alice secret")
    assert client.set("jobs", b"quiet", noreply=False) is True
    assert client.get("jobs") == b"quiet"
    client.close()
    c = Conn(secured.connect())
    c.send(b"set k 0 0 11 noreply\r\nalice wrong\r\nget jobs\r\n")
    assert c.line() == b"CLIENT_ERROR unauthenticated"  # the refusal was not answered
    c.close()


def test_without_an_auth_file_nothing_changes(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    assert c.set("x", "alice secret") == b"STORED"
    assert c.get("x") == b"alice secret"  # an ordinary set
    c.close()


# --- failures: logged, counted, slowed ------------------------------------------------------


def test_failures_are_logged_counted_and_slowed_without_holding_up_others(secured):
    other = login(secured, "alice", "secret")
    c = Conn(secured.connect())
    took = []
    for _ in range(6):
        started = time.monotonic()
        c.send(b"set k 0 0 11\r\nalice wrong\r\n")
        assert c.line() == b"CLIENT_ERROR authentication failure"
        took.append(time.monotonic() - started)
    assert min(took[3:]) >= 0.2  # after 3 free failures each refusal waits (0.25 s, 0.5 s...)
    # While a refusal waits, other clients are served at once.
    c.send(b"set k 0 0 11\r\nalice wrong\r\n")
    started = time.monotonic()
    assert other.set("busy", "x") == b"STORED"
    assert time.monotonic() - started < 0.5
    assert c.line() == b"CLIENT_ERROR authentication failure"
    # A success is not delayed, and forgets the address's failures.
    c.send(b"set k 0 0 12\r\nalice secret\r\n")
    assert c.line() == b"STORED"
    stats = other.stats()
    assert stats["auth_failures"] == "7"
    assert stats["auth_successes"] == "2"
    failed = secured.events("auth_failed")
    assert len(failed) == 7
    assert failed[0]["peer"] == "127.0.0.1"
    assert failed[0]["user"] == "alice" and failed[0]["reason"] == "wrong password"
    c.close()
    other.close()


# --- roles ---------------------------------------------------------------------------------


def refused(c: Conn, request: bytes) -> None:
    c.send(request)
    assert c.line() == b"CLIENT_ERROR permission denied", request


def test_a_reader_fetches_but_cannot_write_or_administer(secured):
    login(secured, "alice", "secret").set("jobs", "item")
    c = login(secured, "reader", "r")
    refused(c, b"set jobs 0 0 5\r\nhello\r\n")  # the block is skipped: the stream is in step
    assert c.get("jobs") == b"item"
    for request in (
        b"delete jobs\r\n", b"flush jobs\r\n", b"flush_all\r\n", b"flush_expired jobs\r\n",
        b"status\r\n", b"status READONLY\r\n", b"reload\r\n", b"shutdown\r\n",
    ):  # fmt: skip
        refused(c, request)
    c.send(b"stats\r\n")
    assert c.until_end()[-1] == b"END"  # stats and version: anyone authenticated
    c.close()


def test_a_writer_sets_but_cannot_fetch(secured):
    c = login(secured, "writer", "w")
    assert c.set("jobs", "w1") == b"STORED"
    for request in (
        b"get jobs\r\n", b"get jobs/open\r\n", b"get jobs/peek\r\n", b"gets jobs\r\n",
        b"get jobs/close\r\n", b"confirm jobs\r\n", b"monitor jobs 0\r\n", b"get a jobs\r\n",
    ):  # fmt: skip
        refused(c, request)
    refused(c, b"delete jobs\r\n")
    c.close()


def test_an_admin_administers_and_a_pattern_limits_every_role(secured):
    ops = login(secured, "ops", "a")
    ops.send(b"flush jobs\r\n")
    assert ops.line() == b"END"
    ops.send(b"status\r\n")
    assert ops.line() == b"UP"
    refused(ops, b"set jobs 0 0 1\r\nx\r\n")

    c = login(secured, "orders", "o")
    assert c.set("orders_eu", "o1") == b"STORED"
    assert c.get("orders_eu+audit") is None
    assert c.get("orders_eu") == b"o1"
    refused(c, b"set invoices 0 0 1\r\nx\r\n")
    refused(c, b"get invoices\r\n")
    refused(c, b"get orders_eu invoices\r\n")  # every key of a get must be permitted
    c.send(b"delete orders_eu\r\n")
    assert c.line() == b"DELETED"
    refused(c, b"flush_all\r\n")  # server-wide: a role limited to some queues cannot
    refused(c, b"reload\r\n")
    c.close()
    ops.close()


# --- the auth file at start-up and reload ---------------------------------------------------


def test_a_malformed_auth_file_stops_start_up_naming_the_line(make_server, tmp_path):
    path = auth_file(tmp_path, [user("alice", "secret"), "bob:$scrypt$broken"])
    proc = make_server(f'auth_file = "{path}"\n', start=False)
    with pytest.raises(RuntimeError) as failed:
        proc.start()
    assert f"{path} line 2" in str(failed.value)
    missing = make_server(f'auth_file = "{tmp_path / "nope"}"\n', start=False)
    with pytest.raises(RuntimeError, match="does not exist"):
        missing.start()


def test_reload_reads_the_auth_file_again_and_keeps_it_on_error(make_server, tmp_path):
    path = auth_file(tmp_path, [user("alice", "secret")])
    proc = make_server(f'auth_file = "{path}"\n')
    admin = login(proc, "alice", "secret")
    with open(path, "a") as f:
        f.write("broken line\n")
    admin.send(b"reload\r\n")
    assert admin.line().startswith(
        b"SERVER_ERROR config not reloaded: " + path.encode() + b" line 2"
    )
    login(proc, "alice", "secret").close()  # the old users stay

    with open(path, "w") as f:
        f.write(user("bob", "new") + "\n")
    admin.send(b"reload\r\n")
    assert admin.line() == b"Reloaded config."
    login(proc, "bob", "new").close()
    c = Conn(proc.connect())
    c.send(b"set k 0 0 12\r\nalice secret\r\n")
    assert c.line() == b"CLIENT_ERROR authentication failure"  # alice is gone
    c.close()
    assert admin.set("still", "served") == b"STORED"  # connections in progress go on
    admin.close()


def test_a_real_hash_from_kestreld_passwd_authenticates(make_server, tmp_path):
    import sys

    path = tmp_path / "users"
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "passwd", "carol", "--file", str(path)],
        input="pa55word\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    proc = make_server(f'auth_file = "{path}"\n')
    login(proc, "carol", "pa55word").close()
    # A second connection's check is remembered: no scrypt on the way in.
    started = time.monotonic()
    login(proc, "carol", "pa55word").close()
    assert time.monotonic() - started < 5


# --- kestreld's own client ------------------------------------------------------------------


def test_the_client_authenticates_every_connection_even_after_a_reconnect(secured):
    client = Client([f"127.0.0.1:{secured.port}"], username="alice", password="secret")
    assert client.put("jobs", b"one")
    assert client.get("jobs") == b"one"
    secured.restart()  # every connection is gone: the client reconnects, and authenticates
    assert wait_until(lambda: _put_when_up(client), "the client put after the restart")
    assert client.get("jobs") == b"two"
    c = login(secured, "ops", "a")
    assert c.stats()["auth_successes"] == "2"  # the client's new connection, and this one
    client.close()
    c.close()


def _put_when_up(client: Client) -> bool:
    try:
        return client.put("jobs", b"two")
    except NoServerAvailable:
        return False  # marked down by the restart for a moment


def test_the_client_over_tls_with_a_password(make_server, tmp_path):
    from certs import CertificateAuthority

    ca = CertificateAuthority(tmp_path / "pki")
    ca.issue("server")
    path = auth_file(tmp_path, [user("alice", "secret")])
    proc = make_server(
        f'auth_file = "{path}"\ntls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'tls_key_file = "{ca.folder / "server.key"}"\n'
    )
    client = Client(
        [f"127.0.0.1:{proc.port}"], username="alice", password="secret", tls=ca.client_context()
    )
    assert client.put("secure", b"both")
    assert client.get("secure") == b"both"
    client.close()

    async def main() -> bytes | None:
        aclient = AsyncClient(
            [f"127.0.0.1:{proc.port}"], username="alice", password="secret",
            tls=ca.client_context(),
        )  # fmt: skip
        try:
            await aclient.put("secure", b"async")
            return await aclient.get("secure")
        finally:
            await aclient.close()

    assert asyncio.run(main()) == b"async"


def test_the_client_raises_authentication_failed_for_a_wrong_password(secured):
    client = Client([f"127.0.0.1:{secured.port}"], username="alice", password="nope")
    with pytest.raises(AuthenticationFailed, match="authentication failure"):
        client.put("jobs", b"x")
    client.close()


def test_the_async_client_authenticates_too(secured):
    async def main() -> bytes | None:
        client = AsyncClient([f"127.0.0.1:{secured.port}"], username="writer", password="w")
        try:
            assert await client.put("jobs", b"async")
            reader = AsyncClient([f"127.0.0.1:{secured.port}"], username="reader", password="r")
            try:
                return await reader.get("jobs")
            finally:
                await reader.close()
        finally:
            await client.close()

    assert asyncio.run(main()) == b"async"


def test_ping_counts_an_unauthenticated_answer_as_up(secured):
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "ping", "--port", str(secured.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "authentication required" in result.stdout
