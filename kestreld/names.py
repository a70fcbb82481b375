"""Queue and reader names: the one rule config, clients, the protocol and the journal share.

Queue names are ``[A-Za-z0-9_:-]{1,200}``; a fanout reader is ``queue+reader``.
A legal name has no dot, no slash and no ``~~``, so it can safely become part
of a file name, and everything before the first dot of a journal file name is
its queue.
"""

from __future__ import annotations

import re

NAME_RE = re.compile(r"[A-Za-z0-9_:\-]{1,200}")
#: Longest queue + reader name of a fanout reader: its checkpoint temporary
#: "<queue>.read.<reader>~~<13-digit ms>" must fit the 255-byte file-name limit.
MAX_FANOUT_NAME = 255 - len(".read.") - len("~~") - 13


def is_legal_name(name: str) -> bool:
    """A queue or reader name that can safely become part of a file name."""
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
