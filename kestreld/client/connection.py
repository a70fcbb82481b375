"""One blocking connection to one kestreld server, built on pymemcache.

pymemcache does ``get`` (option keys such as ``jobs/t=250/open`` are valid
memcache keys, and kestreld echoes the key as sent), ``set`` and
``version``.  What pymemcache lacks or gets wrong for Kestrel goes over the
same socket through a small raw exchange: pipelined ``set`` with one key
(``put_many``), ``confirm``, ``flush <q>``, ``delete`` of long reader names,
``status``, and ``stats`` with ``dump_stats`` (pymemcache's ``raw_command``
loses data when a reply spans several reads).

Every failure comes out as a :mod:`kestreld.client.errors` exception: error
replies leave the connection usable; anything else closes it and raises
:class:`ConnectionFailed`.
"""

from __future__ import annotations

import select
import socket
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pymemcache.client.base import Client as PymemcacheClient
from pymemcache.exceptions import (
    MemcacheClientError,
    MemcacheIllegalInputError,
    MemcacheServerError,
    MemcacheUnexpectedCloseError,
    MemcacheUnknownCommandError,
    MemcacheUnknownError,
)

from kestreld.client.errors import (
    ClientError,
    CommandError,
    ConnectionFailed,
    KestrelError,
    PipelineBroken,
    ProtocolViolation,
    ServerError,
    TlsFailed,
)
from kestreld.client.tls import tls_reason
from kestreld.client.wire import auth_request, auth_result, error_for, set_request, store_result

T = TypeVar("T")

_RECV_SIZE = 65536


class SocketReader:
    """Reads reply lines and data blocks from a blocking socket."""

    def __init__(self, sock: socket.socket, server: str) -> None:
        self.sock = sock
        self.server = server
        self.buf = bytearray()

    def _fill(self) -> None:
        chunk = self.sock.recv(_RECV_SIZE)
        if not chunk:
            raise ConnectionFailed("connection closed by the server", self.server)
        self.buf += chunk

    def line(self) -> bytes:
        """The next reply line, without its ``\\r\\n``."""
        start = 0
        while True:
            end = self.buf.find(b"\r\n", start)
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[: end + 2]
                return line
            start = max(0, len(self.buf) - 1)
            self._fill()

    def lines_until_end(self) -> list[bytes]:
        """Lines up to ``END`` (excluded); raises at once for an error reply."""
        lines: list[bytes] = []
        while True:
            line = self.line()
            if line == b"END":
                return lines
            if not lines:
                error = error_for(line)
                if error is not None:
                    raise error
            lines.append(line)


class _AuthenticatingClient(PymemcacheClient):
    """pymemcache's client, authenticating every socket it opens (reconnects too)."""

    def __init__(self, *args, auth: bytes | None, address: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.auth = auth
        self.address = address

    def _connect(self) -> None:
        super()._connect()
        if self.auth is None:
            return
        sock = self.sock
        assert sock is not None
        try:
            sock.sendall(self.auth)
            line = SocketReader(sock, self.address).line()
            auth_result(line, self.address)
        except BaseException:
            self.close()
            raise


class _ServerName:
    """A TLS context that checks the server's certificate for ``name``, whatever
    address is dialled (pymemcache passes the host it connects to)."""

    def __init__(self, context: ssl.SSLContext, name: str) -> None:
        self.context = context
        self.name = name

    def wrap_socket(self, sock: socket.socket, server_hostname: str | None = None) -> ssl.SSLSocket:
        return self.context.wrap_socket(sock, server_hostname=self.name)


class Connection:
    """One socket to one server; one request at a time (the pool sees to that).

    Not connected until the first request; reconnects by itself after a
    failure (a reconnected socket holds none of the old open reads).  With
    ``username`` and ``password`` every socket authenticates first
    (memcached's auth ``set``); ``tls`` is the client's TLS context
    (:func:`kestreld.client.tls.client_context`), and ``server_name`` the name
    the server's certificate must carry (default: ``host``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float,
        timeout: float,
        username: str | None = None,
        password: str | None = None,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
    ) -> None:
        self.address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.timeout = timeout
        auth = auth_request(username, password or "") if username is not None else None
        self.memcache = _AuthenticatingClient(
            (host, port),
            connect_timeout=connect_timeout,
            timeout=timeout,
            no_delay=True,
            default_noreply=False,
            allow_unicode_keys=False,
            tls_context=_ServerName(tls, server_name) if tls and server_name else tls,
            auth=auth,
            address=self.address,
        )

    # --- pymemcache -------------------------------------------------------------------

    def get(self, key: str, wait: float = 0.0) -> bytes | None:
        """``get <key>``: the item's data or None.  ``wait`` is the ``/t=`` in the key, in seconds."""
        if wait > 0:
            self._set_timeout(wait + self.timeout)
        try:
            with self._errors():
                return self.memcache.get(key)
        finally:
            if wait > 0:
                self._set_timeout(self.timeout)

    def put(self, queue: str, data: bytes, expire: int) -> bool:
        """``set``: True when stored, False for ``NOT_STORED`` (queue full, item too large)."""
        with self._errors():
            return bool(self.memcache.set(queue, data, expire=expire, noreply=False))

    def version(self) -> str:
        with self._errors():
            return self.memcache.version().decode("ascii", "replace")

    def usable(self) -> bool:
        """False (and closed) when the server closed this idle connection or sent unasked bytes."""
        sock = self.memcache.sock
        if sock is None:
            return True
        try:
            readable, _, _ = select.select([sock], [], [], 0)
            if not readable:
                return True
            sock.recv(1, socket.MSG_PEEK)  # EOF or stray bytes: either way, not reusable
        except OSError:
            pass
        self.close()
        return False

    def close(self) -> None:
        self.memcache.close()

    # --- raw exchanges ------------------------------------------------------------------

    def put_many(self, queue: str, items: list[bytes], expire: int) -> list[bool]:
        """Pipelined ``set`` of every item, one write, then every reply.

        True per ``STORED`` item; ``NOT_STORED`` and ``SERVER_ERROR`` are
        False (another server may take it).  A broken connection raises
        :class:`PipelineBroken` with the replies that did arrive.
        """
        request = b"".join(set_request(queue, data, expire) for data in items)
        results: list[bool] = []

        def read(reader: SocketReader) -> list[bool]:
            client_error: ClientError | None = None
            for _ in items:
                try:
                    line = reader.line()
                except ConnectionFailed as e:
                    raise PipelineBroken(str(e), self.address, results) from None
                try:
                    results.append(store_result(line))
                except ServerError:
                    results.append(False)
                except ClientError as e:
                    results.append(False)
                    client_error = e
            if client_error is not None:
                raise client_error
            return results

        try:
            return self._exchange(request, read)
        except PipelineBroken:
            raise
        except ConnectionFailed as e:
            raise PipelineBroken(str(e), self.address, results) from None

    def command(self, line: str) -> bytes:
        """A one-line request with a one-line reply (``flush q``, ``delete q``, ``status``)."""

        def read(reader: SocketReader) -> bytes:
            reply = reader.line()
            error = error_for(reply)
            if error is not None:
                raise error
            return reply

        return self._exchange(line.encode("ascii") + b"\r\n", read)

    def confirm(self, queue: str) -> bool:
        """``confirm <queue> 1``: True when an open read was confirmed, False when none was open."""
        try:
            return self.command(f"confirm {queue} 1") == b"END"
        except CommandError:
            return False

    def stats(self) -> tuple[list[bytes], list[bytes]]:
        """``stats`` and ``dump_stats`` in one write (one snapshot): both replies' lines."""
        return self._exchange(
            b"stats\r\ndump_stats\r\n",
            lambda reader: (reader.lines_until_end(), reader.lines_until_end()),
        )

    # --- plumbing -----------------------------------------------------------------------

    def _set_timeout(self, seconds: float) -> None:
        self.memcache.timeout = seconds
        if self.memcache.sock is not None:
            self.memcache.sock.settimeout(seconds)

    def _exchange(self, request: bytes, read: Callable[[SocketReader], T]) -> T:
        with self._errors():
            memcache = self.memcache
            if memcache.sock is None:
                memcache._connect()  # pymemcache's own connect: timeouts, TCP_NODELAY
            assert memcache.sock is not None
            memcache.sock.sendall(request)
            return read(SocketReader(memcache.sock, self.address))

    @contextmanager
    def _errors(self) -> Iterator[None]:
        """Translate pymemcache's and the socket's exceptions; close on anything but a reply."""
        address = self.address
        try:
            yield
        except ConnectionFailed:
            self.close()
            raise
        except KestrelError:
            raise  # an error reply: the stream is still in step
        except ssl.SSLError as e:  # first: a certificate error is a ValueError too
            self.close()
            raise TlsFailed(f"TLS failed: {tls_reason(e)}", address) from None
        except MemcacheUnexpectedCloseError:
            self.close()
            raise ConnectionFailed("connection closed by the server", address) from None
        except MemcacheUnknownCommandError:
            raise CommandError("ERROR") from None
        except MemcacheIllegalInputError as e:
            raise ValueError(str(e)) from None
        except MemcacheClientError as e:
            raise ClientError(_reason(e)) from None
        except MemcacheServerError as e:
            raise ServerError(_reason(e)) from None
        except (MemcacheUnknownError, KeyError, ValueError) as e:
            self.close()
            raise ProtocolViolation(str(e).encode(), address) from None
        except OSError as e:
            self.close()
            raise ConnectionFailed(str(e) or type(e).__name__, address) from None
        except BaseException:
            self.close()  # interrupted mid-request: the stream is out of step
            raise


def _reason(error: Exception) -> str:
    arg = error.args[0] if error.args else ""
    return arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
