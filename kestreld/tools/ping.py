"""``kestreld ping``: ask a running server for its version and status (the container health check).

    kestreld ping [--host H | --listen ADDR] [--port N] [--timeout S] [--config FILE]
                  [--tls] [--tls-ca-file F] [--tls-cert-file F --tls-key-file F]
                  [--tls-server-name NAME] [--user NAME --password-file F]

Sends ``version`` and prints the version from the ``VERSION x.y.z`` reply,
then, where the server tells it, ``status: UP`` (``status`` needs the admin
role on a server with an auth file; a server that will not say prints the
version alone).  With the login options (:mod:`kestreld.tools.endpoint`) it
speaks TLS and authenticates first, so it checks a secured server fully.

Without them, a server with TLS or an auth file answers a plaintext,
anonymous ping with ``SERVER_ERROR this port requires TLS`` or
``CLIENT_ERROR unauthenticated``: that is an answer too (it is up), printed
as such.  With the login options, a failed TLS handshake or login is an
error: the check then covers the certificates and the credentials.

Exit status 0 when the server answered, 1 when it did not (refused, timed
out, closed, replied something else, or TLS or the login failed), 2 for
bad arguments.  With ``--config`` the address and port come from that config
file (a wildcard listen address means this machine), so the health check
follows a mounted config; ``--host`` (or the server's own flag ``--listen``)
and ``--port`` still win, so a server started with ``--config F --port N``
is checked with ``kestreld ping --config F --port N``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from kestreld.client.errors import (
    AuthenticationFailed,
    ClientError,
    CommandError,
    ConnectionFailed,
    KestrelError,
    ProtocolViolation,
    ServerError,
    TlsFailed,
)
from kestreld.tools.endpoint import (
    EndpointError,
    Login,
    Server,
    add_server_options,
    default_server,
    explain,
    login_from,
)

#: Answers of a server that is up but will not serve this plaintext, anonymous ping.
_SECURED = {
    "this port requires TLS": "(up; the port requires TLS)",
    "unauthenticated": "(up; authentication required)",
}


class PingError(Exception):
    """The server did not answer ``version`` as expected; the message says how."""


@dataclass(slots=True)
class Answer:
    """What the server said: its version (or why it would not say), and its status if known."""

    version: str
    status: str | None = None

    def lines(self) -> list[str]:
        return [self.version] + ([f"status: {self.status}"] if self.status else [])


def ping(server: Server, timeout: float, login: Login | None = None) -> Answer:
    """Ask ``server`` for its version and status; raises PingError."""
    login = login or Login()
    conn = login.connect(server, timeout)
    try:
        try:
            version = conn.version()
        except (ServerError, ClientError) as e:
            reason = str(e)
            secured = (reason == "this port requires TLS" and login.tls is None) or (
                reason == "unauthenticated" and login.username is None
            )
            if secured and not isinstance(e, AuthenticationFailed):
                return Answer(_SECURED[reason])  # it answered: up, though not to us
            raise PingError(f"{server.address}: {explain(e, login, 'ask the version')}") from None
        except TlsFailed as e:
            raise PingError(f"{server.address}: {explain(e, login, 'connect')}") from None
        except ProtocolViolation as e:
            raise PingError(
                f"{server.address} replied {_reason(server, e)}, not a version"
            ) from None
        except CommandError as e:
            raise PingError(f"{server.address} replied {str(e)[:80]!r}, not a version") from None
        except ConnectionFailed as e:
            raise PingError(_unreachable(server, e, timeout)) from None
        if not version:
            raise PingError(f"{server.address} replied VERSION without a version")
        try:
            status = conn.command("status").decode("utf-8", "replace")
        except KestrelError:
            status = None  # not allowed (admin role), or a server without status: version only
        return Answer(version, status)
    finally:
        conn.close()


def _reason(server: Server, error: KestrelError) -> str:
    return str(error).removeprefix(f"{server.address}: ")


def _unreachable(server: Server, error: ConnectionFailed, timeout: float) -> str:
    reason = _reason(server, error)
    if "timed out" in reason:
        return f"no reply from {server.address} within {timeout:g}s"
    if "closed" in reason:
        return f"{server.address} closed the connection without a reply"
    return f"cannot reach {server.address}: {reason}"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld ping",
        description="Ask a kestreld server for its version and status: exit 0 when it "
        "answers, 1 when not.",
    )
    add_server_options(p)
    p.add_argument(
        "--timeout", type=float, default=5.0, help="seconds to wait for the answer (default 5)"
    )
    # The server's other flags are accepted and ignored, so that a health check
    # can repeat the server's command line: kestreld ping <the server's flags>.
    for flag in ("--queue-path", "--log-format", "--log-level"):
        p.add_argument(flag, help=argparse.SUPPRESS)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        server = default_server(args)
    except EndpointError as e:  # a config the health check cannot read: not healthy
        print(f"kestreld ping: {e}", file=sys.stderr)
        return 1
    try:
        login = login_from(args)
    except EndpointError as e:
        print(f"kestreld ping: {e}", file=sys.stderr)
        return 2
    try:
        answer = ping(server, args.timeout, login)
    except PingError as e:
        print(f"kestreld ping: {e}", file=sys.stderr)
        return 1
    print("\n".join(answer.lines()))
    return 0
