"""``max_queues`` over the box: the workers' queue counts in one shared file.

The file (``queues.count`` in the supervisor's private folder) holds one 8-byte count per
worker.  A worker about to create a queue takes the file's lock (``flock``), writes its
own count, sums them all and, when the box is under ``max_queues``, reserves one more in
its slot before the lock is let go: two workers creating at once never pass the limit
together.  Creating a queue is rare (it makes files), so the lock costs nothing a client
notices.  Each worker writes its count again every second, so queues deleted or expired
on one worker free the budget of every worker.
"""

from __future__ import annotations

import fcntl
import os
import struct

_SLOT = struct.Struct("<q")


class BoxQueueCount:
    """Worker ``index``'s view of the box's queue count (one of ``count`` slots)."""

    __slots__ = ("fd", "index", "count")

    def __init__(self, folder: str, index: int, count: int) -> None:
        self.index = index
        self.count = count
        self.fd = os.open(os.path.join(folder, "queues.count"), os.O_RDWR | os.O_CREAT, 0o600)

    def admit(self, mine: int, limit: int) -> bool:
        """True (one more reserved in this worker's slot) when the box holds fewer than
        ``limit`` queues, this worker's ``mine`` among them."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            total = self._write_and_sum(mine)
            if total >= limit:
                return False
            self._write(mine + 1)  # the queue is created right after, on this loop
            return True
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def publish(self, mine: int) -> int:
        """Write this worker's count; the box's total."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            return self._write_and_sum(mine)
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def _write_and_sum(self, mine: int) -> int:
        self._write(mine)
        raw = os.pread(self.fd, _SLOT.size * self.count, 0).ljust(_SLOT.size * self.count, b"\0")
        return sum(value for (value,) in _SLOT.iter_unpack(raw))

    def _write(self, mine: int) -> None:
        os.pwrite(self.fd, _SLOT.pack(mine), _SLOT.size * self.index)

    def close(self) -> None:
        os.close(self.fd)
