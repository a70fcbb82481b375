"""``kestreld passwd``: make the auth file line of a user.

    kestreld passwd NAME [--roles read,write,admin] [--queues 'orders*,jobs'] [--file AUTH_FILE]

Reads the password from the terminal (twice, not echoed) or, when standard
input is not a terminal, from its first line (``echo "$PW" | kestreld passwd
alice``), and prints ``NAME:<scrypt hash>[:roles[:patterns]]``.  With
``--file`` the line goes into that auth file instead: it replaces the user's
line if there is one, else it is appended; the file is rewritten atomically,
readable by its owner only when it is new.  ``reload`` (or SIGHUP) makes a
running server use it.  Exit status 0, 2 for bad arguments or a bad file.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from kestreld.security.auth_file import AuthFileError, parse_auth_file
from kestreld.security.passwords import hash_password
from kestreld.security.policy import parse_roles, render_roles


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld passwd", description="Print (or write) a user's auth file line."
    )
    p.add_argument("name", help="the user name (no spaces or colons)")
    p.add_argument("--roles", help="read, write, admin, comma-separated (default: all three)")
    p.add_argument("--queues", help="queue-name patterns the roles are limited to ('orders*,jobs')")
    p.add_argument("--file", help="write the line into this auth file instead of printing it")
    return p


def _read_password() -> str | None:
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            print("kestreld passwd: the passwords differ", file=sys.stderr)
            return None
        return first
    return sys.stdin.readline().rstrip("\r\n")


def auth_line(name: str, password: str, roles: str | None, queues: str | None) -> str:
    """The auth file line for these values; raises ValueError when one is unusable."""
    fields = [name, hash_password(password)]
    if roles or queues:
        fields.append(render_roles(parse_roles(roles or "read,write,admin")))
    if queues:
        fields.append(queues)
    line = ":".join(fields)
    try:
        parse_auth_file(line, "the new line")  # the server's own rules
    except AuthFileError as e:
        raise ValueError(str(e).removeprefix("the new line line 1: ")) from None
    return line


def write_line(path: str, name: str, line: str) -> None:
    """Replace ``name``'s line in ``path`` (or append it), atomically."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        mode = os.stat(path).st_mode & 0o777
    except FileNotFoundError:
        lines, mode = [], 0o600
    parse_auth_file("\n".join(lines), path)  # refuse to rewrite a file the server could not read
    replaced = False
    for i, old in enumerate(lines):
        if old.split(":", 1)[0].strip() == name and not old.lstrip().startswith("#"):
            lines[i] = line
            replaced = True
    if not replaced:
        lines.append(line)
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    password = _read_password()
    if password is None:
        return 2
    if not password or " " in password:
        print("kestreld passwd: a password must be non-empty, without spaces", file=sys.stderr)
        return 2  # the memcache auth token is "<user> <password>", split at spaces
    try:
        line = auth_line(args.name, password, args.roles, args.queues)
    except ValueError as e:
        print(f"kestreld passwd: {e}", file=sys.stderr)
        return 2
    if args.file is None:
        print(line)
        return 0
    try:
        write_line(args.file, args.name, line)
    except (AuthFileError, OSError) as e:
        print(f"kestreld passwd: {e}", file=sys.stderr)
        return 2
    print(f"kestreld passwd: {args.name} written to {args.file}", file=sys.stderr)
    return 0
