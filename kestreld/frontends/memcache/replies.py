"""Reply lines of the memcache text protocol, the builders of error lines, and the
handing of several reply parts to a transport (an item's bytes are not joined into one
more copy: milliseconds on the loop for a few MiB)."""

from __future__ import annotations

from typing import Any

STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
END = b"END\r\n"
ERROR = b"ERROR\r\n"
DELETED = b"DELETED\r\n"
VALUE_END = b"\r\nEND\r\n"
CRLF = b"\r\n"
FLUSHED_ALL = b"Flushed all queues.\r\n"
RELOADED = b"Reloaded config.\r\n"


def client_error(reason: str) -> bytes:
    """The request was wrong: ``CLIENT_ERROR <reason>``."""
    return b"CLIENT_ERROR " + reason.encode() + b"\r\n"


def server_error(reason: str) -> bytes:
    """The server could not do a right request: ``SERVER_ERROR <reason>``."""
    return b"SERVER_ERROR " + reason.encode() + b"\r\n"


def value(key: bytes, data: bytes) -> bytes:
    """The header line of one item: ``VALUE <key> 0 <bytes>``."""
    return b"VALUE %s 0 %d\r\n" % (key, len(data))


def write_parts(transport: Any, parts: list[bytes], join_below: int) -> int:
    """Write ``parts`` to ``transport``, joined when smaller than ``join_below`` bytes, else
    as they are (``writelines``: one writev); returns their size."""
    size = sum(map(len, parts))
    if size > join_below:
        transport.writelines(parts)
    elif size:
        transport.write(b"".join(parts))
    return size


def unsent(parts: list[bytes], sent: int) -> list[bytes | memoryview]:
    """``parts`` without their first ``sent`` bytes (the part cut in two: a view, no copy)."""
    rest: list[bytes | memoryview] = []
    for part in parts:
        size = len(part)
        if sent >= size:
            sent -= size
            continue
        rest.append(memoryview(part)[sent:] if sent else part)
        sent = 0
    return rest


BAD_QUEUE_NAME = client_error("bad queue name")
MISSING_QUEUE_NAME = client_error("missing queue name")
BAD_COMMAND_LINE = client_error("bad command line format")
BAD_DATA_CHUNK = client_error("bad data chunk")
LINE_TOO_LONG = client_error("line too long")
