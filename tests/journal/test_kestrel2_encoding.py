"""The tests' Kestrel 2.x journal encoder (tests/support/kestrel2_encoding.py, independent
of kestreld's reader, imported by tests in several folders).

The tests here pin it to the format's published examples, so the reader is
checked against the format, not against itself.
"""

from __future__ import annotations

import struct

from kestrel2_encoding import (
    add,
    add_xid,
    addx,
    continue_,
    save_xid,
)

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
