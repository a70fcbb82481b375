"""A tick's records too large to write on the event loop: written by a worker thread.

Appending a few KiB to the page cache takes microseconds, so the writer journal writes a
tick's records itself.  An 8 MiB item is another matter: copying it into the page cache
takes milliseconds, and far longer when the kernel throttles a writer behind dirty pages
(tens of ms were seen here); on the loop, every connection of every queue would wait for
it.  A buffer of at least :data:`LARGE_WRITE_BYTES` is therefore handed to the executor
(``os.writev`` releases the GIL), and the loop goes on reading and answering.

The journal stays single-writer per file and in id order: while a large write is in flight
the queue's later puts start the next segment, written on the loop and acknowledged at once
(their batch is *stored*: replies may go), but their batch resolves - its items reach the
readers - only after the large one, so items keep journal order, and a read-behind waits at
the segment being written (``WriterJournal.holding``).  At most one large batch is unresolved
at a time, so a write can be in flight only in the newest two segments; start-up scans both
and cuts a torn last record (a crash in the middle of the large write).  A rotation of the
next segment, a shutdown or a failed fsync waits for the write first.  Behind a write of
less than :data:`OVERTAKE_BYTES` later puts wait in the buffer instead.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import Executor, Future

from kestreld.journal.batch import Batch
from kestreld.journal.segment import Segment

#: A tick's buffered records of at least this size are written off the event loop.
LARGE_WRITE_BYTES = 512 * 1024

#: While a write of at least this size is in flight, later puts start the next segment; behind
#: a smaller one (a burst of small puts adding up, written in well under a millisecond) they
#: wait, so that busy ticks do not each leave a segment of their own.
OVERTAKE_BYTES = 2 * 1024 * 1024


class LargeWrite:
    """One buffer of records being written by a worker thread to one segment."""

    __slots__ = ("future", "segment", "end", "batch", "fd", "started", "retire", "overtaken")

    def __init__(
        self, future: Future, segment: Segment, end: int, batch: Batch, fd: int, size: int
    ) -> None:
        self.started = time.monotonic()
        self.future = future
        self.segment = segment
        self.end = end  # the segment's size once this write is done
        self.batch = batch  # its puts: acknowledged once written (and synced)
        self.fd = fd
        #: The writer moved on to a new segment meanwhile: ``fd`` is retired once written.
        self.retire = False
        #: Puts that come meanwhile go to the next segment (see OVERTAKE_BYTES).
        self.overtaken = size >= OVERTAKE_BYTES

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
