"""A writer segment, and reading acknowledged items back from segments (read-behind).

:class:`Segment` is one writer file (what the writer journal appends to and
what readers read back).  A reader whose items do not fit in memory keeps a
read-behind cursor (``kestreld.journal.journal_reader``) and refills memory
through the queue's :class:`SegmentReader`, which keeps the read-only
descriptors of the few segments read last (an LRU): a queue holds a bounded
number of descriptors however many segments a lagging reader walks through.
"""

from __future__ import annotations

import os
from collections import OrderedDict

from kestreld.journal import codec


class Segment:
    """One writer file.  ``first_id`` is 0 while the segment holds no put."""

    __slots__ = (
        "stamp",
        "path",
        "first_id",
        "last_id",
        "size",
        "written",
        "visible",
        "items",
        "data_bytes",
    )

    def __init__(
        self,
        stamp: int,
        path: str,
        first_id: int = 0,
        last_id: int = 0,
        size: int = codec.MAGIC_SIZE,
        written: int = codec.MAGIC_SIZE,
        visible: int = codec.MAGIC_SIZE,
        items: int = 0,
        data_bytes: int = 0,
    ) -> None:
        self.stamp = stamp
        self.path = path
        self.first_id = first_id
        self.last_id = last_id
        self.size = size  # logical size, including bytes still in the buffer
        self.written = written  # bytes handed to the OS
        # Bytes of successfully acknowledged batches: what readers may read.
        self.visible = visible
        self.items = items
        self.data_bytes = data_bytes

    # The writer journal changes a segment only through these verbs.

    def appended(self, id_: int, length: int, size: int) -> None:
        """A put of ``id_`` (``length`` bytes of record, ``size`` of data) is buffered."""
        self.size += length
        self.items += 1
        self.data_bytes += size
        if not self.first_id:
            self.first_id = id_
        self.last_id = id_

    def wrote(self) -> None:
        """Every buffered byte went to the OS."""
        self.written = self.size

    def wrote_to(self, end: int) -> None:
        """The bytes up to ``end`` went to the OS (a large write; later puts still buffered)."""
        self.written = end

    def unbuffered(self) -> None:
        """The buffered puts were never written (a failed write, a closed journal)."""
        self.size = self.written

    def cut_to(self, end: int) -> None:
        """The file was truncated to ``end`` bytes."""
        self.size = self.written = end

    def acknowledged(self, end: int) -> None:
        """Bytes up to ``end`` are safe: readers may read them."""
        if end > self.visible:
            self.visible = end

    def opened(self, size: int) -> None:
        """An existing file of ``size`` bytes: all written, all readable."""
        self.size = self.written = self.visible = size

    def starts_at(self, first_id: int) -> None:
        """Its first put's id (0: none), read from its head."""
        self.first_id = first_id

    def holds(self, first_id: int, last_id: int, items: int, data_bytes: int) -> None:
        """What recovery learned the file holds: ids ``first_id``..``last_id``."""
        self.first_id = first_id
        self.last_id = last_id
        self.items = items
        self.data_bytes = data_bytes

    def restarted(self) -> None:
        """The file was created again, empty (its header only)."""
        self.opened(codec.MAGIC_SIZE)
        self.holds(0, 0, 0, 0)


#: Read descriptors a queue keeps open (readers at different positions share them).
MAX_OPEN_SEGMENTS = 4


class SegmentReader:
    """pread()s of whole records from segments; the last few descriptors stay open."""

    def __init__(self, max_open: int = MAX_OPEN_SEGMENTS) -> None:
        self._fds: OrderedDict[str, int] = OrderedDict()
        self.max_open = max_open

    def open_count(self) -> int:
        return len(self._fds)

    def read(
        self, seg: Segment, offset: int, max_bytes: int
    ) -> tuple[list[codec.Put], int, str | None]:
        """Complete PUTs from ``seg`` at ``offset``, about ``max_bytes`` worth.

        Returns (puts with file offsets, next offset, problem).  Only acknowledged
        puts are read (``seg.visible``): a put whose batch is pending or failed is
        not, so readers never see an item its producer was not told is stored.
        """
        end = seg.visible
        if offset >= end:
            return [], offset, None
        fds = self._fds
        fd = fds.get(seg.path)
        if fd is None:
            while len(fds) >= self.max_open:
                _close(fds.popitem(last=False)[1])
            fd = os.open(seg.path, os.O_RDONLY)
            fds[seg.path] = fd
        else:
            fds.move_to_end(seg.path)
        want = max(64 * 1024, max_bytes)
        while True:
            n = min(want, end - offset)
            data = os.pread(fd, n, offset)
            res = codec.scan(data, 0)
            puts = [r for r in res.records if isinstance(r, codec.Put)]
            for p in puts:
                p.offset += offset  # file offsets
            if res.status == codec.Status.CORRUPT:
                return (
                    puts,
                    offset + res.pos,
                    f"corrupt record at offset {offset + res.pos}: {res.problem}",
                )
            if res.status == codec.Status.END:
                return puts, end, None
            if res.records or len(data) < n:
                if not res.records and len(data) < n:
                    return [], offset, f"short read at offset {offset}"
                return puts, offset + res.pos, None
            if n >= end - offset:
                # Not even one whole record up to the written end.
                return [], offset, f"torn record at offset {offset}"
            # One large record (its header says how long): a put's data is read alone,
            # straight into the item's bytes, one copy on the event loop (its whole record
            # read and its data sliced out were two: 16 MiB for an 8 MiB item).
            length = _record_length(data)
            if offset + length <= end:
                large = _large_put(fd, data, offset, length)
                if large is not None:
                    return large
            want = max(want * 4, length)

    def release(self, seg: Segment) -> None:
        fd = self._fds.pop(seg.path, None)
        if fd is not None:
            _close(fd)

    def close(self) -> None:
        for fd in self._fds.values():
            _close(fd)
        self._fds.clear()


def _large_put(
    fd: int, head: bytes, offset: int, length: int
) -> tuple[list[codec.Put], int, str | None] | None:
    """The PUT of ``length`` bytes at ``offset`` whose header begins ``head``, its data read
    alone (see :meth:`SegmentReader.read`); None when the record is not a PUT."""
    res = codec.scan(head, 0, length, include_data=False, limit=1)
    if res.status == codec.Status.CORRUPT:
        return [], offset, f"corrupt record at offset {offset}: {res.problem}"
    put = res.records[0] if res.records else None
    if not isinstance(put, codec.Put):
        return None
    data = os.pread(fd, put.size, offset + length - put.size)
    if len(data) < put.size:
        return [], offset, f"short read at offset {offset}"
    put.data = data
    put.offset += offset
    return [put], offset + length, None


def _record_length(data: bytes) -> int:
    """The length of the record ``data`` begins with, header and data; 0 if not yet known."""
    if len(data) < 5 or data[0] >> 4 < codec.Command.PUT:
        return 0
    return 1 + 4 * (data[0] & 0x0F) + max(0, int.from_bytes(data[1:5], "little", signed=True))


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
