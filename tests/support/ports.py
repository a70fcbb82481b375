"""Free loopback ports for servers the tests start (and restart on the same port)."""

from __future__ import annotations

import random
import socket

#: Linux's default range of ports a connect() picks its local port from.
_EPHEMERAL = (32768, 60999)


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(part) for part in f.read().split())
        return low, high
    except (OSError, ValueError):
        return _EPHEMERAL


def free_port() -> int:
    """A loopback port nothing holds now, below the ephemeral range.

    A port the kernel hands out for bind(0) is one a client's connect() may take as its
    own local port once the server is gone: a test that kills a server and starts it again
    on the same port then fails with "Address already in use" (seen once in CI, after a
    kill -9).  Ports below the ephemeral range are never taken that way.
    """
    low, _ = _ephemeral_range()
    top = max(low - 1, 11024)
    for _ in range(200):
        port = random.randint(10000, top)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # a crowded range: let the kernel choose
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
