"""Journal files as Arrow record batches (the data source's read path).

Native records are decoded by :func:`kestreld.journal.codec.scan` and 2.x
operations by :func:`kestreld.journal.kestrel2.scan_kestrel2`; this module
only turns their results into columns.  Item data is gathered straight from
the memory-mapped file (the codec gives each record's offset and size), so
payload bytes are copied once, into the Arrow buffer.

Damage never raises: the records before it are returned, then one
``PROBLEM`` row saying where and why decoding stopped.
"""

from __future__ import annotations

import mmap
import os
from array import array
from collections.abc import Iterator
from itertools import accumulate
from operator import attrgetter
from typing import TYPE_CHECKING

from kestreld.journal import codec
from kestreld.pipeline.listing import FileKind, JournalFile
from kestreld.pipeline.schema import OP_PROBLEM, OP_PUT, OP_READ_DONE, OP_READ_HEAD, arrow_schema

if TYPE_CHECKING:
    import pyarrow as pa

    from kestreld.journal.kestrel2 import Kestrel2Op

#: Records per scan call (and at most per batch).
CHUNK_RECORDS = 32768
#: Payload bytes per batch at most (a batch holds at least one item, up to 16 MiB).
CHUNK_DATA_BYTES = 32 << 20

_offset = attrgetter("offset")
_id = attrgetter("id")
_add_time = attrgetter("add_time")
_expire_time = attrgetter("expire_time")
_error_count = attrgetter("error_count")
_size = attrgetter("size")


#: The instants a TIMESTAMP column holds: years 1 to 9999, Spark's range, in ms since the
#: epoch.  A journal time outside it (Kestrel 2.x journals hold any 64-bit number) is not
#: mapped to some other instant: the column is null and a PROBLEM row names the value.
MIN_TIME_MS = -62_135_596_800_000  # 0001-01-01T00:00:00Z
MAX_TIME_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z


def _misplaced(
    offsets: list[int], add_times: list[int | None], expire_times: list[int | None]
) -> tuple[list[int | None], list[int | None], list[tuple[int, str]]]:
    """Times a TIMESTAMP cannot hold (and negative expiries) replaced by None, and a
    ``(offset, message)`` for each; the lists are returned as they are when all fit."""
    adds = [t for t in add_times if t is not None]
    expires = [t for t in expire_times if t is not None]
    if (not adds or MIN_TIME_MS <= min(adds) and max(adds) <= MAX_TIME_MS) and (
        not expires or min(expires) >= 0 and max(expires) <= MAX_TIME_MS
    ):
        return add_times, expire_times, []  # the usual case: one pass of min and max
    problems = []
    add_times, expire_times = list(add_times), list(expire_times)
    for i, offset in enumerate(offsets):
        add, expire = add_times[i], expire_times[i]
        if add is not None and not MIN_TIME_MS <= add <= MAX_TIME_MS:
            add_times[i] = None
            problems.append(
                (offset, f"add time {add} ms is outside years 1-9999; add_time left null")
            )
        if expire is not None and expire < 0:
            expire_times[i] = None
            problems.append((offset, f"negative expiry {expire} ms; expire_time left null"))
        elif expire is not None and expire > MAX_TIME_MS:
            expire_times[i] = None
            problems.append(
                (offset, f"expiry {expire} ms is outside years 1-9999; expire_time left null")
            )
    return add_times, expire_times, problems


def _ts_from_ms(values: list[int | None], zero_is_null: bool) -> pa.Array:
    import pyarrow as pa
    import pyarrow.compute as pc

    ms = pa.array(values, pa.int64())
    us = pc.multiply(ms, 1000)
    if zero_is_null:
        us = pc.if_else(pc.equal(ms, 0), pa.scalar(None, pa.int64()), us)
    return us.view(pa.timestamp("us", tz="UTC"))


def _constant(value: str | None, n: int) -> pa.Array:
    import pyarrow as pa

    if value is None:
        return pa.nulls(n, pa.string())
    return pa.repeat(pa.scalar(value, pa.string()), n)


def problem_batch(
    queue: str, reader: str | None, name: str, offset: int, message: str
) -> pa.RecordBatch:
    """One ``PROBLEM`` row: ``offset`` is where the damage starts, ``data`` the message."""
    import pyarrow as pa

    return pa.RecordBatch.from_pylist(
        [
            {
                "queue": queue,
                "reader": reader,
                "segment": name,
                "offset": offset,
                "op": OP_PROBLEM,
                "data": message.encode(),
            }
        ],
        schema=arrow_schema(),
    )


def _byte_bounded(sizes: list[int], cap: int = CHUNK_DATA_BYTES) -> Iterator[tuple[int, int]]:
    """Index ranges of ``sizes`` holding at most ``cap`` bytes each (at least one item)."""
    lo, total = 0, 0
    for i, size in enumerate(sizes):
        if total and total + size > cap:
            yield lo, i
            lo, total = i, 0
        total += size
    if lo < len(sizes):
        yield lo, len(sizes)


def _binary_column(view: memoryview, starts: list[int], sizes: list[int]) -> pa.Array:
    """One Arrow binary array of ``view[start:start + size]`` slices (one copy)."""
    import pyarrow as pa

    values = b"".join([view[s : s + n] for s, n in zip(starts, sizes, strict=True)])
    offsets = array("i", accumulate(sizes, initial=0))
    return pa.Array.from_buffers(
        pa.binary(), len(sizes), [None, pa.py_buffer(offsets), pa.py_buffer(values)]
    )


def _puts_batches(
    jf: JournalFile,
    puts: list[codec.Put],
    ends: list[int] | None,
    view: memoryview | None,
) -> Iterator[pa.RecordBatch]:
    """Columns of PUT rows, then a PROBLEM row for each time no TIMESTAMP can hold;
    ``ends[i]`` is where record i stops (its data's end)."""
    import pyarrow as pa

    n = len(puts)
    sizes = list(map(_size, puts))
    offsets = list(map(_offset, puts))
    add_times, expire_times, problems = _misplaced(
        offsets, list(map(_add_time, puts)), list(map(_expire_time, puts))
    )
    if view is not None and ends is not None:
        # The data block is the last `size` bytes of each record.
        data = _binary_column(view, [e - s for e, s in zip(ends, sizes, strict=True)], sizes)
    else:
        data = pa.nulls(n, pa.binary())
    columns = [
        _constant(jf.queue, n),
        _constant(jf.reader, n),
        _constant(jf.name, n),
        pa.array(offsets, pa.int64()),
        _constant(OP_PUT, n),
        pa.array(list(map(_id, puts)), pa.int64()),
        _ts_from_ms(add_times, zero_is_null=False),
        _ts_from_ms(expire_times, zero_is_null=True),
        pa.array(list(map(_error_count, puts)), pa.int32()),
        pa.array(sizes, pa.int32()),
        data,
    ]
    yield pa.RecordBatch.from_arrays(columns, schema=arrow_schema())
    for offset, message in problems:
        yield problem_batch(jf.queue, jf.reader, jf.name, offset, message)


def _open(jf: JournalFile):  # noqa: ANN202 - a file object
    """The first of the file's paths that still exists (a segment may move to the archive)."""
    last: OSError | None = None
    for path in jf.paths:
        try:
            return open(path, "rb")  # noqa: SIM115 - closed by the caller
        except FileNotFoundError as e:
            last = e
    raise last or FileNotFoundError(jf.name)


def read_segment(
    jf: JournalFile,
    *,
    include_data: bool,
    start: int = 0,
    end: int | None = None,
    tail_is_problem: bool = True,
) -> Iterator[pa.RecordBatch]:
    """PUT rows of a writer segment between byte offsets ``start`` and ``end``.

    ``start`` 0 means the whole file (the magic is checked).  ``end`` None
    means the current end of the file.  A torn last record is a problem when
    ``tail_is_problem`` (a closed file) and silently left for later otherwise
    (a segment still being written).
    """
    try:
        f = _open(jf)
    except OSError as e:
        yield problem_batch(jf.queue, jf.reader, jf.name, start, f"cannot read: {e.strerror or e}")
        return
    with f:
        size = os.fstat(f.fileno()).st_size
        stop = size if end is None else min(end, size)
        if end is not None and size < end:
            yield problem_batch(
                jf.queue, jf.reader, jf.name, size, f"file shrank to {size} bytes (expected {end})"
            )
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from _scan_segment(jf, mm, start, stop, include_data, tail_is_problem)


def _scan_segment(
    jf: JournalFile,
    mm: mmap.mmap,
    start: int,
    stop: int,
    include_data: bool,
    tail_is_problem: bool,
) -> Iterator[pa.RecordBatch]:
    pos = start
    if pos < codec.MAGIC_SIZE:
        magic = mm[: min(codec.MAGIC_SIZE, stop)]
        if magic != codec.WRITER_MAGIC:
            if len(magic) < codec.MAGIC_SIZE and codec.WRITER_MAGIC.startswith(magic):
                if tail_is_problem:
                    yield problem_batch(jf.queue, jf.reader, jf.name, 0, "truncated file header")
            else:
                yield problem_batch(
                    jf.queue, jf.reader, jf.name, 0, "not a writer segment (bad magic)"
                )
            return
        pos = codec.MAGIC_SIZE
    view = memoryview(mm) if include_data else None
    limit = CHUNK_RECORDS
    try:
        while True:
            res = codec.scan(mm, pos, stop, include_data=False, limit=limit)
            records = res.records
            hit_limit = len(records) >= limit
            if records:
                ends = [r.offset for r in records[1:]]
                ends.append(res.pos)
                puts: list[codec.Put] = []
                put_ends: list[int] = []
                for rec, rec_end in zip(records, ends, strict=True):
                    if type(rec) is codec.Put:
                        puts.append(rec)
                        put_ends.append(rec_end)
                if view is None:
                    if puts:
                        yield from _puts_batches(jf, puts, None, None)
                else:
                    for lo, hi in _byte_bounded([p.size for p in puts]):
                        yield from _puts_batches(jf, puts[lo:hi], put_ends[lo:hi], view)
            pos = res.pos
            if res.status == codec.Status.MORE and hit_limit and pos < stop:
                continue
            break
    finally:
        if view is not None:
            view.release()
    problem = None
    if res.status == codec.Status.CORRUPT:
        problem = f"corrupt record at offset {pos}: {res.problem}"
    elif res.status == codec.Status.MORE and pos < stop:
        if tail_is_problem:
            problem = f"truncated record at offset {pos} ({stop - pos} bytes cut)"
    elif res.status == codec.Status.END and mm[pos:stop].count(0) != stop - pos:
        problem = f"data after the end marker at offset {pos}"
    if problem:
        yield problem_batch(jf.queue, jf.reader, jf.name, pos, problem)


def read_checkpoint(jf: JournalFile) -> Iterator[pa.RecordBatch]:
    """READ_HEAD and READ_DONE rows (one per confirmed id) of a reader checkpoint."""
    import pyarrow as pa

    try:
        with _open(jf) as f:
            raw = f.read()
    except OSError as e:
        yield problem_batch(jf.queue, jf.reader, jf.name, 0, f"cannot read: {e.strerror or e}")
        return
    decoded = codec.decode_file(raw, include_data=False)
    rows: list[dict[str, object]] = []
    base = {"queue": jf.queue, "reader": jf.reader, "segment": jf.name}
    if decoded.kind is codec.FileKind.READER:
        for rec in decoded.records:
            if isinstance(rec, codec.ReadHead):
                rows.append({**base, "offset": rec.offset, "op": OP_READ_HEAD, "id": rec.id})
            elif isinstance(rec, codec.ReadDone):
                rows.extend(
                    {**base, "offset": rec.offset, "op": OP_READ_DONE, "id": i} for i in rec.ids
                )
    problem = decoded.problem
    if decoded.kind is codec.FileKind.WRITER:
        problem = "a writer segment named like a checkpoint"
    if rows:
        yield pa.RecordBatch.from_pylist(rows, schema=arrow_schema())
    if problem:
        offset = decoded.valid_end if decoded.kind is codec.FileKind.READER else 0
        yield problem_batch(jf.queue, jf.reader, jf.name, offset, problem)


def read_kestrel2(
    jf: JournalFile, *, include_data: bool, kestrel_2_0: bool = False
) -> Iterator[pa.RecordBatch]:
    """One row per operation of a Kestrel 2.x journal file (decoded by ``kestrel2``)."""
    from kestreld.journal.kestrel2 import scan_kestrel2

    try:
        f = _open(jf)
    except OSError as e:
        yield problem_batch(jf.queue, jf.reader, jf.name, 0, f"cannot read: {e.strerror or e}")
        return
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm) if include_data else None
            try:
                pos = 0
                while True:
                    # Payloads are gathered from the map, not copied op by op.
                    ops, stop, problem = scan_kestrel2(
                        mm, pos, kestrel_2_0=kestrel_2_0, include_data=False, limit=8192
                    )
                    for lo, hi in _byte_bounded([op.size or 0 for op in ops]):
                        yield from _kestrel2_batches(jf, ops[lo:hi], view)
                    if problem is not None:
                        yield problem_batch(jf.queue, jf.reader, jf.name, stop, problem)
                        return
                    if stop >= len(mm):
                        return
                    pos = stop
            finally:
                if view is not None:
                    view.release()


def _kestrel2_batches(
    jf: JournalFile, ops: list[Kestrel2Op], view: memoryview | None
) -> Iterator[pa.RecordBatch]:
    """Columns of 2.x operations, then a PROBLEM row for each time no TIMESTAMP can hold."""
    import pyarrow as pa

    n = len(ops)
    offsets = [op.offset for op in ops]
    add_times, expire_times, problems = _misplaced(
        offsets, [op.add_time for op in ops], [op.expire_time for op in ops]
    )
    ts = pa.timestamp("us", tz="UTC")
    if view is None:
        data = pa.nulls(n, pa.binary())
    else:
        items = [i for i, op in enumerate(ops) if op.size is not None]
        gathered = _binary_column(
            view, [ops[i].data_offset for i in items], [ops[i].size for i in items]
        )
        if len(items) == n:
            data = gathered
        else:  # ops without an item (REMOVE, ...) get a null
            where = {i: k for k, i in enumerate(items)}
            data = gathered.take(pa.array([where.get(i) for i in range(n)], pa.int64()))
    yield pa.RecordBatch.from_arrays(
        [
            _constant(jf.queue, n),
            _constant(jf.reader, n),
            _constant(jf.name, n),
            pa.array(offsets, pa.int64()),
            pa.array([op.name for op in ops], pa.string()),
            pa.array([op.xid for op in ops], pa.int64()),
            pa.array([None if t is None else t * 1000 for t in add_times], pa.int64()).view(ts),
            pa.array([None if t is None else t * 1000 for t in expire_times], pa.int64()).view(ts),
            pa.nulls(n, pa.int32()),
            pa.array([op.size for op in ops], pa.int32()),
            data,
        ],
        schema=arrow_schema(),
    )
    for offset, message in problems:
        yield problem_batch(jf.queue, jf.reader, jf.name, offset, message)


def read_file(
    jf: JournalFile, *, include_data: bool, kestrel_2_0: bool = False
) -> Iterator[pa.RecordBatch]:
    """Every row of one listed file, whatever its kind."""
    if jf.kind is FileKind.SEGMENT:
        yield from read_segment(jf, include_data=include_data)
    elif jf.kind is FileKind.CHECKPOINT:
        yield from read_checkpoint(jf)
    else:
        yield from read_kestrel2(jf, include_data=include_data, kestrel_2_0=kestrel_2_0)
