"""Who may connect and what they may do: TLS, the auth file, users' roles.

- :mod:`~kestreld.security.tls`: the listeners' TLS context, renewed by reload.
- :mod:`~kestreld.security.passwords`: scrypt password hashes.
- :mod:`~kestreld.security.auth_file`: the auth file's users.
- :mod:`~kestreld.security.policy`: roles and queue-name patterns (:class:`User`).
- :mod:`~kestreld.security.authenticator`: password checks off the event loop.
- :mod:`~kestreld.security.limiter`: the delay of repeated failures per address.

Nothing here knows a protocol: sessions of every front end use the same objects.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kestreld.security.auth_file import (
        AuthFile,
        AuthFileError,
        load_auth_file,
        parse_auth_file,
    )
    from kestreld.security.authenticator import Authenticator, parse_token
    from kestreld.security.limiter import FailureLimiter
    from kestreld.security.passwords import hash_password, verify_password
    from kestreld.security.policy import ALL_ROLES, Role, User
    from kestreld.security.tls import ServerTls, TlsError, TlsFiles, build_context

#: Each name's module, imported when the name is first asked for: every session needs the
#: policy, but a server without TLS or an auth file never loads the rest.
_MODULES = {
    "AuthFile": "auth_file",
    "AuthFileError": "auth_file",
    "load_auth_file": "auth_file",
    "parse_auth_file": "auth_file",
    "Authenticator": "authenticator",
    "parse_token": "authenticator",
    "FailureLimiter": "limiter",
    "hash_password": "passwords",
    "verify_password": "passwords",
    "ALL_ROLES": "policy",
    "Role": "policy",
    "User": "policy",
    "ServerTls": "tls",
    "TlsError": "tls",
    "TlsFiles": "tls",
    "build_context": "tls",
}


def __getattr__(name: str) -> Any:
    module = _MODULES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "ALL_ROLES",
    "AuthFile",
    "AuthFileError",
    "Authenticator",
    "FailureLimiter",
    "Role",
    "ServerTls",
    "TlsError",
    "TlsFiles",
    "User",
    "build_context",
    "hash_password",
    "load_auth_file",
    "parse_auth_file",
    "parse_token",
    "verify_password",
]
