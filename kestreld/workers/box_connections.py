"""``max_connections`` over the box: the workers' client connection counts in one shared file.

The file (``connections.count`` in the supervisor's private folder) holds one 8-byte
count per worker, mapped into every worker; a worker writes only its own slot (its client
connections now, the channels between workers left out) whenever a connection closes or a
handed one arrives.  A worker admitting a new client takes the file's lock (``flock``),
sums the slots and, when the box is under ``max_connections``, counts the client in its
slot before the lock is let go: two workers accepting at once never pass the limit
together.  The lock
costs two system calls per accepted client, next to the accept's own.

A connection handed to another worker (handoff.py) was admitted where it was accepted:
the receiver counts it without asking.  The sender's count drops when its end closes,
possibly a moment before the receiver's rises: for that moment the box may admit one
client more per hand-off in flight.

A worker that starts (or restarts: its clients went with its predecessor) writes zero
in its slot before it accepts anything.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import struct

_SLOT = struct.Struct("<q")
FILE = "connections.count"


class BoxConnections:
    """Worker ``index``'s view of the box's client connections (one of ``count`` slots)."""

    __slots__ = ("fd", "map", "index", "count", "offset")

    def __init__(self, folder: str, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self.offset = _SLOT.size * index
        size = _SLOT.size * count
        self.fd = os.open(os.path.join(folder, FILE), os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self.fd).st_size < size:
            os.ftruncate(self.fd, size)  # zeros; the workers starting together agree on it
        self.map = mmap.mmap(self.fd, size)
        self.publish(0)

    def publish(self, mine: int) -> None:
        """Write this worker's client connections (one aligned 8-byte store: never torn)."""
        _SLOT.pack_into(self.map, self.offset, mine)

    def total(self) -> int:
        return sum(value for (value,) in _SLOT.iter_unpack(self.map))

    def admit(self, mine: int, limit: int) -> bool:
        """True (one more reserved in this worker's slot) when the box holds fewer than
        ``limit`` client connections, this worker's ``mine`` among them."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            self.publish(mine)
            if self.total() >= limit:
                return False
            self.publish(mine + 1)  # the connection is opened right after, on this loop
            return True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self.map.close()
        os.close(self.fd)
