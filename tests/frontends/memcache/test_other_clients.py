"""Generic memcache clients other than pymemcache work as Kestrel clients."""

from __future__ import annotations

import asyncio

import aiomcache
import memcache


def test_python_memcached_enqueues_dequeues_and_reads_stats(server, qname):
    client = memcache.Client([f"127.0.0.1:{server.port}"])
    assert client.set(qname, "hello")
    assert client.set(qname, b"\r\nbinary\x00")
    assert client.get(qname) == b"hello"  # flags are always 0: bytes come back
    assert client.get(f"{qname}/open") == b"\r\nbinary\x00"
    assert client.get(f"{qname}/close") is None
    stats = dict(client.get_stats()[0][1])
    assert stats[f"queue_{qname}_items"] == "0"
    client.disconnect_all()


def test_aiomcache_enqueues_and_dequeues_with_timeout(server, qname):
    async def run() -> list:
        client = aiomcache.Client("127.0.0.1", server.port)
        try:
            assert await client.set(qname.encode(), b"v1")
            got = [await client.get(qname.encode()), await client.get(f"{qname}/t=50".encode())]
            got.append(await client.version())
            return got
        finally:
            await client.close()

    first, empty, version = asyncio.run(run())
    assert first == b"v1"
    assert empty is None
    assert bytes(version).split(b".")[0] >= b"1"
