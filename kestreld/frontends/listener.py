"""The listening socket of a front end's port."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

#: The accept queue's length (Kestrel's ``connectionBacklog``, fixed here).
BACKLOG = 4096


async def listen(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], asyncio.BaseProtocol],
    address: str,
    port: int,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """Serve ``factory``'s connections on ``sock`` (a worker's, bound by the supervisor), or
    else on ``address``:``port`` with SO_REUSEADDR.  Raises OSError."""
    if sock is None:
        family = numeric_family(address)
        if family is None:  # a name: the loop resolves it and listens on each of its addresses
            return await loop.create_server(
                factory, address, port, reuse_address=True, backlog=BACKLOG
            )
        # Bound here, a numeric address skips the loop's resolver, which encodes the host as
        # IDNA (encodings.idna, stringprep, unicodedata: 0.3 MiB of an idle server).  As the
        # loop binds: SO_REUSEADDR, and IPV6_V6ONLY for an IPv6 address.
        sock = socket.create_server((address, port), family=family)
        sock.setblocking(False)
    return await loop.create_server(factory, sock=sock, backlog=BACKLOG)  # type: ignore[arg-type]


def numeric_family(address: str) -> socket.AddressFamily | None:
    """AF_INET or AF_INET6 when ``address`` is an IP address in numbers, else None (a name)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, address)
        except OSError:
            continue
        return family
    return None
