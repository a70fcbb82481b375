"""The Kestrel dialect of the memcache text protocol, as the clients speak it.

Pure functions, no I/O, shared by the blocking and the asyncio client:
queue-name checks, the option keys of ``get`` (``jobs/t=250/close/open``),
the ``exptime`` field of ``set``, and the meaning of reply lines.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import timedelta

from kestreld.client.errors import (
    AuthenticationFailed,
    ClientError,
    CommandError,
    KestrelError,
    ProtocolViolation,
    ServerError,
)
from kestreld.names import split_queue_name

#: memcache's key limit, which pymemcache enforces.
MAX_KEY_LENGTH = 250
#: ``exptime`` below this is relative seconds, above it absolute Unix seconds.
RELATIVE_EXPIRY_LIMIT = 1_000_000

#: ``put_many`` pipelines at most this many items, and about this many bytes, per round trip.
PIPELINE_ITEMS = 1000
PIPELINE_BYTES = 1 << 20
#: What ``status <new>`` accepts.
STATUSES = ("up", "writeavoid", "readonly", "quiescent")

Data = bytes | bytearray | memoryview | str
Expiry = float | int | timedelta | None


def check_queue_name(name: str, *, writable: bool = False) -> str:
    """``name`` if the server would accept it, else ValueError.

    Legal names are 1-200 printable ASCII characters without ``/ . ~ +`` or
    spaces, optionally ``queue+reader`` for a fanout reader (see kestreld.names).  ``writable`` refuses reader names: items are put to
    the queue, and every reader sees them.
    """
    if not isinstance(name, str) or split_queue_name(name) is None:
        raise ValueError(
            f"illegal queue name {name!r}: use 1-200 printable ASCII characters "
            "without '/', '.', '~', '+' or spaces, or queue+reader"
        )
    if writable and "+" in name:
        raise ValueError(f"cannot put to the fanout reader {name!r}: put to the queue")
    return name


def wait_ms(seconds: float) -> int:
    """A wait in whole milliseconds for ``/t=``, rounded up so that a short wait still waits."""
    if seconds <= 0:
        return 0
    return max(1, math.ceil(seconds * 1000))


def read_key(
    queue: str,
    *,
    wait: float = 0.0,
    open: bool = False,
    close: bool = False,
    abort: bool = False,
    peek: bool = False,
) -> str:
    """The key of a ``get``: ``queue`` plus its options, e.g. ``jobs/t=250/close/open``.

    ``wait`` is in seconds.  Raises ValueError when the key would be longer
    than memcache's 250-byte limit (only for names near the 200+200 maximum).
    """
    parts = [queue]
    ms = wait_ms(wait)
    if ms:
        parts.append(f"t={ms}")
    if close:
        parts.append("close")
    if open:
        parts.append("open")
    if abort:
        parts.append("abort")
    if peek:
        parts.append("peek")
    key = "/".join(parts)
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"get key {key!r} is longer than memcache's {MAX_KEY_LENGTH} bytes")
    return key


def exptime(expiry: Expiry, now: float | None = None) -> int:
    """The ``exptime`` field for an item that expires ``expiry`` from now.

    ``None`` never expires (0).  Seconds (or a ``timedelta``) are rounded up
    to whole seconds, the protocol's unit; a delay the server would read as
    an absolute time (over 1,000,000 s) is sent as absolute Unix seconds.
    """
    if expiry is None:
        return 0
    seconds = expiry.total_seconds() if isinstance(expiry, timedelta) else float(expiry)
    if not seconds > 0 or math.isinf(seconds):
        raise ValueError(f"expiry must be a positive, finite number of seconds, not {expiry!r}")
    whole = math.ceil(seconds)
    if whole < RELATIVE_EXPIRY_LIMIT:
        return whole
    return math.ceil((time.time() if now is None else now) + seconds)


def to_bytes(data: Data) -> bytes:
    """Item data as bytes; text is encoded as UTF-8."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, bytes | bytearray | memoryview):
        return bytes(data)
    raise TypeError(f"item data must be bytes or str, not {type(data).__name__}")


def chunks(items: list[bytes]) -> Iterator[list[bytes]]:
    """``items`` cut into pipelines of at most PIPELINE_ITEMS items and about PIPELINE_BYTES."""
    chunk: list[bytes] = []
    size = 0
    for data in items:
        if chunk and (len(chunk) >= PIPELINE_ITEMS or size + len(data) > PIPELINE_BYTES):
            yield chunk
            chunk, size = [], 0
        chunk.append(data)
        size += len(data)
    if chunk:
        yield chunk


def check_status(status: str) -> str:
    """``status`` lower-cased if the server accepts it (``up``, ``writeavoid``, ``readonly``, ``quiescent``), else ValueError."""
    wanted = status.lower() if isinstance(status, str) else ""
    if wanted not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    return wanted


def set_request(queue: str, data: bytes, expire: int) -> bytes:
    """One complete ``set`` request, data block included."""
    return b"set %s 0 %d %d\r\n%s\r\n" % (queue.encode("ascii"), expire, len(data), data)


#: The key of the authentication ``set`` (any key does; nothing is stored under it).
AUTH_KEY = b"auth"


def auth_request(username: str, password: str) -> bytes:
    """memcached's authentication (``-Y``): a ``set`` whose data is ``<user> <password>``."""
    if not username or not password or any(c in username + password for c in " \r\n"):
        raise ValueError("username and password: non-empty, without spaces or line breaks")
    token = f"{username} {password}".encode()
    return b"set %s 0 0 %d\r\n%s\r\n" % (AUTH_KEY, len(token), token)


def auth_result(line: bytes, server: str) -> None:
    """Raise unless ``line`` (the reply to :func:`auth_request`) is ``STORED``."""
    if line == b"STORED":
        return
    reason = line.removeprefix(b"CLIENT_ERROR ").decode("utf-8", "replace")
    raise AuthenticationFailed(f"{server}: {reason}")


def error_for(line: bytes) -> KestrelError | None:
    """The exception an error reply line stands for, or None for any other line."""
    if line == b"ERROR" or line.startswith(b"ERROR "):
        return CommandError(line.decode("utf-8", "replace"))
    if line.startswith(b"CLIENT_ERROR"):
        return ClientError(line[13:].decode("utf-8", "replace"))
    if line.startswith(b"SERVER_ERROR"):
        return ServerError(line[13:].decode("utf-8", "replace"))
    return None


def store_result(line: bytes) -> bool:
    """True for ``STORED``, False for ``NOT_STORED``; raises for an error reply."""
    if line == b"STORED":
        return True
    if line == b"NOT_STORED":
        return False
    raise error_for(line) or ProtocolViolation(line)


def value_size(line: bytes) -> int | None:
    """The data length of a ``VALUE <key> <flags> <len>`` line, None for ``END``."""
    if line == b"END":
        return None
    parts = line.split()
    if len(parts) == 4 and parts[0] == b"VALUE" and parts[3].isdigit():
        return int(parts[3])
    raise error_for(line) or ProtocolViolation(line)
