"""kestreld.client: Python clients for kestreld clusters, blocking and asyncio.

::

    from kestreld.client import Client

    client = Client(["10.0.0.1:22133", "10.0.0.2:22133"])
    client.put("jobs", b"resize 42")
    with client.reserve("jobs", timeout=1.0) as item:
        if item is not None:
            handle(item.data)  # confirmed on success, aborted on an exception

:class:`AsyncClient` has the same API with ``await``.  See docs/client.md.
"""

from kestreld.client.async_client import AsyncClient
from kestreld.client.cluster import ServerState
from kestreld.client.discovery import Discovery
from kestreld.client.errors import (
    AuthenticationFailed,
    ClientError,
    CommandError,
    ConnectionFailed,
    KestrelError,
    NoServerAvailable,
    ProtocolViolation,
    ServerError,
    TlsFailed,
)
from kestreld.client.item import Item, ItemState
from kestreld.client.reliable_reads import AsyncReliableReads, ReliableReads
from kestreld.client.stats import ServerStats
from kestreld.client.sync_client import Client
from kestreld.client.tls import client_context

__all__ = [
    "AsyncClient",
    "AsyncReliableReads",
    "AuthenticationFailed",
    "Client",
    "ClientError",
    "CommandError",
    "ConnectionFailed",
    "Discovery",
    "Item",
    "ItemState",
    "KestrelError",
    "NoServerAvailable",
    "ProtocolViolation",
    "ReliableReads",
    "ServerError",
    "ServerState",
    "ServerStats",
    "TlsFailed",
    "client_context",
]
