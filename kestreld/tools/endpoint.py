"""Where an operator tool talks to: a server address, and a queue on it.

A tool's own ``--host``/``--port``/``--config`` pick the default server; a
queue argument may name another one as ``HOST:PORT/queue`` (``[::1]:22133/q``
for IPv6).  Queue names cannot hold ``/``, so the last ``/`` separates them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from kestreld.client.cluster import parse_server
from kestreld.client.wire import check_queue_name

DEFAULT_PORT = 22133

#: Listen addresses that mean "every interface": talk to the local one instead.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


class EndpointError(ValueError):
    """A server address or queue argument that cannot be used; the message says why."""


@dataclass(slots=True, frozen=True)
class Server:
    host: str
    port: int

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(slots=True, frozen=True)
class QueueAt:
    """A queue (or fanout reader ``q+r``) on one server."""

    server: Server
    queue: str

    def __str__(self) -> str:
        return f"{self.server.address}/{self.queue}"


def add_server_options(p: argparse.ArgumentParser) -> None:
    """``--host``/``--listen``, ``--port`` and ``--config``, as ``kestreld ping`` has them."""
    p.add_argument(
        "--host",
        "--listen",
        dest="host",
        help="server address (default 127.0.0.1, or the config's)",
    )
    p.add_argument(
        "--port", type=int, help=f"server port (default {DEFAULT_PORT}, or the config's)"
    )
    p.add_argument("--config", help="take the address and port from this kestreld config file")


def default_server(args: argparse.Namespace) -> Server:
    """The server the options name; raises EndpointError for a bad config file."""
    host, port = "127.0.0.1", DEFAULT_PORT
    if args.config is not None:
        from kestreld.config import ConfigError, load_config

        try:
            config = load_config(args.config)
        except ConfigError as e:
            raise EndpointError(str(e)) from None
        host = _WILDCARDS.get(config.listen_address, config.listen_address)
        port = config.port
    if args.host is not None:
        host = _WILDCARDS.get(args.host, args.host)
    if args.port is not None:
        port = args.port
    return Server(host, port)


def parse_queue_at(text: str, default: Server) -> QueueAt:
    """``queue`` (on ``default``) or ``HOST:PORT/queue``; raises EndpointError."""
    where, slash, queue = text.rpartition("/")
    server = default
    if slash:
        try:
            host, port = parse_server(where)
        except ValueError as e:
            raise EndpointError(str(e)) from None
        server = Server(host, port)
    try:
        check_queue_name(queue)
    except ValueError as e:
        raise EndpointError(str(e)) from None
    return QueueAt(server, queue)
