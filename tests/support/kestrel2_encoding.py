"""A small Kestrel 2.x journal encoder for the tests, independent of kestreld's reader.

Tests in several folders import it (``from kestrel2_encoding import ...``);
tests/journal/test_kestrel2_encoding.py pins it to the format's published examples,
so the reader is checked against the format, not against itself.
"""

from __future__ import annotations

import os
import struct


def add(data: bytes, expiry_s: int = 0) -> bytes:
    """ADD (0): i32 size (= 4 + data), i32 expiry in seconds, data."""
    return bytes([0]) + struct.pack("<i", len(data) + 4) + struct.pack("<i", expiry_s) + data


def remove() -> bytes:
    return bytes([1])


def addx(data: bytes, add_ms: int, expire_ms: int = 0) -> bytes:
    """ADDX (2): i32 size (= 16 + data), i64 add time, i64 expiry (ms), data."""
    return (
        bytes([2])
        + struct.pack("<i", len(data) + 16)
        + struct.pack("<qq", add_ms, expire_ms)
        + data
    )


def remove_tentative() -> bytes:
    return bytes([3])


def save_xid(xid: int) -> bytes:
    return bytes([4]) + struct.pack("<i", xid)


def unremove(xid: int) -> bytes:
    return bytes([5]) + struct.pack("<i", xid)


def confirm_remove(xid: int) -> bytes:
    return bytes([6]) + struct.pack("<i", xid)


def add_xid(xid: int, data: bytes, add_ms: int, expire_ms: int = 0) -> bytes:
    """ADD_XID (7): i32 xid, then an ADDX body."""
    return bytes([7]) + struct.pack("<i", xid) + addx(data, add_ms, expire_ms)[1:]


def continue_(xid: int, data: bytes, add_ms: int, expire_ms: int = 0) -> bytes:
    """CONTINUE (8, Kestrel 2.1+): i32 xid, then an ADDX body."""
    return bytes([8]) + struct.pack("<i", xid) + addx(data, add_ms, expire_ms)[1:]


def state_dump(xid: int, count: int) -> bytes:
    """STATE_DUMP (8, Kestrel 2.0): i32 xid, i32 count."""
    return bytes([8]) + struct.pack("<ii", xid, count)


def remove_tentative_xid(xid: int) -> bytes:
    return bytes([9]) + struct.pack("<i", xid)


def write_journal(folder: os.PathLike[str] | str, name: str, *ops: bytes) -> str:
    """A journal file ``folder/name`` holding ``ops`` back to back; returns its path."""
    path = os.path.join(folder, name)
    with open(path, "wb") as f:
        f.write(b"".join(ops))
    return path
