"""Independent checks of the on-disk format: a decoder and an encoder written here
from the seed's text alone (not kestreld's codec)."""

from __future__ import annotations

import os
import struct

from kestreld_process import Conn


def decode_writer(data: bytes) -> list[tuple[int, int, int, int, bytes]]:
    """(id, add_time, expire_time, error_count, data) of every PUT, straight from the spec."""
    assert data[:4] == bytes([0x27, 0x64, 0x26, 0x03])
    pos, out = 4, []
    while pos < len(data) and data[pos] != 0:
        cmd = data[pos]
        command, words = cmd >> 4, cmd & 0xF
        header = data[pos + 1 : pos + 1 + 4 * words]
        size = struct.unpack("<i", header[:4])[0] if command >= 8 else 0
        body = data[pos + 1 + 4 * words : pos + 1 + 4 * words + size]
        assert command == 8 and words in (6, 8)
        errors, id_, add = struct.unpack("<iqq", header[4:24])
        expire = struct.unpack("<q", header[24:32])[0] if words == 8 else 0
        out.append((id_, add, expire, errors, body))
        pos += 1 + 4 * words + size
    return out


def decode_reader(data: bytes) -> tuple[int, list[int]]:
    """(head, done ids) of a reader file, straight from the spec: READ_HEAD, then records
    read in order; every READ_DONE adds its ids (a progress file appends one per tick)."""
    assert data[:4] == bytes([0x26, 0x3C, 0x26, 0x03])
    assert data[4] == 0x02
    head = struct.unpack("<q", data[5:13])[0]
    done: list[int] = []
    pos = 13
    while pos < len(data) and data[pos] != 0:
        assert data[pos] == 0x91, f"unexpected command byte {data[pos]:#x} at {pos}"
        nbytes = struct.unpack("<i", data[pos + 1 : pos + 5])[0]
        done += struct.unpack(f"<{nbytes // 8}q", data[pos + 5 : pos + 5 + nbytes])
        pos += 5 + nbytes
    assert pos == len(data), "no torn record"
    ids = set(done)
    while head + 1 in ids:  # ids done right after the head move it (the same state)
        head += 1
    return head, sorted(i for i in ids if i > head)


def encode_put(id_: int, add: int, body: bytes, expire: int = 0) -> bytes:
    if expire:
        return bytes([0x88]) + struct.pack("<iiqqq", len(body), 0, id_, add, expire) + body
    return bytes([0x86]) + struct.pack("<iiqq", len(body), 0, id_, add) + body


def test_server_files_decode_with_an_independent_decoder(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    c.set("ind", "plain")
    c.set("ind", "expiring", exptime=3600)
    for i in range(3):
        c.set("ind", f"x{i}")
    a = Conn(srv.connect())
    assert a.get("ind") == b"plain"
    assert a.get("ind/open") == b"expiring"
    b = Conn(srv.connect())
    assert b.get("ind/open") == b"x0"
    assert b.get("ind/close") is None  # x0 confirmed out of order, "expiring" still open
    srv.stop()
    seg = [n for n in os.listdir(srv.queue_path) if n.startswith("ind.") and n[4:].isdigit()]
    puts = decode_writer((srv.queue_path / seg[0]).read_bytes())
    assert [p[0] for p in puts] == [1, 2, 3, 4, 5]
    assert [p[4] for p in puts] == [b"plain", b"expiring", b"x0", b"x1", b"x2"]
    assert puts[1][2] > puts[1][1] and puts[0][2] == 0
    head, done = decode_reader((srv.queue_path / "ind.read.").read_bytes())
    # "expiring" (id 2) went back to the queue at shutdown; 3 was confirmed.
    assert (head, done) == (1, [3])


def test_server_serves_a_folder_written_by_an_independent_encoder(make_server, tmp_path):
    folder = tmp_path / "handmade"
    folder.mkdir()
    magic_w = bytes([0x27, 0x64, 0x26, 0x03])
    magic_r = bytes([0x26, 0x3C, 0x26, 0x03])
    now = 1_700_000_000_000
    (folder / "mail.1000").write_bytes(
        magic_w + b"".join(encode_put(i, now, f"m{i}".encode()) for i in range(1, 4))
    )
    (folder / "mail.2000").write_bytes(
        magic_w + b"".join(encode_put(i, now, f"m{i}".encode()) for i in range(4, 7))
    )
    # default reader: head 1, id 3 done out of order; reader "audit": head 4
    (folder / "mail.read.").write_bytes(
        magic_r + bytes([0x02]) + struct.pack("<q", 1) + bytes([0x91]) + struct.pack("<iq", 8, 3)
    )
    (folder / "mail.read.audit").write_bytes(magic_r + bytes([0x02]) + struct.pack("<q", 4))
    srv = make_server(queue_path=folder)
    c = Conn(srv.connect())
    assert [c.get("mail") for _ in range(5)] == [b"m2", b"m4", b"m5", b"m6", None]
    assert [c.get("mail+audit") for _ in range(3)] == [b"m5", b"m6", None]
    c.set("mail", "new")
    srv.stop()
    ids = [
        p[0]
        for n in sorted(os.listdir(folder))
        if n.startswith("mail.") and n[5:].isdigit()
        for p in decode_writer((folder / n).read_bytes())
    ]
    assert ids[-1] == 7


def test_progress_file_after_kill_decodes_with_the_independent_decoder(make_server):
    """Confirms appended since the last rewrite: several READ_DONE records after the
    checkpoint's own; a decoder that only knows the format reads the same state."""
    srv = make_server('checkpoint_interval = "1h"\n')  # no rewrite: only appends
    c = Conn(srv.connect())
    for i in range(8):
        c.set("multi", f"m{i}")
    assert c.get("multi") == b"m0"  # plain get: one append
    assert c.get("multi/open") == b"m1"
    assert c.get("multi/close") is None  # one append
    b = Conn(srv.connect())
    assert b.get("multi/open") == b"m2"
    assert c.get("multi/open") == b"m3"
    assert c.get("multi/close") is None  # 4 confirmed, 3 still open
    srv.kill()
    data = (srv.queue_path / "multi.read.").read_bytes()
    assert data.count(b"\x91") >= 4, "a checkpoint plus appended READ_DONE records"
    head, done = decode_reader(data)
    assert (head, done) == (2, [4])
    srv.start()
    c = Conn(srv.connect())
    assert [c.get("multi") for _ in range(5)] == [b"m2", b"m4", b"m5", b"m6", b"m7"]
