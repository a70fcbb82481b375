"""Password hashes of the auth file: scrypt (the standard library's), self-describing.

A hash is a PHC string, ``$scrypt$ln=14,r=8,p=1$<salt>$<key>`` (salt and key in
unpadded base64), so the cost can rise later without breaking old lines: each
line says how it was made.  Checking a password costs what making it cost
(about a third of a second on a loaded core, on purpose): callers run
:func:`verify_password` off the event loop.
"""

from __future__ import annotations

import base64
import os
import re

#: log2 of scrypt's N, r and p for new hashes (16 MiB of memory each).
DEFAULT_LOG2_N = 14
DEFAULT_R = 8
DEFAULT_P = 1
SALT_BYTES = 16
KEY_BYTES = 32

_PHC = re.compile(
    r"\$scrypt\$ln=(?P<ln>\d{1,2}),r=(?P<r>\d{1,2}),p=(?P<p>\d{1,2})"
    r"\$(?P<salt>[A-Za-z0-9+/]+)\$(?P<key>[A-Za-z0-9+/]+)"
)
#: The most memory one check may take (N=2^17 with r=8: 128 MiB; more is refused).
_MAX_MEMORY = 160 * 1024 * 1024


class PasswordHashError(ValueError):
    """A string that is not a password hash this module can check."""


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4))


def hash_password(
    password: str, *, log2_n: int = DEFAULT_LOG2_N, r: int = DEFAULT_R, p: int = DEFAULT_P
) -> str:
    """A new hash of ``password`` with a random salt."""
    salt = os.urandom(SALT_BYTES)
    key = _scrypt(password.encode("utf-8"), salt, log2_n, r, p, KEY_BYTES)
    return f"$scrypt$ln={log2_n},r={r},p={p}${_b64(salt)}${_b64(key)}"


def check_hash(encoded: str) -> None:
    """Raise PasswordHashError unless ``encoded`` is a hash :func:`verify_password` can check."""
    m = _PHC.fullmatch(encoded)
    if m is None:
        raise PasswordHashError("not a $scrypt$ln=..,r=..,p=..$salt$key password hash")
    ln, r, p = int(m["ln"]), int(m["r"]), int(m["p"])
    if not (1 <= ln <= 20 and 1 <= r <= 32 and 1 <= p <= 16):
        raise PasswordHashError(f"scrypt parameters out of range (ln={ln}, r={r}, p={p})")
    if 128 * r * (1 << ln) > _MAX_MEMORY:
        raise PasswordHashError(f"scrypt parameters need too much memory (ln={ln}, r={r})")
    if len(_unb64(m["key"])) < 16 or len(_unb64(m["salt"])) < 8:
        raise PasswordHashError("salt or key too short")


def verify_password(password: bytes, encoded: str) -> bool:
    """True when ``password`` matches ``encoded`` (compared in constant time).

    Blocking and slow by design; a malformed ``encoded`` is False (the auth
    file was checked with :func:`check_hash` when it was read).
    """
    m = _PHC.fullmatch(encoded)
    if m is None:
        return False
    expected = _unb64(m["key"])
    try:
        key = _scrypt(
            password, _unb64(m["salt"]), int(m["ln"]), int(m["r"]), int(m["p"]), len(expected)
        )
    except ValueError:
        return False
    import hmac  # (OpenSSL's digests: loaded only where passwords are checked, see _scrypt)

    return hmac.compare_digest(key, expected)


def _scrypt(password: bytes, salt: bytes, log2_n: int, r: int, p: int, length: int) -> bytes:
    # hashlib (OpenSSL's digest tables) is 0.6 MiB of a server's memory: imported by the
    # first password check, so a server without an auth file never loads it.
    import hashlib

    return hashlib.scrypt(
        password, salt=salt, n=1 << log2_n, r=r, p=p, maxmem=_MAX_MEMORY, dklen=length
    )
