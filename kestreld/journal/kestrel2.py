"""Reading Kestrel 2.x journals (import only): decoding, file discovery and replay.

A Kestrel 2.x queue keeps one journal file ``<queue>``, older rotated files
``<queue>.<ms>`` and possibly a pack file ``<queue>.<ms>.pack`` that replaces
every rotated file with a timestamp <= its own.  There is no file header: a
file is a sequence of operations, each an opcode byte and little-endian
fields (table in ``docs/upgrade-from-kestrel2.md``).  Replaying every file in order
rebuilds the queue.

This module is the one reader of that format: ``kestreld journal
import-kestrel2``, ``kestreld journal dump`` and the Spark data source all
use it.  It never writes anything.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum

from kestreld.journal.codec import READER_MAGIC, WRITER_MAGIC
from kestreld.journal.files import TEMP_MARK, split_queue_name

Buffer = bytes | bytearray | memoryview | mmap.mmap

_I32 = struct.Struct("<i")
_I32X2 = struct.Struct("<ii")
_I64X2 = struct.Struct("<qq")


class Opcode(IntEnum):
    ADD = 0
    REMOVE = 1
    ADDX = 2
    REMOVE_TENTATIVE = 3
    SAVE_XID = 4
    UNREMOVE = 5
    CONFIRM_REMOVE = 6
    ADD_XID = 7
    CONTINUE = 8  # STATE_DUMP in Kestrel 2.0 (scan with kestrel_2_0=True)
    REMOVE_TENTATIVE_XID = 9


#: Bytes before the data block of the opcodes that carry an item.
DATA_HEADER_SIZE = {Opcode.ADD: 9, Opcode.ADDX: 21, Opcode.ADD_XID: 25, Opcode.CONTINUE: 25}

_XID_ONLY = (Opcode.SAVE_XID, Opcode.UNREMOVE, Opcode.CONFIRM_REMOVE, Opcode.REMOVE_TENTATIVE_XID)


@dataclass(slots=True)
class Kestrel2Op:
    """One decoded operation.

    ``offset`` is the position of the opcode byte in the scanned buffer.  For
    the item-carrying opcodes (ADD, ADDX, ADD_XID, CONTINUE) ``size`` is the
    item's data length (not the file's block size) and ``data`` the item
    (None when scanned with ``include_data=False``).  Times are ms since the
    epoch; ``expire_time`` None means no expiry (ADD's seconds are converted).
    ADD has no add time in the file (``add_time`` None).  ``count`` is set only
    for Kestrel 2.0's STATE_DUMP.
    """

    offset: int
    opcode: int
    name: str
    xid: int | None = None
    add_time: int | None = None
    expire_time: int | None = None
    size: int | None = None
    data: bytes | None = None
    count: int | None = None

    @property
    def length(self) -> int:
        """Bytes the operation takes in the file."""
        if self.name == "STATE_DUMP":
            return 9
        if self.size is not None:
            return DATA_HEADER_SIZE[Opcode(self.opcode)] + self.size
        if self.opcode in (Opcode.REMOVE, Opcode.REMOVE_TENTATIVE):
            return 1
        return 5

    @property
    def data_offset(self) -> int | None:
        """Where the item's data starts in the buffer (item-carrying opcodes only)."""
        if self.size is None:
            return None
        return self.offset + DATA_HEADER_SIZE[Opcode(self.opcode)]


def _expiry_ms(value: int) -> int | None:
    return value or None


def scan_kestrel2(
    buf: Buffer,
    pos: int = 0,
    *,
    kestrel_2_0: bool = False,
    include_data: bool = True,
    limit: int | None = None,
) -> tuple[list[Kestrel2Op], int, str | None]:
    """Decode the operations in ``buf[pos:]``.

    Returns ``(ops, stop, problem)``.  ``problem`` is None when decoding ran
    to the end of the buffer (``stop == len(buf)``) or stopped after ``limit``
    operations (``stop < len(buf)``: call again from ``stop``).  Otherwise
    ``stop`` is the offset of the first operation that could not be decoded
    and ``problem`` says why (unknown opcode, a size that cannot be valid, a
    record cut short by the end of the buffer); every operation before it is
    returned.  Offsets are positions in ``buf``.  Data is never read past the
    buffer, whatever size a record declares.
    """
    end = len(buf)
    ops: list[Kestrel2Op] = []
    append = ops.append
    unpack_i32 = _I32.unpack_from
    unpack_i32x2 = _I32X2.unpack_from
    unpack_i64x2 = _I64X2.unpack_from
    while pos < end:
        if limit is not None and len(ops) >= limit:
            return ops, pos, None
        opcode = buf[pos]
        if opcode == Opcode.REMOVE:
            append(Kestrel2Op(pos, 1, "REMOVE"))
            pos += 1
            continue
        if opcode == Opcode.REMOVE_TENTATIVE:
            append(Kestrel2Op(pos, 3, "REMOVE_TENTATIVE"))
            pos += 1
            continue
        if opcode in _XID_ONLY:
            name = Opcode(opcode).name
            if pos + 5 > end:
                return ops, pos, _truncated(name, pos, 5, end)
            append(Kestrel2Op(pos, opcode, name, xid=unpack_i32(buf, pos + 1)[0]))
            pos += 5
            continue
        if opcode == Opcode.ADD:
            if pos + 5 > end:
                return ops, pos, _truncated("ADD", pos, 5, end)
            block = unpack_i32(buf, pos + 1)[0]
            if block < 4:
                return ops, pos, f"ADD at offset {pos} with size {block} (< 4)"
            if pos + 5 + block > end:
                return ops, pos, _overrun("ADD", pos, block, 5, end)
            expiry_s = unpack_i32(buf, pos + 5)[0]
            size = block - 4
            data = bytes(buf[pos + 9 : pos + 9 + size]) if include_data else None
            append(Kestrel2Op(pos, 0, "ADD", None, None, expiry_s * 1000 or None, size, data))
            pos += 5 + block
            continue
        if opcode == Opcode.ADDX:
            if pos + 5 > end:
                return ops, pos, _truncated("ADDX", pos, 5, end)
            block = unpack_i32(buf, pos + 1)[0]
            if block < 16:
                return ops, pos, f"ADDX at offset {pos} with size {block} (< 16)"
            if pos + 5 + block > end:
                return ops, pos, _overrun("ADDX", pos, block, 5, end)
            add_ms, expire_ms = unpack_i64x2(buf, pos + 5)
            size = block - 16
            data = bytes(buf[pos + 21 : pos + 21 + size]) if include_data else None
            append(Kestrel2Op(pos, 2, "ADDX", None, add_ms, expire_ms or None, size, data))
            pos += 5 + block
            continue
        if opcode == 8 and kestrel_2_0:
            if pos + 9 > end:
                return ops, pos, _truncated("STATE_DUMP", pos, 9, end)
            xid, count = unpack_i32x2(buf, pos + 1)
            append(Kestrel2Op(pos, 8, "STATE_DUMP", xid=xid, count=count))
            pos += 9
            continue
        if opcode == Opcode.ADD_XID or opcode == Opcode.CONTINUE:
            name = Opcode(opcode).name
            if pos + 9 > end:
                return ops, pos, _truncated(name, pos, 9, end)
            xid, block = unpack_i32x2(buf, pos + 1)
            if block < 16:
                return ops, pos, f"{name} at offset {pos} with size {block} (< 16)"
            if pos + 9 + block > end:
                return ops, pos, _overrun(name, pos, block, 9, end)
            add_ms, expire_ms = unpack_i64x2(buf, pos + 9)
            size = block - 16
            data = bytes(buf[pos + 25 : pos + 25 + size]) if include_data else None
            append(Kestrel2Op(pos, opcode, name, xid, add_ms, expire_ms or None, size, data))
            pos += 9 + block
            continue
        return ops, pos, f"unknown opcode {opcode} (0x{opcode:02x}) at offset {pos}"
    return ops, pos, None


def _truncated(name: str, pos: int, need: int, end: int) -> str:
    return f"truncated {name} at offset {pos}: needs {need} bytes, the file has {end - pos}"


def _overrun(name: str, pos: int, block: int, fixed: int, end: int) -> str:
    have = end - pos - fixed
    return (
        f"{name} at offset {pos} declares {block} bytes but only {have} remain "
        "(truncated record or corrupt size)"
    )


# --- files in a Kestrel 2.x queue folder ----------------------------------------------


@dataclass(slots=True)
class Kestrel2Folder:
    """The Kestrel 2.x journals found in a folder.

    ``queues`` maps each queue name (fanout children as ``parent+child``) to
    its files in replay order; ``superseded`` lists rotated and pack files a
    newer pack file replaces; ``ignored`` lists everything else (temporaries,
    native kestreld files, names that are not legal queue names).
    """

    queues: dict[str, list[str]] = field(default_factory=dict)
    superseded: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def _starts_native(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError:
        return False
    return magic in (WRITER_MAGIC, READER_MAGIC)


def scan_kestrel2_folder(folder: str) -> Kestrel2Folder:
    """Find every queue's 2.x journal files in ``folder`` (reads at most 4 bytes a file).

    Replay order per queue: the newest pack file ``<q>.<T>.pack`` (if any)
    stands for every rotated file and older pack with a timestamp <= T; then
    the remaining rotated files ``<q>.<ms>``, oldest first; then ``<q>``.
    Names containing ``~~`` are ignored, and so are native kestreld files.
    """
    result = Kestrel2Folder()
    live: dict[str, str] = {}
    rotated: dict[str, list[tuple[int, str]]] = {}
    packs: dict[str, list[tuple[int, str]]] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        queue, dot, rest = name.partition(".")
        if TEMP_MARK in name or split_queue_name(queue) is None:
            result.ignored.append(path)
        elif not dot:
            live[queue] = path
        elif rest.isdigit() and not _starts_native(path):
            rotated.setdefault(queue, []).append((int(rest), path))
        elif rest.endswith(".pack") and rest[:-5].isdigit():
            packs.setdefault(queue, []).append((int(rest[:-5]), path))
        else:
            result.ignored.append(path)
    for queue in sorted(set(live) | set(rotated) | set(packs)):
        files: list[str] = []
        newer = sorted(rotated.get(queue, []))
        queue_packs = sorted(packs.get(queue, []))
        if queue_packs:
            stamp, pack = queue_packs[-1]
            result.superseded.extend(p for _, p in queue_packs[:-1])
            result.superseded.extend(p for t, p in newer if t <= stamp)
            newer = [(t, p) for t, p in newer if t > stamp]
            files.append(pack)
        files.extend(p for _, p in newer)
        if queue in live:
            files.append(live[queue])
        result.queues[queue] = files
    return result


def journal_files(folder: str) -> dict[str, list[str]]:
    """Queue name -> its 2.x journal files in replay order (see :func:`scan_kestrel2_folder`)."""
    return scan_kestrel2_folder(folder).queues


# --- replay ---------------------------------------------------------------------------


@dataclass(slots=True)
class Kestrel2Item:
    """An item of the replayed queue.

    ``data`` is None when replayed with ``include_data=False``; the item's
    bytes are then ``size`` bytes at ``data_offset`` in ``path`` (read them
    with :class:`ItemData`).  ``expire_time`` None means no expiry.
    """

    add_time: int
    expire_time: int | None
    size: int
    data: bytes | None
    path: str
    data_offset: int


@dataclass(slots=True)
class Problem:
    """Something replay could not take as it was.

    For a fault, ``dropped_bytes`` is how much of ``path`` from ``offset`` on
    was not replayed; for a warning (an operation that made no sense for the
    queue's state, such as a REMOVE on an empty queue) it is 0.
    """

    path: str
    offset: int
    message: str
    dropped_bytes: int = 0

    def __str__(self) -> str:
        """``file at offset N: message; K bytes dropped`` (the offset once)."""
        where = os.path.basename(self.path)
        if f"offset {self.offset}" not in self.message:
            where += f" at offset {self.offset}"
        text = f"{where}: {self.message}"
        if self.dropped_bytes:
            text += f"; {self.dropped_bytes} bytes dropped"
        return text


@dataclass(slots=True)
class ReplayResult:
    """A queue's final state after replaying its journal files.

    ``items`` are in queue order, head first; transactions still open at the
    end were given back to the head, lowest xid first (``open_returned`` of
    them).  ``problems`` are faults (records that could not be decoded, and
    everything after them in that file); ``warnings`` are readable
    operations that did not fit the queue's state (nothing was dropped).
    """

    items: list[Kestrel2Item]
    open_returned: int
    problems: list[Problem]
    warnings: list[Problem]
    ops: int
    file_bytes: int

    @property
    def data_bytes(self) -> int:
        return sum(item.size for item in self.items)


_XID_WRAP = 1 << 32


def _wrap_i32(value: int) -> int:
    return (value + (1 << 31)) % _XID_WRAP - (1 << 31)


#: Operations decoded per scan call during replay (bounds memory on large files).
REPLAY_BATCH = 50_000


def _map(path: str) -> tuple[Buffer, Callable[[], None]]:
    """The file's bytes, memory-mapped when possible, and how to release them."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b"", lambda: None
        try:
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            data = f.read()
            return data, lambda: None
    return mapped, mapped.close


class _QueueState:
    """Kestrel 2.x's queue state machine, as PersistentQueue.replayJournal drives it."""

    def __init__(self, import_time_ms: int) -> None:
        self.import_time_ms = import_time_ms
        self.items: deque[Kestrel2Item] = deque()
        self.open: dict[int, Kestrel2Item] = {}
        self.xid_counter = 0
        self.pending_xid: int | None = None  # an ADD_XID's xid, for a REMOVE_TENTATIVE right after
        self.warnings: list[Problem] = []

    def _warn(self, path: str, op: Kestrel2Op, message: str) -> None:
        self.warnings.append(Problem(path, op.offset, message))

    def _next_xid(self) -> int:
        xid = self.xid_counter
        while True:
            xid = _wrap_i32(xid + 1)
            if xid != 0 and xid not in self.open:
                break
        self.xid_counter = xid
        return xid

    def _item(self, op: Kestrel2Op, path: str) -> Kestrel2Item:
        add_time = self.import_time_ms if op.add_time is None else op.add_time
        size = op.size or 0
        return Kestrel2Item(add_time, op.expire_time, size, op.data, path, op.data_offset or 0)

    def _reserve(self, path: str, op: Kestrel2Op, xid: int | None) -> None:
        if not self.items:
            self._warn(path, op, f"{op.name} on an empty queue (ignored)")
            return
        item = self.items.popleft()
        if xid is None:
            xid = self._next_xid()
        displaced = self.open.get(xid)
        if displaced is not None:
            # Kestrel would forget the older item; returning it loses nothing.
            self._warn(
                path,
                op,
                f"xid {xid} reserved while already open; the older item goes back to the head",
            )
            self.items.appendleft(displaced)
        self.open[xid] = item

    def apply(self, op: Kestrel2Op, path: str) -> None:
        pending, self.pending_xid = self.pending_xid, None
        code = op.opcode
        if code in (Opcode.ADD, Opcode.ADDX):
            self.items.append(self._item(op, path))
        elif code == Opcode.REMOVE:
            if self.items:
                self.items.popleft()
            else:
                self._warn(path, op, "REMOVE on an empty queue (ignored)")
        elif code == Opcode.REMOVE_TENTATIVE:
            self._reserve(path, op, pending)
        elif code == Opcode.REMOVE_TENTATIVE_XID:
            self._reserve(path, op, op.xid)
        elif code == Opcode.SAVE_XID:
            assert op.xid is not None
            self.xid_counter = op.xid
        elif code == Opcode.UNREMOVE:
            item = self.open.pop(op.xid, None)  # type: ignore[arg-type]
            if item is None:
                self._warn(path, op, f"UNREMOVE of xid {op.xid}, which is not open (ignored)")
            else:
                self.items.appendleft(item)
        elif code == Opcode.CONFIRM_REMOVE:
            if self.open.pop(op.xid, None) is None:  # type: ignore[arg-type]
                self._warn(path, op, f"CONFIRM_REMOVE of xid {op.xid}, which is not open (ignored)")
        elif code == Opcode.ADD_XID:
            self.items.append(self._item(op, path))
            self.pending_xid = op.xid
        elif op.name == "STATE_DUMP":
            assert op.xid is not None
            self.xid_counter = op.xid
        elif code == Opcode.CONTINUE:
            if self.open.pop(op.xid, None) is None:  # type: ignore[arg-type]
                self._warn(
                    path, op, f"CONTINUE of xid {op.xid}, which is not open (item still added)"
                )
            self.items.append(self._item(op, path))

    def finish(self) -> tuple[list[Kestrel2Item], int]:
        returned = len(self.open)
        for xid in sorted(self.open, reverse=True):
            self.items.appendleft(self.open[xid])
        self.open.clear()
        return list(self.items), returned


def replay(
    paths: list[str],
    *,
    kestrel_2_0: bool = False,
    import_time_ms: int,
    include_data: bool = True,
    progress: Callable[[int], None] | None = None,
) -> ReplayResult:
    """Replay a queue's 2.x journal files (in the order given) into its final state.

    Follows Kestrel's replay: ADD/ADDX/ADD_XID append, REMOVE drops the head,
    REMOVE_TENTATIVE reserves the head under the next free xid (or under the
    xid of an ADD_XID right before it), UNREMOVE puts a reservation back at
    the head, CONFIRM_REMOVE ends it, CONTINUE ends one and appends an item,
    SAVE_XID (and 2.0's STATE_DUMP) set the xid counter.  ADD items get
    ``import_time_ms`` as their add time.  Expired items are kept with their
    expiry time (Kestrel journalled the removals it made).

    A fault keeps every operation before it, is reported with file and
    offset, and replay goes on with the next file (a file that cannot be
    opened is a fault at offset 0).  ``progress`` is called
    with the number of file bytes replayed so far.
    """
    state = _QueueState(import_time_ms)
    problems: list[Problem] = []
    n_ops = 0
    done_bytes = 0
    for path in paths:
        try:
            buf, release = _map(path)
        except OSError as e:
            problems.append(Problem(path, 0, f"cannot read the file: {e.strerror or e}"))
            state.pending_xid = None
            continue
        try:
            pos = 0
            while True:
                ops, stop, problem = scan_kestrel2(
                    buf, pos, kestrel_2_0=kestrel_2_0, include_data=include_data, limit=REPLAY_BATCH
                )
                for op in ops:
                    state.apply(op, path)
                n_ops += len(ops)
                if progress is not None:
                    progress(done_bytes + stop)
                if problem is not None:
                    problems.append(Problem(path, stop, problem, len(buf) - stop))
                    state.pending_xid = None
                    break
                if stop >= len(buf):
                    break
                pos = stop
            done_bytes += len(buf)
        finally:
            del buf
            release()
    items, returned = state.finish()
    return ReplayResult(items, returned, problems, state.warnings, n_ops, done_bytes)


class ItemData:
    """Reads the data of items replayed with ``include_data=False``.

    Files stay memory-mapped until :meth:`close` (or the end of a ``with``
    block).  Items that already hold their data are returned as they are.
    """

    def __init__(self) -> None:
        self._files: dict[str, tuple[Buffer, Callable[[], None]]] = {}

    def __call__(self, item: Kestrel2Item) -> bytes:
        if item.data is not None:
            return item.data
        entry = self._files.get(item.path)
        if entry is None:
            entry = self._files[item.path] = _map(item.path)
        buf = entry[0]
        data = bytes(buf[item.data_offset : item.data_offset + item.size])
        if len(data) != item.size:
            raise ValueError(f"{item.path} changed during the import (item at {item.data_offset})")
        return data

    def close(self) -> None:
        files, self._files = self._files, {}
        for _, release in files.values():
            release()

    def __enter__(self) -> ItemData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
