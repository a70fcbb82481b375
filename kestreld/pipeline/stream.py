"""The streaming side of ``kestrel_journal``: tailing a live queue folder.

An offset is, per queue, the writer segment and the byte position just past
the last record already offered::

    {"queues": {"jobs": {"segment": "jobs.1700000000000", "offset": 81920}}}

Everything in older segments and before ``offset`` in ``segment`` has been
offered.  A micro-batch reads the older segments in its range to their end and
the end segment up to the last *complete* record found when the batch was
planned: a record being written is never offered half.  A newer segment holding
only its header is a spare, not yet written to (kestreld/journal/spare.py): the
offset stays before it.  Segments that moved to ``archivePath`` are read from
there.  Reading never changes the folder: nothing is consumed.

Usually only the newest segment grows, but not always: while a worker thread
writes a large item (kestreld/journal/large_write.py), later puts *overtake* it
into the next segment, so for a while segment S ends in a partial record and
S+1 already holds complete ones.  The offset therefore never passes a segment
whose tail is *pending*; it stops at that segment's last complete record, and a
later batch reads the large item and then S+1, in journal order.  A tail is
pending when all of these hold:

- the segment is one of the newest two holding records (a write can be in
  flight only there: the server waits for it before rotating again);
- a record is still to come: the bytes after its last complete record are the
  start of a record (not a record that can never be valid: that is damage, a
  ``PROBLEM`` row, and on), or the newer segment's first PUT id is not the next
  after this one's last (the worker thread has not written a byte yet);
- the file was modified less than :data:`TORN_AFTER_SECONDS` ago.

Otherwise the tail is torn for good (a crash in the middle of the write, which
the server's start-up cuts when it runs again) and the stream goes on: the
segment is read to its end (a torn record is a ``PROBLEM`` row).  A crash thus
holds a stream at most :data:`TORN_AFTER_SECONDS` after the segment last changed.

Offsets are deterministic functions of the files, so a query restarted from
its Spark checkpoint re-reads exactly the batch it had not committed, as long
as the segments still exist (set ``archive_path`` on the server, or keep
segments until the stream has read them).  Reader checkpoints are not
streamed (they are rewritten, not appended); read them with a batch query.
"""

from __future__ import annotations

import mmap
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition

from kestreld.journal import codec
from kestreld.journal.files import scan_folder
from kestreld.pipeline.columnar import read_segment
from kestreld.pipeline.listing import FileKind, JournalFile
from kestreld.pipeline.options import option, option_bool, option_paths

try:  # PySpark >= 4.1
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark 4.0

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


if TYPE_CHECKING:
    import pyarrow as pa

Offset = dict[str, Any]

#: A partial record at the end of one of the newest two segments, left unchanged this long,
#: is a crash's torn write, not a large write in flight (which changes the file as it goes).
TORN_AFTER_SECONDS = 60.0


@dataclass
class SegmentRange(InputPartition):
    """Bytes ``[start, end)`` of one segment; ``end`` None = to the end of the file."""

    file: JournalFile
    start: int
    end: int | None

    def __post_init__(self) -> None:
        InputPartition.__init__(self, None)


@dataclass(slots=True)
class SegmentTail:
    """Where a segment's complete records end, and what follows them."""

    end: int  # just past the last complete record
    size: int  # the file's size when scanned
    partial: bool  # the bytes from ``end`` are the start of a record (not damage)
    modified: float  # the file's mtime, seconds since the epoch
    first_id: int | None  # of its first PUT
    last_id: int | None  # of its last complete PUT


def _stamp(name: str) -> int:
    return int(name.rpartition(".")[2])


class KestrelJournalStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of the PUT records appended to a queue folder's segments."""

    def __init__(self, options: Mapping[str, str]) -> None:
        paths = option_paths(options)
        if len(paths) != 1 or not os.path.isdir(paths[0]):
            raise ValueError("kestrel_journal streaming: load() one queue folder")
        self.folder = paths[0]
        self.archive_path = option(options, "archivePath") or None
        self.include_data = option_bool(options, "includeData", True)
        self.starting = (option(options, "startingOffsets") or "earliest").lower()
        if self.starting not in ("earliest", "latest"):
            raise ValueError("startingOffsets must be 'earliest' or 'latest'")
        # segment name -> what its last scan found: its end is a record boundary (content
        # before it never changes), so each trigger scans only the new bytes
        self._scanned: dict[str, SegmentTail] = {}
        self._available_now: Offset | None = None
        self._last: Offset | None = None

    # --- listing ----------------------------------------------------------------------

    def _segments(self) -> dict[str, list[JournalFile]]:
        """Queue -> its segments (live and archived), oldest first."""
        found: dict[str, dict[str, JournalFile]] = {}
        folders = [self.folder] + ([self.archive_path] if self.archive_path else [])
        for folder in folders:
            for queue, files in scan_folder(folder).queues.items():
                for stamp, _path in files.segments:
                    name = os.path.basename(_path)
                    if name not in found.setdefault(queue, {}):
                        found[queue][name] = self._file(queue, name, stamp)
        return {q: sorted(segs.values(), key=lambda jf: jf.stamp) for q, segs in found.items()}

    def _file(self, queue: str, name: str, stamp: int) -> JournalFile:
        paths = [os.path.join(self.folder, name)]
        if self.archive_path:
            paths.append(os.path.join(self.archive_path, name))
        return JournalFile(FileKind.SEGMENT, name, queue, None, paths, 0, stamp)

    def _tail(self, jf: JournalFile) -> SegmentTail:
        """Where the complete records of a segment end, and its first and last PUT ids."""
        known = self._scanned.get(jf.name)
        pos = known.end if known else 0
        first_id = known.first_id if known else None
        last_id = known.last_id if known else None
        for path in jf.paths:
            try:
                f = open(path, "rb")  # noqa: SIM115
            except FileNotFoundError:
                continue
            with f:
                st = os.fstat(f.fileno())
                size = st.st_size
                if size < codec.MAGIC_SIZE:
                    return SegmentTail(pos, size, False, st.st_mtime, first_id, last_id)
                status = codec.Status.END
                with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    if pos < codec.MAGIC_SIZE:
                        if mm[: codec.MAGIC_SIZE] != codec.WRITER_MAGIC:
                            return SegmentTail(0, size, False, st.st_mtime, None, None)
                        pos = codec.MAGIC_SIZE
                    while True:
                        res = codec.scan(mm, pos, size, include_data=False, limit=65536)
                        pos, status = res.pos, res.status
                        for rec in res.records:
                            if isinstance(rec, codec.Put):
                                first_id = rec.id if first_id is None else first_id
                                last_id = rec.id
                        if res.status != codec.Status.MORE or len(res.records) < 65536:
                            break
            tail = SegmentTail(
                pos,
                size,
                status == codec.Status.MORE and pos < size,
                st.st_mtime,
                first_id,
                last_id,
            )
            self._scanned[jf.name] = tail
            return tail
        return SegmentTail(pos, pos, False, 0.0, first_id, last_id)

    def _latest(self, start: Offset) -> Offset:
        queues = dict(start.get("queues", {}))
        now = time.time()
        for queue, segments in self._segments().items():
            end = self._queue_end(segments, queues.get(queue), now)
            if end is not None:
                queues[queue] = end
        return {"queues": dict(sorted(queues.items()))}

    def _queue_end(
        self, segments: list[JournalFile], seen: Offset | None, now: float
    ) -> Offset | None:
        """The offset past a queue's complete records (None: keep ``seen``)."""
        seen_stamp = _stamp(seen["segment"]) if seen else -1
        # (segment, its tail) of the newest two holding records, newest first: one holding
        # only its header may be the server's spare, made before the segment being written
        # is finished (kestreld/journal/spare.py); an offset in it would skip what that one
        # gets.  The first segment stands even when empty.
        written: list[tuple[JournalFile, SegmentTail]] = []
        for jf in reversed(segments):
            if jf.stamp < seen_stamp or len(written) == 2:
                break
            tail = self._tail(jf)
            if tail.end > codec.MAGIC_SIZE or jf is segments[0]:
                written.append((jf, tail))
        if not written:
            # The folder lost segments we already read (or holds none newer): keep our place.
            return None
        if len(written) == 2:
            older, tail = written[1]
            newer = written[0][1]
            missing = (
                tail.last_id is not None
                and newer.first_id is not None
                and newer.first_id > tail.last_id + 1
            )
            if (tail.partial or missing) and now - tail.modified < TORN_AFTER_SECONDS:
                # A large write in flight, overtaken by the newer segment's puts (see the
                # module docstring): wait for it here rather than pass it for good.
                return {"segment": older.name, "offset": tail.end}
        newest, tail = written[0]
        return {"segment": newest.name, "offset": tail.end}

    # --- the DataSourceStreamReader interface ------------------------------------------

    def initialOffset(self) -> Offset:
        if self.starting == "latest":
            return self._latest({"queues": {}})
        return {"queues": {}}

    def latestOffset(self, start: Offset | None = None, limit: object = None) -> Offset:
        """All complete records available now (read limits are not supported)."""
        if start is None:  # PySpark < 4.2 calls latestOffset() without arguments
            start = self._last or self.initialOffset()
        if self._available_now is not None:
            # Stop at what was there when the trigger started; keep queues it did not see.
            queues = {**start.get("queues", {}), **self._available_now["queues"]}
            end = {"queues": dict(sorted(queues.items()))}
        else:
            end = self._latest(start)
        self._last = end
        return end

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: stop at what is in the folder now."""
        self._available_now = self._latest({"queues": {}})

    def partitions(self, start: Offset, end: Offset) -> list[InputPartition]:
        begun = start.get("queues", {})
        parts: list[InputPartition] = []
        listed = self._segments()
        for queue, stop in end.get("queues", {}).items():
            since = begun.get(queue)
            if since == stop:
                continue
            first = _stamp(since["segment"]) if since else -1
            last = _stamp(stop["segment"])
            by_name = {jf.name: jf for jf in listed.get(queue, [])}
            # The end segment is named by the offset even if it was listed nowhere now
            # (moved or deleted since): reading it then reports the problem.
            if stop["segment"] not in by_name:
                by_name[stop["segment"]] = self._file(queue, stop["segment"], last)
            for jf in sorted(by_name.values(), key=lambda f: f.stamp):
                if not first <= jf.stamp <= last:
                    continue
                lo = since["offset"] if since and jf.name == since["segment"] else 0
                hi = stop["offset"] if jf.name == stop["segment"] else None
                if hi is not None and hi <= max(lo, codec.MAGIC_SIZE):
                    continue
                parts.append(SegmentRange(jf, lo, hi))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentRange)
        yield from read_segment(
            partition.file,
            include_data=self.include_data,
            start=partition.start,
            end=partition.end,
            tail_is_problem=partition.end is None,
        )

    def commit(self, end: Offset) -> None:
        # Forget boundaries of segments the stream has passed.
        keep = {q["segment"] for q in end.get("queues", {}).values()}
        for name in list(self._scanned):
            if name not in keep:
                del self._scanned[name]
