"""Resource bounds under load: a thousand connections holding open reads (and
blocking gets), dropped at random moments and in random ways.  Every item goes
back to its queue, and the server's file descriptors (``/proc/PID/fd``) and
memory (``/proc/PID/status`` VmRSS) return to about their baseline - and do
not creep up from one round to the next.
"""

from __future__ import annotations

import random
import resource
import socket
import struct
import time

import pytest
from kestreld_process import Conn, KestreldProcess

CONNECTIONS = 1000
ITEMS = 3000
ROUNDS = 3


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _fds(pid: int) -> int:
    import os

    return len(os.listdir(f"/proc/{pid}/fd"))


def _stats(srv: KestreldProcess) -> dict[str, str]:
    c = Conn(srv.connect())
    try:
        return c.stats()
    finally:
        c.close()


def _wait_for(fn, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def _settled(srv: KestreldProcess, base_conns: int) -> bool:
    st = _stats(srv)
    return (
        int(st["curr_connections"]) == base_conns + 1
        and st["queue_held_open_transactions"] == "0"
        and st["queue_held_items"] == str(ITEMS)
        and st["queue_idle_waiters"] == "0"
    )


def _drop(rng: random.Random, sock: socket.socket) -> str:
    """Close a client connection in one of several rude ways; returns which."""
    how = rng.choice(["close", "reset", "half_request", "shutdown_write"])
    try:
        if how == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif how == "half_request":
            sock.sendall(b"get held/op")
        elif how == "shutdown_write":
            sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    sock.close()
    return how


def _one_round(srv: KestreldProcess, rng: random.Random) -> dict[str, int]:
    socks: list[socket.socket] = []
    opened = 0
    waiting = 0
    for _ in range(CONNECTIONS):
        socks.append(srv.connect())
    for sock in socks:
        n = rng.randint(1, 3)
        wire = b"get held/open\r\n" * n
        if rng.random() < 0.2:
            wire += b"get idle/t=60000\r\n"  # a blocking get that never completes
            waiting += 1
        sock.sendall(wire)
        c = Conn(sock)
        for _ in range(n):
            assert c.read_value() is not None
        opened += n
    st = _stats(srv)
    assert int(st["queue_held_open_transactions"]) == opened
    assert int(st["queue_held_items"]) == ITEMS - opened
    _wait_for(lambda: int(_stats(srv)["queue_idle_waiters"]) == waiting)
    ways: dict[str, int] = {}
    rng.shuffle(socks)
    for i, sock in enumerate(socks):
        how = _drop(rng, sock)
        ways[how] = ways.get(how, 0) + 1
        if i % 50 == 0:
            time.sleep(rng.random() * 0.05)  # drops spread over time, not one burst
    return ways


@pytest.fixture
def loaded_server(make_server):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4 * CONNECTIONS:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 8 * CONNECTIONS), hard))
    srv = make_server("max_open_reads = 8\n")
    c = Conn(srv.connect())
    c.send(b"".join(b"set held 0 0 8\r\n%08d\r\n" % i for i in range(ITEMS)))
    for _ in range(ITEMS):
        assert c.line() == b"STORED"
    assert c.get("idle") is None
    c.close()
    return srv


def test_thousand_dropped_connections_give_back_every_item_and_their_resources(loaded_server):
    srv = loaded_server
    rng = random.Random(17)
    base_conns = int(_stats(srv)["curr_connections"]) - 1
    _wait_for(lambda: _settled(srv, base_conns))
    base_fds, base_rss = _fds(srv.pid), _rss_kib(srv.pid)
    figures = []
    for _ in range(ROUNDS):
        ways = _one_round(srv, rng)
        _wait_for(lambda: _settled(srv, base_conns))
        _wait_for(lambda: _fds(srv.pid) <= base_fds + 2, 10)
        figures.append((_fds(srv.pid), _rss_kib(srv.pid), ways))
    print(f"\nbaseline fds={base_fds} rss={base_rss} KiB; after each round: {figures}")
    assert all(fds <= base_fds + 2 for fds, _, _ in figures)
    first_rss, last_rss = figures[0][1], figures[-1][1]
    assert last_rss - base_rss < 48 * 1024, "memory returns to about the baseline"
    assert last_rss - first_rss < 8 * 1024, "no creep from round to round (a leak)"
    c = Conn(srv.connect())
    got = []
    while (v := c.get("held")) is not None:
        got.append(int(v))
    assert sorted(got) == list(range(ITEMS)), "every item back exactly once"
    assert srv.proc.poll() is None
