"""The client's TLS context, from the files a client is given.

    tls = client_context(ca_file="ca.crt")                       # TLS
    tls = client_context("ca.crt", "alice.crt", "alice.key")     # mutual TLS
    Client(["db1:22133"], tls=tls)

The server's certificate is checked against ``ca_file`` (the system's CAs
when None) and for the name the client dials (or the connection's
``server_name``); ``cert_file`` and ``key_file`` are the client's own
certificate, for a server with ``tls_verify_client``.
"""

from __future__ import annotations

import ssl


class TlsFilesError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names it."""


def client_context(
    ca_file: str | None = None, cert_file: str | None = None, key_file: str | None = None
) -> ssl.SSLContext:
    """A TLS client context; raises TlsFilesError naming the file that cannot be used."""
    if key_file is not None and cert_file is None:
        raise TlsFilesError("a client key needs its certificate: give the certificate file too")
    try:
        context = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise TlsFilesError(f"CA file {ca_file}: {_why(e)}") from None
    if cert_file is not None:
        try:
            context.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            raise TlsFilesError(f"client certificate {cert_file}: {_why(e)}") from None
    return context


def _why(error: OSError | ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return error.strerror or str(error)


def tls_reason(error: ssl.SSLError) -> str:
    """What went wrong in TLS, briefly: ``CERTIFICATE_VERIFY_FAILED (Hostname mismatch, ...)``."""
    detail = getattr(error, "verify_message", None)
    reason = error.reason or type(error).__name__
    return f"{reason} ({detail})" if detail else reason
