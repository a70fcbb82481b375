"""Where an operator tool talks to, and how it logs in there.

A tool's own ``--host``/``--port``/``--config`` pick the default server; a
queue argument may name another one as ``HOST:PORT/queue`` (``[::1]:22133/q``
for IPv6).  Queue names cannot hold ``/``, so the last ``/`` separates them.

Every tool that connects takes one group of login options, the client
library's TLS settings and credentials (:class:`Login`):

- ``--tls``: connect with TLS, trusting the system's CAs;
  ``--tls-ca-file FILE``: trusting this CA instead (implies ``--tls``);
- ``--tls-cert-file FILE`` and ``--tls-key-file FILE``: the client
  certificate, for a server with ``tls_verify_client`` (implies ``--tls``);
- ``--tls-server-name NAME``: the name the server's certificate must carry
  (default: the host connected to);
- ``--user NAME`` (or ``KESTRELD_USER``) with the password from
  ``--password-file FILE`` (its first line) or ``KESTRELD_PASSWORD``, never
  from the command line, where ``ps`` would show it.

:func:`explain` turns a failure into a message that says which failed: TLS,
authentication or permission.
"""

from __future__ import annotations

import argparse
import os
import ssl
from dataclasses import dataclass

from kestreld.client.cluster import parse_server
from kestreld.client.connection import Connection
from kestreld.client.errors import (
    AuthenticationFailed,
    ClientError,
    ConnectionFailed,
    KestrelError,
    ServerError,
    TlsFailed,
)
from kestreld.client.tls import TlsFilesError, client_context
from kestreld.client.wire import check_queue_name

#: Environment variables of the login options (a password is never a flag).
USER_ENV = "KESTRELD_USER"
PASSWORD_ENV = "KESTRELD_PASSWORD"

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


@dataclass(slots=True, frozen=True)
class Login:
    """How a tool connects: TLS and credentials (the defaults: plaintext, anonymous)."""

    tls: ssl.SSLContext | None = None
    server_name: str | None = None
    username: str | None = None
    password: str | None = None

    def connect(self, server: Server, timeout: float) -> Connection:
        """A connection to ``server`` that does TLS and logs in as this says (on first use)."""
        return Connection(
            server.host,
            server.port,
            connect_timeout=timeout,
            timeout=timeout,
            username=self.username,
            password=self.password,
            tls=self.tls,
            server_name=self.server_name,
        )


def add_server_options(p: argparse.ArgumentParser) -> None:
    """``--host``/``--listen``, ``--port``, ``--config`` and the login options."""
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
    add_login_options(p)


def add_login_options(p: argparse.ArgumentParser) -> None:
    """The TLS and credential options every tool that connects takes (see the module doc)."""
    group = p.add_argument_group(
        "TLS and login",
        f"for a server with TLS or an auth_file; the password comes from --password-file "
        f"or ${PASSWORD_ENV}, never from the command line",
    )
    group.add_argument(
        "--tls", action="store_true", help="connect with TLS, trusting the system's CAs"
    )
    group.add_argument(
        "--tls-ca-file", metavar="FILE", help="trust this CA for the server (implies --tls)"
    )
    group.add_argument(
        "--tls-cert-file",
        metavar="FILE",
        help="client certificate, for a server with tls_verify_client (implies --tls)",
    )
    group.add_argument(
        "--tls-key-file", metavar="FILE", help="the client certificate's key (implies --tls)"
    )
    group.add_argument(
        "--tls-server-name",
        metavar="NAME",
        help="name the server's certificate must carry (default: the host connected to)",
    )
    group.add_argument(
        "--user", metavar="NAME", help=f"log in as NAME (auth_file; default ${USER_ENV})"
    )
    group.add_argument(
        "--password-file",
        metavar="FILE",
        help=f"the user's password: the first line of FILE (default ${PASSWORD_ENV})",
    )


def login_from(args: argparse.Namespace) -> Login:
    """The :class:`Login` the options ask for; raises EndpointError for unusable ones."""
    tls = None
    wants_tls = args.tls or any(
        value is not None
        for value in (args.tls_ca_file, args.tls_cert_file, args.tls_key_file, args.tls_server_name)
    )
    if wants_tls:
        if args.tls_key_file is not None and args.tls_cert_file is None:
            raise EndpointError("--tls-key-file needs --tls-cert-file")
        try:
            tls = client_context(args.tls_ca_file, args.tls_cert_file, args.tls_key_file)
        except TlsFilesError as e:
            raise EndpointError(f"TLS: {e}") from None
    username = args.user if args.user is not None else os.environ.get(USER_ENV) or None
    password = _password(args.password_file)
    if username is None and args.password_file is not None:
        raise EndpointError(f"--password-file needs --user (or ${USER_ENV})")
    if username is not None and password is None:
        raise EndpointError(
            f"--user {username}: give the password in --password-file or ${PASSWORD_ENV}"
        )
    if username is not None and any(c in username for c in " \r\n"):
        raise EndpointError(f"--user {username!r}: a user name has no spaces")
    if password is not None and any(c in password for c in " \r\n"):
        # The auth token is "<user> <password>": the server splits it at spaces.
        raise EndpointError("the password has a space, which kestreld's auth_file cannot hold")
    return Login(tls, args.tls_server_name, username, password)


def _password(path: str | None) -> str | None:
    if path is None:
        return os.environ.get(PASSWORD_ENV) or None
    try:
        with open(path, encoding="utf-8") as f:
            password = f.readline().rstrip("\r\n")
    except OSError as e:
        raise EndpointError(f"--password-file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise EndpointError(f"--password-file {path}: not UTF-8 text") from None
    if not password:
        raise EndpointError(f"--password-file {path}: the first line is empty")
    return password


def explain(error: KestrelError, login: Login, action: str, role: str | None = None) -> str:
    """A failure as an operator reads it: which of TLS, authentication or permission failed.

    ``action`` says what was being done (``take items from jobs``), ``role``
    the role it needs on a server with an auth_file.  Other failures keep
    their own message.  The message does not name the server: the caller does.
    """
    reason = str(error)
    if isinstance(error, ConnectionFailed) and error.server:
        reason = reason.removeprefix(f"{error.server}: ")
    if isinstance(error, TlsFailed):
        hint = "check --tls-ca-file and --tls-server-name"
        if "CERTIFICATE_REQUIRED" in reason:
            hint = "the server wants a client certificate: --tls-cert-file and --tls-key-file"
        elif "WRONG_VERSION_NUMBER" in reason:
            hint = "the port does not seem to speak TLS: connect without the --tls options"
        return f"{reason} ({hint})"
    if isinstance(error, ServerError) and "requires TLS" in reason:
        return "TLS required: this port speaks TLS only; connect with --tls (and --tls-ca-file)"
    if isinstance(error, AuthenticationFailed):
        return (
            f"authentication failed for user {login.username!r}: {reason} "
            f"(check --user and the password in --password-file or ${PASSWORD_ENV})"
        )
    if isinstance(error, ClientError) and reason == "unauthenticated":
        return (
            "authentication required: the server has an auth_file; log in with --user and "
            f"--password-file (or ${PASSWORD_ENV})"
        )
    if isinstance(error, ClientError) and reason == "permission denied":
        needs = f" (needs the {role} role)" if role else ""
        who = f"user {login.username!r}" if login.username else "this user"
        return f"permission denied: {who} may not {action}{needs}"
    return reason


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
