"""A small Kestrel 2.x journal encoder for the tests, independent of kestreld's reader.

Other test modules import it (``from test_kestrel2_encoding import ...``).
The tests here pin it to the format's published examples, so the reader is
checked against the format, not against itself.
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


# --- the encoder against the format's own examples ------------------------------------


def test_addx_of_an_11_byte_item_is_32_bytes() -> None:
    assert len(addx(b"hello world", 1)) == 32


def test_addx_of_8192_bytes_is_data_plus_21() -> None:
    assert len(addx(b"x" * 8192, 1)) == 8192 + 16 + 5


def test_add_of_a_1_byte_item_has_size_5() -> None:
    record = add(b"x", 7)
    assert record[0] == 0
    assert struct.unpack_from("<i", record, 1)[0] == 5
    assert len(record) == 1 + 4 + 5


def test_fields_are_little_endian() -> None:
    assert addx(b"", 1, 2) == bytes.fromhex("02 10000000 0100000000000000 0200000000000000")
    assert save_xid(0x01020304) == bytes.fromhex("04 04030201")


def test_add_xid_and_continue_carry_the_xid_before_the_size() -> None:
    assert add_xid(5, b"ab", 1)[:9] == bytes.fromhex("07 05000000 12000000")
    assert continue_(5, b"ab", 1)[:9] == bytes.fromhex("08 05000000 12000000")
    assert len(add_xid(5, b"ab", 1)) == 1 + 4 + 4 + 16 + 2
