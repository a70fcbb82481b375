"""The auth file: who may connect, with which password, roles and queues.

One user per line, fields separated by ``:``::

    # name:password hash[:roles[:queue patterns]]
    alice:$scrypt$ln=14,r=8,p=1$...$...
    feeder:$scrypt$ln=14,r=8,p=1$...$...:write:orders*,invoices
    ops:$scrypt$ln=14,r=8,p=1$...$...:read,write,admin

``kestreld passwd NAME`` prints such a line.  Roles are ``read``, ``write``
and ``admin``, comma-separated (no roles field: all three, as memcached's
auth file trusts every user it lists); patterns are comma-separated shell
patterns limiting the roles to matching queue names.  Blank lines and lines
starting with ``#`` are ignored.  A password field that is not a ``$scrypt$``
hash is taken as the password itself (memcached's ``-Y`` file format), which
works but is logged as a warning at every load: hash it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from kestreld.security.passwords import PasswordHashError, check_hash
from kestreld.security.policy import ALL_ROLES, User, parse_roles

_NAME = re.compile(r"[^\s:]{1,128}")
_PATTERN = re.compile(r"[^\s:,]{1,256}")


class AuthFileError(Exception):
    """An auth file that cannot be used; the message names the file and the line."""


@dataclass(slots=True)
class AuthFile:
    """The users of one auth file, by name."""

    source: str
    users: dict[str, User] = field(default_factory=dict)
    #: Line numbers whose password is stored in the clear (memcached's format).
    plaintext_lines: list[int] = field(default_factory=list)

    def user(self, name: str) -> User | None:
        return self.users.get(name)


def parse_auth_file(text: str, source: str = "<auth file>") -> AuthFile:
    """Users from the text of an auth file; raises AuthFileError naming the line."""
    parsed = AuthFile(source)
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        fields = line.split(":")
        if len(fields) < 2 or len(fields) > 4:
            raise AuthFileError(f"{where}: expected name:password hash[:roles[:queue patterns]]")
        name, secret = fields[0], fields[1]
        if not _NAME.fullmatch(name):
            raise AuthFileError(f"{where}: user name must be 1-128 characters, no spaces")
        if name in parsed.users:
            raise AuthFileError(f"{where}: user {name} is listed twice")
        if not secret:
            raise AuthFileError(f"{where}: user {name} has an empty password")
        if secret.startswith("$scrypt$"):
            try:
                check_hash(secret)
            except PasswordHashError as e:
                raise AuthFileError(f"{where}: user {name}: {e}") from None
        elif " " in secret:
            raise AuthFileError(f"{where}: user {name}: a password cannot contain spaces")
        else:
            parsed.plaintext_lines.append(number)
        roles = ALL_ROLES
        if len(fields) > 2 and fields[2].strip():
            try:
                roles = parse_roles(fields[2])
            except ValueError as e:
                raise AuthFileError(f"{where}: user {name}: {e}") from None
        patterns: tuple[str, ...] = ()
        if len(fields) > 3:
            patterns = tuple(p.strip() for p in fields[3].split(",") if p.strip())
            bad = [p for p in patterns if not _PATTERN.fullmatch(p)]
            if bad or not patterns:
                raise AuthFileError(f"{where}: user {name}: bad queue patterns {fields[3]!r}")
        parsed.users[name] = User(name, secret, roles, patterns)
    return parsed


def load_auth_file(path: str) -> AuthFile:
    """Read and parse ``path``; raises AuthFileError (unreadable, malformed, empty)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise AuthFileError(f"auth file {path} does not exist") from None
    except OSError as e:
        raise AuthFileError(f"auth file {path}: cannot read: {e.strerror}") from None
    except UnicodeDecodeError:
        raise AuthFileError(f"auth file {path}: not UTF-8 text") from None
    parsed = parse_auth_file(text, path)
    if not parsed.users:
        raise AuthFileError(f"auth file {path} lists no users (nobody could connect)")
    return parsed
