"""``kestreld ping``: ask a running server for its version (the container health check).

    kestreld ping [--host H | --listen ADDR] [--port N] [--timeout S] [--config FILE]

Sends ``version`` and prints the version from the ``VERSION x.y.z`` reply.
A server with TLS or an auth file answers a plaintext, anonymous ping with
``SERVER_ERROR this port requires TLS`` or ``CLIENT_ERROR unauthenticated``:
that is an answer too (it is up), printed as such.
Exit status 0 when the server answered, 1 when it did not (refused, timed
out, closed, or replied something else), 2 for bad arguments.  With
``--config`` the address and port come from that config file (a wildcard
listen address means this machine), so the health check follows a mounted
config; ``--host`` (or the server's own flag ``--listen``) and ``--port``
still win, so a server started with ``--config F --port N`` is checked with
``kestreld ping --config F --port N``.
"""

from __future__ import annotations

import argparse
import socket
import sys
import time

DEFAULT_PORT = 22133

#: Listen addresses that mean "every interface": ping the local one instead.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


#: Answers of a server that is up but will not serve this plaintext, anonymous ping.
_SECURED = {
    "SERVER_ERROR this port requires TLS": "(up; the port requires TLS)",
    "CLIENT_ERROR unauthenticated": "(up; authentication required)",
}


class PingError(Exception):
    """The server did not answer ``version`` as expected; the message says how."""


def ping(host: str, port: int, timeout: float) -> str:
    """The server's version; raises PingError.  ``timeout`` bounds the whole exchange."""
    deadline = time.monotonic() + timeout
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"version\r\n")
            reply = b""
            while b"\r\n" not in reply:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise PingError(f"no reply from {host}:{port} within {timeout:g}s")
                sock.settimeout(remaining)
                chunk = sock.recv(4096)
                if not chunk:
                    raise PingError(f"{host}:{port} closed the connection without a reply")
                reply += chunk
                if len(reply) > 4096:
                    break
    except TimeoutError:
        raise PingError(f"no reply from {host}:{port} within {timeout:g}s") from None
    except OSError as e:
        raise PingError(f"cannot reach {host}:{port}: {e.strerror or e}") from None
    line = reply.split(b"\r\n", 1)[0].decode("ascii", "replace")
    if line in _SECURED:
        return _SECURED[line]  # it answered: up, though it will not say its version to us
    word, _, version = line.partition(" ")
    if word != "VERSION" or not version:
        raise PingError(f"{host}:{port} replied {line[:80]!r}, not a version")
    return version


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld ping",
        description="Ask a kestreld server for its version: exit 0 when it answers, 1 when not.",
    )
    p.add_argument(
        "--host",
        "--listen",
        dest="host",
        help="server address (default 127.0.0.1, or the config's); --listen as the server spells it",
    )
    p.add_argument(
        "--port", type=int, help=f"server port (default {DEFAULT_PORT}, or the config's)"
    )
    p.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    p.add_argument("--config", help="take the address and port from this kestreld config file")
    # The server's other flags are accepted and ignored, so that a health check
    # can repeat the server's command line: kestreld ping <the server's flags>.
    for flag in ("--queue-path", "--log-format", "--log-level"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    host, port = "127.0.0.1", DEFAULT_PORT
    if args.config is not None:
        from kestreld.config import ConfigError, load_config

        try:
            config = load_config(args.config)
        except ConfigError as e:
            print(f"kestreld ping: {e}", file=sys.stderr)
            return 1
        host = _WILDCARDS.get(config.listen_address, config.listen_address)
        port = config.port
    if args.host is not None:
        host = _WILDCARDS.get(args.host, args.host)
    port = args.port if args.port is not None else port
    try:
        version = ping(host, port, args.timeout)
    except PingError as e:
        print(f"kestreld ping: {e}", file=sys.stderr)
        return 1
    print(version)
    return 0
