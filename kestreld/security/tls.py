"""TLS for the listeners: one server context, renewable without a restart.

The listener is created with :attr:`ServerTls.context` (``ssl=`` of
``create_server``).  Certificates rotate: :meth:`ServerTls.reload` reads the
files again into a *new* context, and the listener's context hands every new
handshake to the newest one (its server-name callback, which OpenSSL runs for
every handshake, with or without SNI).  Connections already open keep the
session they have; nothing is dropped.  A reload whose files are missing or do
not match keeps the context in use.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

import structlog

log = structlog.get_logger("kestreld.security")

#: Seconds a client has to finish its TLS handshake (the default of ``tls_handshake_timeout``).
HANDSHAKE_TIMEOUT = 10.0


class TlsError(Exception):
    """TLS files that cannot be used; the message names the file."""


@dataclass(slots=True, frozen=True)
class TlsFiles:
    cert_file: str
    key_file: str
    ca_file: str | None = None
    verify_client: bool = False


def build_context(files: TlsFiles) -> ssl.SSLContext:
    """A server context for ``files`` (TLS 1.2 or newer); raises TlsError."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(files.cert_file, files.key_file)
    except FileNotFoundError as e:
        raise TlsError(f"tls: {e.filename or files.cert_file} does not exist") from None
    except ssl.SSLError as e:
        raise TlsError(
            f"tls: cannot use certificate {files.cert_file} with key {files.key_file}: "
            f"{e.reason or e}"
        ) from None
    except OSError as e:
        raise TlsError(f"tls: cannot read {e.filename or files.cert_file}: {e.strerror}") from None
    if files.ca_file is not None:
        try:
            context.load_verify_locations(cafile=files.ca_file)
        except FileNotFoundError:
            raise TlsError(f"tls: {files.ca_file} does not exist") from None
        except (ssl.SSLError, OSError) as e:
            raise TlsError(f"tls: cannot use CA file {files.ca_file}: {e}") from None
    if files.verify_client:
        if files.ca_file is None:
            raise TlsError("tls_verify_client needs tls_ca_file (the CA of client certificates)")
        context.verify_mode = ssl.CERT_REQUIRED
    elif files.ca_file is not None:
        context.verify_mode = ssl.CERT_OPTIONAL  # a client may present a certificate
    return context


class ServerTls:
    """The TLS context of the listeners and its renewals."""

    def __init__(self, files: TlsFiles, handshake_timeout: float = HANDSHAKE_TIMEOUT) -> None:
        self.files = files
        self.handshake_timeout = handshake_timeout
        #: The listener's context: it serves handshakes from :attr:`current`.
        self.context = build_context(files)
        self.current = self.context
        self.context.sni_callback = self._select
        self.reloads = 0

    def _select(self, ssl_object: ssl.SSLObject, server_name: str | None, _: object) -> None:
        if self.current is not self.context:
            ssl_object.context = self.current
        return None

    def reload(self, files: TlsFiles | None = None) -> str | None:
        """Read the certificate files again: new handshakes use them.  The error, or None."""
        files = files or self.files
        if files.verify_client != self.files.verify_client:
            return "tls_verify_client: needs a restart to change"
        try:
            fresh = build_context(files)
        except TlsError as e:
            log.error("tls_reload_failed", error=str(e))
            return str(e)
        self.files = files
        self.current = fresh
        self.reloads += 1
        log.info("tls_reloaded", cert_file=files.cert_file)
        return None


def peer_certificate_name(transport: object) -> str | None:
    """The common name of the client's verified certificate, if it sent one."""
    get = getattr(transport, "get_extra_info", None)
    cert = get("peercert") if get is not None else None
    if not cert:
        return None
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return value
    return None
