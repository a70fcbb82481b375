"""Real memcache clients on their defaults: every call answered, errors raised, never a desync.

pymemcache sends ``noreply`` on ``delete``/``add``/``set`` by default where its
API allows it; a reply to a noreply request would be read as the answer to
the next one.  python-memcached and aiomcache use multi-key gets and storage
commands a queue server does not support.
"""

from __future__ import annotations

import asyncio

import aiomcache
import memcache
import pytest
from pymemcache.client.base import Client
from pymemcache.exceptions import MemcacheClientError


@pytest.fixture
def client(server):
    c = Client(("127.0.0.1", server.port), timeout=10, connect_timeout=10)
    yield c
    c.close()


def test_pymemcache_defaults_delete_then_get_stay_in_step(client, qname):
    assert client.set(qname, b"one") is True
    assert client.delete(qname) is True  # noreply by default: nothing may come back
    assert client.get(qname) is None
    assert client.set(qname, b"two") is True
    assert client.get(qname) == b"two"


def test_pymemcache_add_raises_and_the_payload_is_not_a_command(client, qname):
    client.set(qname, b"keep")
    with pytest.raises(MemcacheClientError, match="add is not supported"):
        client.add("k", b"flush_all", noreply=False)
    # With its default noreply the error is not answered, and the stream stays in step.
    assert client.add("k", b"shutdown") is True
    assert client.replace("k", b"flush_all") is True
    assert client.append("k", b"flush_all") is True
    assert client.prepend("k", b"flush_all") is True
    assert client.get(qname) == b"keep"


def test_pymemcache_cas_and_incr_raise_without_desync(client, qname):
    with pytest.raises(MemcacheClientError):
        client.cas("k", b"flush_all", b"1", noreply=False)
    with pytest.raises(MemcacheClientError):
        client.incr("k", 1)
    with pytest.raises(MemcacheClientError):
        client.touch("k", 10, noreply=False)
    client.set(qname, b"x")
    assert client.get(qname) == b"x"


def test_pymemcache_get_many_takes_one_item_from_each_queue(client, qname):
    a, b, c = qname + "a", qname + "b", qname + "c"
    client.set(a, b"1")
    client.set(a, b"2")
    client.set(b, b"3")
    assert client.get_many([a, b, c]) == {a: b"1", b: b"3"}
    assert client.get_many([a, b, c]) == {a: b"2"}


def test_python_memcached_defaults(server, qname):
    mc = memcache.Client([f"127.0.0.1:{server.port}"])
    try:
        assert mc.set(qname, "v")
        assert not mc.add(qname, "flush_all")
        assert not mc.replace(qname, "shutdown")
        assert mc.get_multi([qname, qname + "x"]) == {qname: b"v"}
        assert mc.delete(qname)
        assert mc.get(qname) is None
    finally:
        mc.disconnect_all()


def test_aiomcache_defaults(server, qname):
    async def run() -> list:
        mc = aiomcache.Client("127.0.0.1", server.port)
        try:
            await mc.set(qname.encode(), b"v1")
            await mc.set((qname + "b").encode(), b"v2")
            with pytest.raises(aiomcache.exceptions.ClientException):
                await mc.add(b"k", b"flush_all")
            many = await mc.multi_get(qname.encode(), (qname + "b").encode(), b"nothing_here")
            deleted = await mc.delete(qname.encode())
            return [many, deleted, await mc.get(qname.encode())]
        finally:
            await mc.close()

    many, deleted, after = asyncio.run(run())
    assert many == (b"v1", b"v2", None)
    assert deleted is True
    assert after is None
