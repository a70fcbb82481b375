"""Who may do what: roles and queue-name patterns, as a pure object.

A user holds roles — ``read`` (fetch: ``get``, ``/open``, ``/close``,
``confirm``, ``monitor``), ``write`` (``set``, ``flush_expired``) and
``admin`` (``flush``, ``delete``, ``flush_all``, ``status``, ``reload``,
``shutdown``) — optionally limited to queue names matching shell patterns
(``orders*``; :func:`fnmatch.fnmatchcase`).  A pattern is matched against the
queue's name; a fanout reader ``q+r`` belongs to its queue ``q``.  Commands
that touch every queue or the whole server (``flush_all``, ``status``,
``reload``, ``shutdown``) need the role without any pattern limit.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from fnmatch import fnmatchcase


class Role(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"


ALL_ROLES = frozenset(Role)


@dataclass(slots=True, frozen=True)
class User:
    """One line of the auth file."""

    name: str
    password_hash: str
    roles: frozenset[Role] = ALL_ROLES
    #: Queue-name patterns the roles are limited to; empty: every queue.
    patterns: tuple[str, ...] = ()

    def permits(self, role: Role, queue: str | None = None) -> bool:
        """May this user act with ``role`` on ``queue`` (None: on the whole server)?"""
        if role not in self.roles:
            return False
        if not self.patterns:
            return True
        if queue is None:
            return False  # server-wide: a user limited to some queues may not
        base = queue.partition("+")[0]
        return any(fnmatchcase(base, pattern) for pattern in self.patterns)


def parse_roles(text: str) -> frozenset[Role]:
    """``read,write`` -> roles; raises ValueError naming an unknown role."""
    roles = set()
    for word in text.split(","):
        word = word.strip().lower()
        if not word:
            continue
        try:
            roles.add(Role(word))
        except ValueError:
            raise ValueError(f"unknown role {word!r} (expected read, write or admin)") from None
    if not roles:
        raise ValueError("no role given (expected read, write or admin)")
    return frozenset(roles)


def render_roles(roles: frozenset[Role]) -> str:
    return ",".join(r.value for r in Role if r in roles)
