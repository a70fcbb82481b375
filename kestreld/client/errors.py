"""What the client raises.

Every exception is a :class:`KestrelError`.  Replies the server gave keep
the connection usable (:class:`ClientError`, :class:`ServerError`,
:class:`CommandError`); :class:`ConnectionFailed` means a server could not be
reached or the connection broke, and is what makes the client fail over to
another server and mark the broken one down.
"""

from __future__ import annotations


class KestrelError(Exception):
    """Base class of everything the client raises on purpose."""


class ClientError(KestrelError):
    """``CLIENT_ERROR <reason>``: the server refused a malformed request.  Not retried."""


class AuthenticationFailed(ClientError):
    """The server refused the client's ``username``/``password`` (auth_file).  Not retried:
    the connection is closed, and the next request authenticates afresh."""


class ServerError(KestrelError):
    """``SERVER_ERROR <reason>``: e.g. the server is read-only or quiescent, or its journal failed."""


class CommandError(KestrelError):
    """A bare ``ERROR``: e.g. a plain get while this connection holds an open read."""


class ConnectionFailed(KestrelError, ConnectionError):
    """A server could not be reached, or the connection broke mid-request.

    ``server`` is the ``host:port`` it happened with (empty when unknown).
    """

    def __init__(self, message: str, server: str = "") -> None:
        super().__init__(f"{server}: {message}" if server else message)
        self.server = server


class TlsFailed(ConnectionFailed):
    """The TLS handshake or the TLS session failed: an untrusted or misnamed server
    certificate, a client certificate the server refused, or no TLS on the port."""


class PipelineBroken(ConnectionFailed):
    """The connection broke during a pipeline of ``set`` requests.

    ``stored`` holds the replies that did arrive, in request order (True for
    ``STORED``); the requests after them may or may not have been stored.
    """

    def __init__(self, message: str, server: str, stored: list[bool]) -> None:
        super().__init__(message, server)
        self.stored = stored


class ProtocolViolation(ConnectionFailed):
    """A reply no request could have produced: the connection is out of step and is dropped."""

    def __init__(self, line: bytes, server: str = "") -> None:
        super().__init__(f"unexpected reply {line[:80]!r}", server)


class NoServerAvailable(ConnectionFailed):
    """No server of the cluster could serve the request (all down or unreachable)."""
