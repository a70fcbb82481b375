"""The length field of a ``set`` line, byte by byte: the parser's most dangerous input.

The data block's length comes from the wire and decides where the next
request starts, so it is where a parser in C (the compiled build) would read
out of bounds or lose its place.  Every truncation of a ``set`` request and
every byte value (0-255) at every position of its length field are sent on
their own connection, which then half-closes; whatever the server answers
must be well-formed lines, never an internal error, and a ``STORED`` must
store exactly the bytes the declared length names.  Afterwards the queue
holds exactly the stored items and the server serves a bystander as before.
CI runs this against the compiled build and the plain Python one.
"""

from __future__ import annotations

import re
import socket
from concurrent.futures import ThreadPoolExecutor

from kestreld_process import Conn, KestreldProcess

PAYLOAD = b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_" * 2  # 128 bytes
LENGTH = str(len(PAYLOAD)).encode()
REPLY = re.compile(rb"STORED|NOT_STORED|ERROR|CLIENT_ERROR [ -~]*|SERVER_ERROR [ -~]*")


def exchange(srv: KestreldProcess, wire: bytes) -> list[bytes]:
    """Send ``wire``, half-close, and read every reply line until the server closes."""
    with srv.connect(timeout=10) as sock:
        sock.sendall(wire)
        sock.shutdown(socket.SHUT_WR)
        buf = b""
        while chunk := sock.recv(65536):
            buf += chunk
    assert buf == b"" or buf.endswith(b"\r\n"), buf[-80:]
    return buf.split(b"\r\n")[:-1]


def check_replies(lines: list[bytes], wire: bytes) -> int:
    """Every line well formed, none an internal error; the number of STORED."""
    for line in lines:
        assert REPLY.fullmatch(line), (wire[:60], line)
        assert b"internal error" not in line, (wire[:60], line)
    return lines.count(b"STORED")


def drain(srv: KestreldProcess, queue: str) -> list[bytes]:
    c = Conn(srv.connect())
    try:
        items = []
        while (item := c.get(queue)) is not None:
            items.append(item)
        return items
    finally:
        c.close()


def declared_block(field: bytes) -> bytes | None:
    """What a ``set`` with this length field (the bytes after ``set q 0 0 ``) may store.

    None when the line holds no plain decimal length.  The line ends at the
    first newline (the framing splits it on whitespace) and the block starts
    right after that newline.
    """
    wire = b"set q 0 0 " + field + b"\r\n" + PAYLOAD + b"\r\n"
    line, _, rest = wire.partition(b"\n")
    words = line.split()
    if len(words) != 5 or not words[4].isdigit():
        return None
    return rest[: int(words[4])]


def run_all(srv: KestreldProcess, wires: list[bytes]) -> list[list[bytes]]:
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda w: exchange(srv, w), wires))


def test_every_truncation_of_a_set_stores_nothing_until_it_is_whole(server, qname):
    request = b"set %s 0 0 %s\r\n%s\r\n" % (qname.encode(), LENGTH, PAYLOAD)
    wires = [request[:k] for k in range(len(request) + 1)]
    stored = 0
    for wire, lines in zip(wires, run_all(server, wires), strict=True):
        n = check_replies(lines, wire)
        assert n == (1 if wire == request else 0), (len(wire), lines)
        stored += n
    assert drain(server, qname) == [PAYLOAD] * stored
    c = Conn(server.connect())
    assert c.set(qname, b"after") == b"STORED" and c.get(qname) == b"after"
    c.close()


def test_every_byte_value_at_every_position_of_the_length_field(server, qname):
    cases: list[tuple[bytes, bytes]] = []  # (length field, wire)
    for pos in range(len(LENGTH) + 1):  # each digit, and one byte appended
        for value in range(256):
            field = LENGTH[:pos] + bytes([value]) + LENGTH[pos + 1 :]
            line = b"set %s 0 0 " % qname.encode() + field
            cases.append((field, line + b"\r\n" + PAYLOAD + b"\r\n"))
    stored: list[bytes] = []
    results = run_all(server, [wire for _, wire in cases])
    for (field, wire), lines in zip(cases, results, strict=True):
        if check_replies(lines, wire):
            expected = declared_block(field)
            assert expected is not None, (field, lines)
            stored.append(expected)
    assert stored, "the unmodified length must store"
    assert PAYLOAD in stored
    # Exactly the blocks that were acknowledged, in order, and nothing from a payload.
    assert sorted(drain(server, qname)) == sorted(stored)
    c = Conn(server.connect())
    assert c.set(qname, b"bystander") == b"STORED" and c.get(qname) == b"bystander"
    c.close()
