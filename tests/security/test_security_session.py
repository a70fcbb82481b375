"""The session's authentication API, as any front end (memcache, text, thrift) uses it:
``Session.authenticate``, ``Session.refuse_authentication``, ``Session.permit`` and the
listener's ``authentication_ended``.  An in-process server with an auth file."""

from __future__ import annotations

import asyncio
import time

import pytest

from kestreld.security import Role, hash_password
from kestreld.server import Server, build_server_config
from kestreld.session.session import Session


class Listener:
    """A front end that records what the session tells it."""

    def __init__(self) -> None:
        self.ended: list[tuple[object, object]] = []

    def authentication_ended(self, user, tag) -> None:
        self.ended.append((user, tag))

    def replies_ready(self) -> None:
        pass

    def wait_ended(self, f) -> None:
        pass

    def monitor_item(self, f) -> None:
        pass


@pytest.fixture
async def server(tmp_path):
    users = tmp_path / "users"
    users.write_text(
        f"alice:{hash_password('secret', log2_n=4)}\n"
        f"feeder:{hash_password('f', log2_n=4)}:write:orders*\n"
    )
    config = build_server_config(
        None, {"queue_path": str(tmp_path / "q"), "port": 0, "auth_file": str(users)}
    )
    started = Server(config)
    await started.start()
    yield started
    await started.stop()


async def _ended(listener: Listener) -> tuple[object, object]:
    deadline = time.monotonic() + 30
    while not listener.ended:
        assert time.monotonic() < deadline, "authentication never ended"
        await asyncio.sleep(0.01)
    return listener.ended.pop()


async def test_a_session_permits_nothing_until_it_authenticates(server):
    listener = Listener()
    session = Session(server, listener)
    assert not session.permit(Role.READ, "orders")
    session.authenticate("feeder", b"f", "127.0.0.1", "my tag")
    assert session.waiting is not None  # the front end judges no request meanwhile
    user, tag = await _ended(listener)
    assert tag == "my tag" and user is session.principal and user.name == "feeder"
    assert session.waiting is None
    assert session.permit(Role.WRITE, "orders_eu")
    assert not session.permit(Role.WRITE, "invoices")
    assert not session.permit(Role.READ, "orders_eu")
    assert server.stats.auth_successes == 1


async def test_a_refused_session_stays_unauthenticated_and_is_counted(server):
    listener = Listener()
    session = Session(server, listener)
    session.authenticate("alice", b"wrong", "10.1.2.3", None)
    assert await _ended(listener) == (None, None)
    session.refuse_authentication("bad token format", "10.1.2.3", "again")
    assert await _ended(listener) == (None, "again")
    assert session.principal is None and not session.permit(Role.READ, "q")
    assert server.stats.auth_failures == 2
    assert server.authenticator.limiter.failures("10.1.2.3") == 2


async def test_a_half_closed_client_still_gets_its_authentication_answered(server):
    listener = Listener()
    session = Session(server, listener)
    session.authenticate("alice", b"secret", "127.0.0.1", None)
    session.stop_waiting()  # the client's end of input: a get's wait ends, this one does not
    user, _ = await _ended(listener)
    assert user is not None and session.permit(Role.ADMIN, None)


async def test_a_closed_session_is_not_told(server):
    listener = Listener()
    session = Session(server, listener)
    session.authenticate("alice", b"secret", "127.0.0.1", None)
    session.close(True)
    await asyncio.sleep(0.2)
    assert listener.ended == [] and session.waiting is None


async def test_without_an_auth_file_everything_is_permitted(tmp_path):
    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    plain = Server(config)
    await plain.start()
    try:
        session = Session(plain, Listener())
        assert session.permit(Role.ADMIN, None) and session.permit(Role.WRITE, "any")
    finally:
        await plain.stop()


async def test_a_client_proven_another_way_is_admitted_at_once(server):
    session = Session(server, Listener())
    session.admit(server.authenticator.auth.user("feeder"))  # e.g. its TLS certificate's name
    assert session.permit(Role.WRITE, "orders") and not session.permit(Role.READ, "orders")
