"""TLS for one connection: the server side of the handshake and the records, on the loop.

:class:`TlsStream` sits between the socket's transport and the front end's
protocol: to the socket it is the protocol, to the front end it is the
transport (``write``, ``close``, ``pause_reading``, ``get_extra_info`` ...).
The standard library's ``ssl`` module does the cryptography on memory
buffers (:meth:`ssl.SSLContext.wrap_bio`), on the event loop.

Why not ``create_server(ssl=...)``: asyncio's TLS transport shuts a
connection down as soon as the client sends ``close_notify``, dropping the
replies still owed to it; a client that pipes its requests into
``openssl s_client`` and ends its input lost the replies of its last
requests.  Here the end of the client's input is a half-close, exactly as on
a plain socket: the front end answers what it was sent, then closes.

- A handshake that does not finish within the timeout is dropped; it holds
  nobody else up (it is one more connection waiting for bytes).
- A client that does not speak TLS (a plaintext request on a TLS port) gets
  ``plaintext_reply`` in the clear, if any, and is closed.
- The front end's protocol sees ``connection_made`` only after the handshake.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import structlog

from kestreld.security.tls import ServerTls

log = structlog.get_logger("kestreld.security")

#: The first byte of every TLS handshake record.
_HANDSHAKE_RECORD = 0x16
_READ_SIZE = 256 * 1024


class TlsStream(asyncio.Protocol):
    """One TLS connection: the socket's protocol and the front end's transport."""

    def __init__(
        self, tls: ServerTls, app: asyncio.Protocol, plaintext_reply: bytes | None = None
    ) -> None:
        self.tls = tls
        self.app = app
        self.plaintext_reply = plaintext_reply
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = tls.context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._raw: asyncio.Transport | None = None
        self._handshaking = True
        self._first = True  # the first bytes tell a TLS client from a plaintext one
        self._timer: asyncio.TimerHandle | None = None
        self._closing = False
        self._eof = False
        self._app_reading = True
        self.peer: Any = None

    # --- the socket's side (asyncio.Protocol) ------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._raw = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(self.tls.handshake_timeout, self._handshake_timed_out)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        if self._handshaking:
            if self._first and data:
                self._first = False
                if data[0] != _HANDSHAKE_RECORD:
                    self._not_tls()
                    return
            self._incoming.write(data)
            self._handshake()
            return
        self._incoming.write(data)
        self._read()

    def eof_received(self) -> bool | None:
        """The socket's end of input without close_notify: a half-close all the same."""
        if self._handshaking:
            self._abandon("closed during the handshake")
            return None
        return self._app_eof()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closing = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._handshaking:
            self.app.connection_lost(exc)

    def pause_writing(self) -> None:
        self.app.pause_writing()

    def resume_writing(self) -> None:
        self.app.resume_writing()

    # --- handshake and records ---------------------------------------------------------------

    def _handshake(self) -> None:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            self._flush()
            return
        except (ssl.SSLError, ssl.CertificateError) as e:
            self._flush()  # the alert, so the client learns why
            self._abandon(getattr(e, "reason", None) or str(e))
            return
        self._handshaking = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._flush()
        self.app.connection_made(self)  # type: ignore[arg-type]
        if self._incoming.pending and not self._closing:
            self._read()  # requests sent right behind the handshake

    def _read(self) -> None:
        chunks = []
        eof = False
        try:
            while True:
                chunk = self._ssl.read(_READ_SIZE)
                if not chunk:
                    eof = True
                    break
                chunks.append(chunk)
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLZeroReturnError:
            eof = True
        except ssl.SSLError as e:
            log.info("tls_connection_failed", peer=self.peer, error=e.reason or str(e))
            self._flush()
            self.abort()
            return
        self._flush()  # what reading produced (TLS 1.3 tickets, key updates)
        if chunks:
            self.app.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if eof and not self._eof and not self._closing:
            self._app_eof()

    def _app_eof(self) -> bool:
        self._eof = True
        if not self.app.eof_received():
            self.close()
        return True  # the socket stays open for the replies: the front end closes it

    def _flush(self) -> None:
        if self._outgoing.pending and self._raw is not None:
            self._raw.write(self._outgoing.read())

    def _handshake_timed_out(self) -> None:
        self._timer = None
        if self._handshaking:
            self._abandon("handshake timed out")

    def _not_tls(self) -> None:
        log.info("tls_handshake_failed", peer=self.peer, reason="not TLS (a plaintext client?)")
        if self.plaintext_reply and self._raw is not None:
            self._raw.write(self.plaintext_reply)
        self._closing = True
        if self._raw is not None:
            self._raw.close()

    def _abandon(self, reason: str) -> None:
        log.info("tls_handshake_failed", peer=self.peer, reason=reason)
        self._closing = True
        if self._raw is not None:
            self._raw.close()

    # --- the front end's side (an asyncio transport) ---------------------------------------

    def write(self, data: bytes) -> None:
        if self._closing or not data:
            return
        view = memoryview(data)
        while view:
            written = self._ssl.write(view)
            view = view[written:]
        self._flush()

    def writelines(self, chunks) -> None:
        self.write(b"".join(chunks))

    def close(self) -> None:
        """Send close_notify after everything written, then close the socket."""
        if self._closing:
            return
        self._closing = True
        try:
            self._ssl.unwrap()
        except ssl.SSLError:
            pass  # the client's close_notify need not be awaited
        self._flush()
        if self._raw is not None:
            self._raw.close()

    def abort(self) -> None:
        self._closing = True
        if self._raw is not None:
            self._raw.abort()

    def is_closing(self) -> bool:
        return self._closing or self._raw is None or self._raw.is_closing()

    def pause_reading(self) -> None:
        self._app_reading = False
        if self._raw is not None and not self._closing:
            self._raw.pause_reading()

    def resume_reading(self) -> None:
        self._app_reading = True
        if self._raw is not None and not self._closing:
            self._raw.resume_reading()

    def is_reading(self) -> bool:
        return self._app_reading

    def get_write_buffer_size(self) -> int:
        return self._raw.get_write_buffer_size() if self._raw is not None else 0

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        if self._raw is not None:
            self._raw.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "ssl_object":
            return self._ssl
        if name == "peercert":
            return self._ssl.getpeercert()
        if name == "cipher":
            return self._ssl.cipher()
        if name == "sslcontext":
            return self._ssl.context
        if self._raw is None:
            return default
        return self._raw.get_extra_info(name, default)
