"""A tick's records too large to write on the event loop: written by a worker thread.

Appending a few KiB to the page cache takes microseconds, so the writer journal writes a
tick's records itself.  An 8 MiB item is another matter: copying it into the page cache
takes milliseconds, and far longer when the kernel throttles a writer behind dirty pages
(tens of ms were seen here); on the loop, every connection of every queue would wait for
it.  A buffer of at least :data:`LARGE_WRITE_BYTES` is therefore handed to the executor
(``os.writev`` releases the GIL), and the loop goes on reading and answering.

The journal stays single-writer: while a large write is in flight the queue's later puts
are buffered, and written after it completes (a file in id order cannot take them before:
so that a queue's small puts are not always behind one large write or another, a large
write that kept puts waiting asks the next large put to wait as long, see ``pace_until``) (a rotation, a shutdown or a failed fsync
waits for it first).  Its puts are acknowledged as any tick's are - after the write,
or after the fsync that covers it - and a crash in the middle leaves a torn last record,
which recovery cuts.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, Future

from kestreld.journal.batch import Batch
from kestreld.journal.segment import Segment

#: A tick's buffered records of at least this size are written off the event loop.
LARGE_WRITE_BYTES = 512 * 1024


class LargeWrite:
    """One buffer of records being written by a worker thread to one segment."""

    __slots__ = ("future", "segment", "end", "batch", "fd", "started")

    def __init__(self, future: Future, segment: Segment, end: int, batch: Batch, fd: int) -> None:
        self.started = time.monotonic()
        self.future = future
        self.segment = segment
        self.end = end  # the segment's size once this write is done
        self.batch = batch  # its puts: acknowledged once written (and synced)
        self.fd = fd

    def wait(self) -> BaseException | None:
        """Block until the write is done; its error, if it failed."""
        try:
            self.future.result()
        except BaseException as e:  # noqa: BLE001 - handed to the writer, which fails the batch
            return e
        return None


def start(executor: Executor, fd: int, chunks: list[bytes], size: int) -> Future:
    """Write ``chunks`` (``size`` bytes) to ``fd`` on a worker thread."""
    return executor.submit(_write_all, fd, chunks, size)


def _write_all(fd: int, chunks: list[bytes], size: int) -> None:
    """``writev`` until every chunk is written (the GIL released meanwhile)."""
    done = 0
    while chunks:
        n = os.writev(fd, chunks[:_IOV_MAX])
        done += n
        if done >= size:
            return
        # A short write: drop what was written, go on from where it stopped.
        rest: list[bytes | memoryview] = []
        for chunk in chunks:
            if n >= len(chunk):
                n -= len(chunk)
                continue
            rest.append(memoryview(chunk)[n:] if n else chunk)
            n = 0
        chunks = rest  # type: ignore[assignment]


_IOV_MAX = 1024  # IOV_MAX on Linux: more chunks take more writev calls
