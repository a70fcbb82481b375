"""Kestrel's thrift interface (docs/protocol.md): a thriftpy2 client generated from the IDL,
framed transport, binary protocol, against a real kestreld."""

from __future__ import annotations

import socket
import struct
import time

import pytest
from kestrel_fronts import TextConn, kestrel, start_fronts, thrift_client
from kestreld_process import Conn
from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport import TMemoryBuffer


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    proc = start_fronts(tmp_path_factory.mktemp("thrift") / "queues")
    yield proc
    proc.stop()


@pytest.fixture
def client(fronts):
    c = thrift_client(fronts.thrift_port)
    yield c
    c.close()


def test_put_returns_how_many_were_stored(client, qname):
    assert client.put(qname, [b"a", b"b", b"c"], 0) == 3
    assert client.peek(qname).items == 3


def test_put_of_nothing_stores_nothing(client, qname):
    assert client.put(qname, [], 0) == 0


def test_put_stops_at_the_first_item_the_queue_refuses(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues", "max_items = 2\n")
    c = thrift_client(proc.thrift_port)
    try:
        assert c.put(qname, [b"1", b"2", b"3", b"4"], 0) == 2
        assert c.peek(qname).items == 2
    finally:
        c.close()
        proc.stop()


def test_put_with_expiration_expires_the_items(client, qname):
    assert client.put(qname, [b"soon"], 100) == 1
    time.sleep(0.3)
    assert client.get(qname, 1, 0, 0) == []


def test_get_without_auto_abort_confirms_items_with_id_zero(client, fronts, qname):
    client.put(qname, [b"x", b"y"], 0)
    items = client.get(qname, 10, 0, 0)
    assert [(i.data, i.id) for i in items] == [(b"x", 0), (b"y", 0)]
    client.close()
    again = thrift_client(fronts.thrift_port)
    try:
        assert again.get(qname, 10, 0, 0) == []  # confirmed: nothing comes back
    finally:
        again.close()


def test_get_returns_at_most_max_items(client, qname):
    client.put(qname, [b"%d" % i for i in range(5)], 0)
    assert [i.data for i in client.get(qname, 2, 0, 0)] == [b"0", b"1"]
    assert client.peek(qname).items == 3


def test_get_without_timeout_returns_only_what_is_there(client, qname):
    started = time.monotonic()
    assert client.get(qname, 5, 0, 0) == []
    assert time.monotonic() - started < 1.0


def test_get_with_timeout_waits_for_max_items_or_the_time(client, fronts, qname):
    other = thrift_client(fronts.thrift_port)
    try:
        other.put(qname, [b"first"], 0)
        started = time.monotonic()
        items = client.get(qname, 2, 300, 0)
        assert [i.data for i in items] == [b"first"]
        assert time.monotonic() - started >= 0.25
    finally:
        other.close()


def test_get_with_timeout_returns_once_max_items_arrived(client, fronts, qname):
    text = TextConn(fronts.text_port)
    try:
        client_items = []

        import threading

        t = threading.Thread(target=lambda: client_items.extend(client.get(qname, 2, 10_000, 0)))
        t.start()
        time.sleep(0.2)
        assert text.put(qname, "p", "q") == b"+2"
        t.join(10)
        assert [i.data for i in client_items] == [b"p", b"q"]
    finally:
        text.close()


def test_auto_abort_ids_are_confirmed_by_id(client, qname):
    client.put(qname, [b"a", b"b"], 0)
    items = client.get(qname, 2, 0, 60_000)
    ids = {i.id for i in items}
    assert len(ids) == 2 and 0 not in ids
    assert client.confirm(qname, ids) == 2
    assert client.confirm(qname, ids) == 0  # no longer open
    assert client.peek(qname).items == 0


def test_abort_gives_items_back_to_the_head(client, qname):
    client.put(qname, [b"a", b"b"], 0)
    [first] = client.get(qname, 1, 0, 60_000)
    assert client.abort(qname, {first.id}) == 1
    assert [i.data for i in client.get(qname, 2, 0, 0)] == [b"a", b"b"]


def test_confirm_counts_only_open_ids_of_that_queue(client, qname):
    client.put(qname, [b"a"], 0)
    [item] = client.get(qname, 1, 0, 60_000)
    assert client.confirm(qname + "_other", {item.id}) == 0
    assert client.confirm(qname, {item.id, 999_999_999}) == 1


def test_unconfirmed_items_are_aborted_after_auto_abort_msec(client, qname):
    client.put(qname, [b"late"], 0)
    [item] = client.get(qname, 1, 0, 300)
    assert client.peek(qname).open_transactions == 1
    time.sleep(1.0)
    assert client.confirm(qname, {item.id}) == 0
    assert [i.data for i in client.get(qname, 1, 0, 0)] == [b"late"]


def test_ids_are_confirmed_from_another_connection(client, fronts, qname):
    client.put(qname, [b"shared"], 0)
    [item] = client.get(qname, 1, 0, 60_000)
    other = thrift_client(fronts.thrift_port)
    try:
        assert other.confirm(qname, {item.id}) == 1
    finally:
        other.close()
    assert client.peek(qname).open_transactions == 0


def test_open_ids_survive_the_clients_disconnect(fronts, qname):
    first = thrift_client(fronts.thrift_port)
    first.put(qname, [b"kept"], 0)
    [item] = first.get(qname, 1, 0, 60_000)
    first.close()
    time.sleep(0.3)
    second = thrift_client(fronts.thrift_port)
    try:
        assert second.get(qname, 1, 0, 0) == []  # still open, not given back
        assert second.abort(qname, {item.id}) == 1
        assert [i.data for i in second.get(qname, 1, 0, 0)] == [b"kept"]
    finally:
        second.close()


def test_get_stops_at_max_open_reads_per_session(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues", "max_open_reads = 2\n")
    c = thrift_client(proc.thrift_port)
    try:
        c.put(qname, [b"1", b"2", b"3"], 0)
        assert len(c.get(qname, 3, 0, 60_000)) == 2
        assert c.get(qname, 3, 0, 60_000) == []
        c.put(qname + "_b", [b"other queue"], 0)
        assert len(c.get(qname + "_b", 1, 0, 60_000)) == 1  # counted per queue
    finally:
        c.close()
        proc.stop()


def test_open_ids_come_back_after_kill_9(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues")
    c = thrift_client(proc.thrift_port)
    try:
        c.put(qname, [b"a", b"b", b"c"], 0)
        items = c.get(qname, 2, 0, 60_000)
        assert c.confirm(qname, {items[0].id}) == 1
    finally:
        c.close()
    proc.restart(crash=True)
    c = thrift_client(proc.thrift_port)
    try:
        assert [i.data for i in c.get(qname, 5, 0, 0)] == [b"b", b"c"]
        assert c.confirm(qname, {items[1].id}) == 0  # ids do not outlive the process
    finally:
        c.close()
        proc.stop()


def test_peek_reports_the_queue_and_its_head(client, qname):
    client.put(qname, [b"head", b"tail"], 0)
    info = client.peek(qname)
    assert info.head_item == b"head"
    assert (info.items, info.bytes, info.open_transactions) == (2, 8, 0)
    assert info.journal_bytes > 0
    assert client.peek(qname).head_item == b"head"  # nothing removed


def test_peek_of_an_empty_queue_has_no_head(client, qname):
    assert client.peek(qname).head_item is None


def test_flush_queue_and_flush_all_queues_drop_items(client, qname):
    client.put(qname, [b"a"], 0)
    client.put(qname + "_2", [b"b"], 0)
    client.flush_queue(qname)
    assert client.peek(qname).items == 0
    assert client.peek(qname + "_2").items == 1
    client.flush_all_queues()
    assert client.peek(qname + "_2").items == 0


def test_delete_queue_removes_it(client, qname):
    client.put(qname, [b"a"], 0)
    client.delete_queue(qname)
    assert client.peek(qname).items == 0


def test_status_is_read_and_set(client, qname):
    Status = kestrel.Status
    assert client.current_status() == Status.UP
    client.set_status(Status.READ_ONLY)
    try:
        assert client.current_status() == Status.READ_ONLY
        with pytest.raises(TApplicationException, match="READONLY"):
            client.put(qname, [b"refused"], 0)
        with pytest.raises(TApplicationException):
            client.set_status(Status.NOT_CONFIGURED)
    finally:
        client.set_status(Status.UP)
    assert client.put(qname, [b"ok"], 0) == 1


def test_quiescent_refuses_reads_but_confirms_still_close(client, qname):
    Status = kestrel.Status
    client.put(qname, [b"a", b"b"], 0)
    [item] = client.get(qname, 1, 0, 60_000)
    client.set_status(Status.QUIESCENT)
    try:
        with pytest.raises(TApplicationException, match="QUIESCENT"):
            client.get(qname, 1, 0, 0)
        with pytest.raises(TApplicationException, match="QUIESCENT"):
            client.peek(qname)
        assert client.confirm(qname, {item.id}) == 1  # a drain may finish its reads
    finally:
        client.set_status(Status.UP)
    assert [i.data for i in client.get(qname, 5, 0, 0)] == [b"b"]


def test_get_version(client):
    from kestreld import __version__

    assert client.get_version() == __version__


# --- raw frames -------------------------------------------------------------------------------


def _call(method: str, seqid: int, args=None, strict: bool = True) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf, strict_write=strict)
    proto.write_message_begin(method, TMessageType.CALL, seqid)
    if args is None:
        buf.write(b"\x00")  # an empty argument struct
    else:
        args.write(proto)
    proto.write_message_end()
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


def _reply(sock: socket.socket) -> tuple[str, int, int, object]:
    """(method, message type, seqid, the exception or the raw body) of one framed reply."""
    head = _recv(sock, 4)
    body = _recv(sock, struct.unpack(">i", head)[0])
    proto = TBinaryProtocol(TMemoryBuffer(body))
    name, mtype, seqid = proto.read_message_begin()
    if mtype == TMessageType.EXCEPTION:
        exc = TApplicationException()
        exc.read(proto)
        return name, mtype, seqid, exc
    return name, mtype, seqid, body


def _recv(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


@pytest.fixture
def raw(fronts):
    sock = socket.create_connection(("127.0.0.1", fronts.thrift_port), timeout=20)
    yield sock
    sock.close()


def test_finagle_trace_probe_gets_unknown_method_and_the_connection_stays(raw):
    raw.sendall(_call("__can__finagle__trace__v3__", 1))
    name, mtype, seqid, exc = _reply(raw)
    assert (name, mtype, seqid) == ("__can__finagle__trace__v3__", TMessageType.EXCEPTION, 1)
    assert exc.type == TApplicationException.UNKNOWN_METHOD
    raw.sendall(_call("get_version", 2))
    assert _reply(raw)[1:3] == (TMessageType.REPLY, 2)


def test_old_style_non_strict_messages_are_understood(raw):
    raw.sendall(_call("get_version", 7, strict=False))
    assert _reply(raw)[1:3] == (TMessageType.REPLY, 7)


def test_wrong_argument_types_are_an_application_exception(raw, qname):
    # put with queue_name sent as an i32: the field is skipped, so it is missing.
    body = TMemoryBuffer()
    proto = TBinaryProtocol(body)
    proto.write_message_begin("put", TMessageType.CALL, 3)
    body.write(b"\x08\x00\x01" + struct.pack(">i", 5) + b"\x00")
    data = body.getvalue()
    raw.sendall(struct.pack(">i", len(data)) + data)
    name, mtype, seqid, exc = _reply(raw)
    assert (name, mtype, seqid) == ("put", TMessageType.EXCEPTION, 3)
    assert exc.type == TApplicationException.PROTOCOL_ERROR
    raw.sendall(_call("get_version", 4))
    assert _reply(raw)[1:3] == (TMessageType.REPLY, 4)


def test_a_damaged_put_is_refused_whole(raw, client, qname):
    args = kestrel.Kestrel.put_args(queue_name=qname, items=[b"a", b"b", b"c"])
    frame = bytearray(_call("put", 5, args))
    frame[-3] = 0xEE  # the last item's bytes run past the struct's end: no stop byte
    frame = bytes(frame[:-1])
    frame = struct.pack(">i", len(frame) - 4) + frame[4:]
    raw.sendall(frame)
    name, mtype, seqid, exc = _reply(raw)
    assert mtype == TMessageType.EXCEPTION and exc.type == TApplicationException.PROTOCOL_ERROR
    assert client.peek(qname).items == 0


def test_a_list_length_past_the_frame_is_refused_without_allocating_it(raw, client):
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin("put", TMessageType.CALL, 6)
    buf.write(b"\x0f\x00\x02\x0b" + struct.pack(">i", 2_000_000_000) + b"\x00")
    data = buf.getvalue()
    raw.sendall(struct.pack(">i", len(data)) + data)
    assert _reply(raw)[3].type == TApplicationException.PROTOCOL_ERROR
    assert client.get_version()


def test_a_frame_over_the_bound_closes_the_connection(raw, client):
    raw.sendall(struct.pack(">i", 2_000_000_000))
    raw.settimeout(10)
    assert raw.recv(10) == b""
    assert client.get_version()  # the server is fine


def test_an_unreadable_message_header_closes_the_connection(raw, client):
    raw.sendall(struct.pack(">i", 8) + b"\x80\x07\x00\x01abcd")  # unknown version
    raw.settimeout(10)
    assert raw.recv(10) == b""
    assert client.get_version()


# --- the three front ends on one queue --------------------------------------------------------


def test_set_by_memcache_get_by_thrift_confirmed_by_text(fronts, client, qname):
    mc = Conn(fronts.connect())
    text = TextConn(fronts.text_port)
    try:
        assert mc.set(qname, b"from memcache") == b"STORED"
        assert text.put(qname, "from text") == b"+1"
        [item] = client.get(qname, 1, 0, 60_000)
        assert item.data == b"from memcache"
        assert text.ask(f"get {qname}") == b":from text"
        assert text.ask(f"confirm {qname} 1") == b"+1"
        assert client.confirm(qname, {item.id}) == 1
        assert mc.get(qname) is None
        stats = mc.stats()
        assert int(stats["curr_connections"]) >= 3
    finally:
        mc.close()
        text.close()
