"""Queue and reader names: the one rule config, clients, the protocol and the journal share.

Kestrel's rule: a queue name is anything without ``/``, ``.`` or ``~``; a fanout
reader is ``queue+reader``.  kestreld takes the same rule and adds what makes a
name safe as part of a file name and on the memcache wire: printable ASCII
only (no whitespace, no control characters), ``+`` only as the reader
separator, 1 to 200 characters per part, and at most :data:`MAX_FANOUT_NAME`
characters of queue plus reader.

A legal name has no dot, no slash and no ``~``, so it can safely become part
of a file name, everything before the first dot of a journal file name is its
queue, and the ``~~`` of a temporary file cannot be part of a name.
"""

from __future__ import annotations

import re

#: Characters a name never holds: the path separator, the dot of file names, the
#: ``~`` of temporaries, the reader separator ``+``; anything not printable ASCII.
FORBIDDEN = "/.~+"
#: One part of a name: printable ASCII from ``!`` to ``}`` except ``/ . ~ +``.
NAME_RE = re.compile(r"[!-*,\-0-9:-}]{1,200}")
#: Longest queue + reader name of a fanout reader: its checkpoint temporary
#: "<queue>.read.<reader>~~<13-digit ms>" must fit the 255-byte file-name limit.
MAX_FANOUT_NAME = 255 - len(".read.") - len("~~") - 13


def is_legal_name(name: str) -> bool:
    """A queue or reader name (one part) that can safely become part of a file name."""
    return NAME_RE.fullmatch(name) is not None


def split_queue_name(name: str) -> tuple[str, str] | None:
    """``"q"`` -> ``("q", "")``, ``"q+r"`` -> ``("q", "r")``; None when illegal."""
    queue, plus, reader = name.partition("+")
    if not is_legal_name(queue):
        return None
    if plus:
        if not is_legal_name(reader) or len(queue) + len(reader) > MAX_FANOUT_NAME:
            return None
        return queue, reader
    return queue, ""
