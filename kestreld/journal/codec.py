"""The libkestrel record codec: the one encoder/decoder for every native journal file.

Writer segments and reader checkpoints share one low-level format: a 4-byte
magic, then records.  A record is a command byte ``(command << 4) | words``,
``words * 4`` bytes of little-endian header, and for commands 8-15 a data block
whose length is the first header word.  A zero command byte marks the end of
written data (a zero-filled tail is legal).

The server, ``kestreld journal dump`` and the Spark data source all decode
through :func:`scan`, so a file means the same thing to each of them.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

try:
    import cython
    from cython.cimports.cpython.bytes import PyBytes_AS_STRING, PyBytes_FromStringAndSize

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

WRITER_MAGIC = b"\x27\x64\x26\x03"
READER_MAGIC = b"\x26\x3c\x26\x03"
MAGIC_SIZE = 4

#: The largest data block a record may carry (libkestrel's limit).
MAX_DATA_SIZE = 16 * 1024 * 1024

_I32 = struct.Struct("<i")
_I64 = struct.Struct("<q")
_PUT6 = struct.Struct("<Biiqq")  # command byte, size, error_count, id, add_time
_PUT8 = struct.Struct("<Biiqqq")  # ... expire_time
_HEAD = struct.Struct("<Bq")
_DONE = struct.Struct("<Bi")
_DONE1 = struct.Struct("<Biq")  # READ_DONE of one id: a plain get's or a /close's confirm
# The encoders of every put and confirm, bound once (no method lookup per record).
_pack_put6 = _PUT6.pack
_pack_put8 = _PUT8.pack
_pack_done1 = _DONE1.pack

PUT_HEADER_SIZE = _PUT6.size  # 25 bytes before the data
PUT_EXPIRY_HEADER_SIZE = _PUT8.size  # 33 bytes before the data


class Command(IntEnum):
    READ_HEAD = 0
    PUT = 8
    READ_DONE = 9


class FileKind(IntEnum):
    WRITER = 1
    READER = 2


@dataclass(slots=True)
class Put:
    """An item added to the queue (writer segments only)."""

    offset: int
    id: int
    add_time: int  # ms since the epoch
    expire_time: int  # ms since the epoch, 0 = never
    error_count: int
    size: int
    data: bytes | None  # None when decoded with include_data=False

    @property
    def length(self) -> int:
        """Bytes the record takes in the file."""
        return (PUT_EXPIRY_HEADER_SIZE if self.expire_time else PUT_HEADER_SIZE) + self.size


@dataclass(slots=True)
class ReadHead:
    offset: int
    id: int


@dataclass(slots=True)
class ReadDone:
    offset: int
    ids: list[int]


@dataclass(slots=True)
class Unknown:
    """A record with a command this version does not know; skipped by readers."""

    offset: int
    command: int
    length: int


Record = Put | ReadHead | ReadDone | Unknown


class Status(IntEnum):
    """Why :func:`scan` stopped."""

    MORE = 0  # every complete record was returned; the rest (if any) is a partial record
    END = 1  # a zero command byte: end of written data
    CORRUPT = 2  # a record that can never be valid; see ScanResult.problem


@dataclass(slots=True)
class ScanResult:
    records: list[Record]
    pos: int  # where the next record starts (or where the damage/partial record starts)
    status: Status
    problem: str | None = None


# --- encoding -------------------------------------------------------------------------


def encode_put(
    id: int, add_time: int, data: bytes, expire_time: int = 0, error_count: int = 0
) -> bytes:
    """One PUT record; with expiry (8 words) only when expire_time is set."""
    if expire_time:
        return _PUT8.pack(0x88, len(data), error_count, id, add_time, expire_time) + data
    return _PUT6.pack(0x86, len(data), error_count, id, add_time) + data


def put_header(
    id: int, add_time: int, size: int, expire_time: int = 0, error_count: int = 0
) -> bytes:
    """The PUT header alone, for writers that append the data separately (no copy)."""
    if expire_time:
        return _pack_put8(0x88, size, error_count, id, add_time, expire_time)
    if COMPILED:
        return _put6_c(id, add_time, size, error_count)
    return _pack_put6(0x86, size, error_count, id, add_time)


# The compiled build's encoders of a put header and a one-id READ_DONE: the same bytes
# as the Structs above, stored field by field into a new bytes object (struct's
# argument parsing was most of a put's encoding cost).  The C types of their
# parameters refuse what the Structs refuse (OverflowError instead of struct.error);
# the size comes as the writer's C length and is checked against the field's range.


def _put6_c(id: int, add_time: int, size: int, error_count: int) -> bytes:
    if size < -0x80000000 or size > 0x7FFFFFFF:
        raise OverflowError(f"item size {size} does not fit a put header")
    out = PyBytes_FromStringAndSize(cython.NULL, 25)
    p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))
    p[0] = 0x86
    _store_le(p + 1, size, 4)
    _store_le(p + 5, error_count, 4)
    _store_le(p + 9, id, 8)
    _store_le(p + 17, add_time, 8)
    return out


def _done1_c(id: int) -> bytes:
    out = PyBytes_FromStringAndSize(cython.NULL, 13)
    p = cython.cast(cython.p_uchar, PyBytes_AS_STRING(out))
    p[0] = 0x91
    _store_le(p + 1, 8, 4)
    _store_le(p + 5, id, 8)
    return out


def _store_le(p: object, value: int, width: int) -> None:
    """``value`` (two's complement) into ``width`` bytes at ``p``, least significant first."""
    bits = cython.cast(cython.ulonglong, value)
    for i in range(width):
        p[i] = bits & 0xFF
        bits >>= 8


def encode_read_head(id: int) -> bytes:
    return _HEAD.pack(0x02, id)


def encode_read_done(ids: list[int] | tuple[int, ...]) -> bytes:
    """READ_DONE: the header word is the byte length of the id block (8 per id)."""
    n = len(ids)
    if n == 1:  # the usual tick at one connection: no format string built
        if COMPILED:
            return _done1_c(ids[0])
        return _pack_done1(0x91, 8, ids[0])
    return _DONE.pack(0x91, 8 * n) + struct.pack(f"<{n}q", *ids)


def encode_checkpoint(head: int, done: list[int] | tuple[int, ...] = ()) -> bytes:
    """A whole reader checkpoint file: magic, READ_HEAD, READ_DONE."""
    return READER_MAGIC + encode_read_head(head) + encode_read_done(sorted(done))


# --- decoding -------------------------------------------------------------------------


def file_kind(magic: bytes) -> FileKind | None:
    """Which native file this is, from its first four bytes; None if neither."""
    if magic == WRITER_MAGIC:
        return FileKind.WRITER
    if magic == READER_MAGIC:
        return FileKind.READER
    return None


def scan(
    buf: bytes | bytearray | memoryview,
    pos: int = 0,
    end: int | None = None,
    *,
    include_data: bool = True,
    limit: int | None = None,
) -> ScanResult:
    """Decode the complete records in ``buf[pos:end]``.

    Stops at the first partial record (``Status.MORE``: read more and call
    again from ``pos``), at a zero command byte (``Status.END``), at a record
    that can never be valid (``Status.CORRUPT``), or after ``limit`` records.
    Offsets in the records are positions in ``buf``; add the buffer's file
    offset to get file positions.  Never allocates more than the bytes present.
    """
    if end is None:
        end = len(buf)
    records: list[Record] = []
    append = records.append
    unpack_put6 = _PUT6.unpack_from
    unpack_put8 = _PUT8.unpack_from
    while pos < end:
        if limit is not None and len(records) >= limit:
            return ScanResult(records, pos, Status.MORE)
        cmd = buf[pos]
        if cmd == 0:
            return ScanResult(records, pos, Status.END)
        command = cmd >> 4
        words = cmd & 0x0F
        header_end = pos + 1 + 4 * words
        if header_end > end:
            return ScanResult(records, pos, Status.MORE)
        if command >= 8:
            if words < 1:
                return ScanResult(
                    records, pos, Status.CORRUPT, f"command {command} without a data length"
                )
            size = _I32.unpack_from(buf, pos + 1)[0]
            if size < 0 or size > MAX_DATA_SIZE:
                return ScanResult(
                    records, pos, Status.CORRUPT, f"item too large ({size & 0xFFFFFFFF} bytes)"
                )
            rec_end = header_end + size
            if rec_end > end:
                return ScanResult(records, pos, Status.MORE)
            if command == Command.PUT:
                if words == 6:
                    _, size, errors, id_, add_time = unpack_put6(buf, pos)
                    expire = 0
                elif words == 8:
                    _, size, errors, id_, add_time, expire = unpack_put8(buf, pos)
                else:
                    return ScanResult(
                        records, pos, Status.CORRUPT, f"PUT with {words} header words"
                    )
                if id_ <= 0:
                    return ScanResult(records, pos, Status.CORRUPT, f"PUT with id {id_}")
                data = bytes(buf[header_end:rec_end]) if include_data else None
                append(Put(pos, id_, add_time, expire, errors, size, data))
            elif command == Command.READ_DONE:
                if words != 1 or size % 8:
                    return ScanResult(records, pos, Status.CORRUPT, f"READ_DONE of {size} bytes")
                n = size // 8
                ids = list(struct.unpack_from(f"<{n}q", buf, header_end)) if n else []
                append(ReadDone(pos, ids))
            else:
                append(Unknown(pos, command, rec_end - pos))
            pos = rec_end
        else:
            if command == Command.READ_HEAD:
                if words != 2:
                    return ScanResult(
                        records, pos, Status.CORRUPT, f"READ_HEAD with {words} header words"
                    )
                append(ReadHead(pos, _I64.unpack_from(buf, pos + 1)[0]))
            else:
                append(Unknown(pos, command, header_end - pos))
            pos = header_end
    return ScanResult(records, pos, Status.MORE)


def first_put_id(buf: bytes | bytearray | memoryview, pos: int = MAGIC_SIZE) -> int | None:
    """The id of a PUT whose header starts at ``pos``, read from the header alone.

    None when ``buf`` does not start with a whole PUT header there.  Lets a
    writer learn a segment's first id without reading its data.
    """
    if len(buf) >= pos + _PUT6.size and buf[pos] in (0x86, 0x88):
        id_ = _I64.unpack_from(buf, pos + 9)[0]
        return id_ if id_ > 0 else None
    return None


@dataclass(slots=True)
class DecodedFile:
    """Everything readable in one native file."""

    kind: FileKind | None
    records: list[Record]
    valid_end: int  # file offset just past the last complete record
    size: int
    problem: str | None  # why decoding stopped early (corrupt, torn tail, bad magic)


def decode_file(data: bytes, *, include_data: bool = True) -> DecodedFile:
    """Decode a whole file held in memory (checkpoints, tests, the dump tool).

    A torn last record or a corrupt record ends decoding; everything before it
    is returned and ``problem`` says what was cut.
    """
    kind = file_kind(data[:MAGIC_SIZE])
    if kind is None:
        return DecodedFile(None, [], 0, len(data), "not a kestreld journal file (bad magic)")
    res = scan(data, MAGIC_SIZE, include_data=include_data)
    problem = None
    if res.status == Status.CORRUPT:
        problem = f"corrupt record at offset {res.pos}: {res.problem}"
    elif res.status == Status.MORE and res.pos < len(data):
        problem = f"truncated record at offset {res.pos} ({len(data) - res.pos} bytes cut)"
    elif res.status == Status.END and any(data[res.pos :]):
        problem = f"data after the end marker at offset {res.pos}"
    return DecodedFile(kind, res.records, res.pos, len(data), problem)


def decode_checkpoint(data: bytes) -> tuple[int, set[int], str | None]:
    """(head, done ids, problem) from a reader's progress file (see :func:`decode_progress`)."""
    head, done, _held, problem = decode_progress(data)
    return head, done, problem


def decode_progress(data: bytes) -> tuple[int, set[int], set[int], str | None]:
    """(head, done ids, held ids, problem) from a reader's progress file.

    The file is a checkpoint (READ_HEAD, READ_DONE) followed by any number of
    appended READ_DONE records (confirms, discards, expiries) and READ_HEAD
    jumps (a flush, a reader created at the tail); the done ids are the union
    of the READ_DONE ids above the last READ_HEAD.  A jump only moves forward.

    *Held* ids are ids at or below the head that are still owed (reads open
    when a flush moved the head past them): written as negative ids in a
    READ_DONE, and released by a later positive one.  libkestrel's decoder
    sees them as done ids below the head and ignores them.

    A damaged checkpoint yields what could be read and a problem; the caller
    decides how to fall back (kestreld re-delivers rather than loses).
    """
    decoded = decode_file(data, include_data=False)
    if decoded.kind is not FileKind.READER:
        return 0, set(), set(), decoded.problem or "not a reader checkpoint"
    head: int | None = None
    done: set[int] = set()
    held: set[int] = set()
    problem = decoded.problem
    for n, rec in enumerate(decoded.records):
        if isinstance(rec, ReadHead):
            if n and (head is None or rec.id < head):
                # A jump never goes back: one that does is damage (a flipped command byte).
                problem = f"READ_HEAD going back at offset {rec.offset}"
                break
            head = rec.id
            done = {i for i in done if i > head}
            held = set()
        elif isinstance(rec, ReadDone):
            for i in rec.ids:
                if i < 0:
                    held.add(-i)
                else:
                    done.add(i)
                    held.discard(i)
        else:
            # A progress file holds nothing else: a record of another kind is damage
            # (a flipped command byte can make a skippable record), so stop there.
            problem = f"unexpected record in a progress file at offset {rec.offset}"
            break
    if head is None:
        return 0, set(), set(), problem or "checkpoint has no READ_HEAD"
    return head, {i for i in done if i > head}, {i for i in held if i <= head}, problem
