"""Hostile byte streams on the text and thrift ports.

Hypothesis generates streams (mixes of real requests, damaged ones and noise,
split at random points); after each, the server must still be up, every text
reply well formed, no ``Internal error``, and a bystander connection opened at
the start (on both ports) must still be served correctly.
"""

from __future__ import annotations

import re
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kestrel_fronts import TextConn, kestrel, start_fronts, thrift_client
from thriftpy2.protocol import TBinaryProtocol
from thriftpy2.thrift import TMessageType
from thriftpy2.transport import TMemoryBuffer

# Never generated: they would stop the server or refuse the bystander's writes.
FORBIDDEN = re.compile(rb"shutdown|status|flush|delete", re.IGNORECASE)
TEXT_REPLY = re.compile(rb"[+]\d+|-[^\n]*|:[^\n]*|\*")


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    proc = start_fronts(
        tmp_path_factory.mktemp("fuzz_fronts") / "queues",
        'max_item_size = "64KiB"\nmax_line_length = "1KiB"\nclient_timeout = "30s"\n',
    )
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def bystanders(fronts):
    text = TextConn(fronts.text_port)
    thrift = thrift_client(fronts.thrift_port)
    yield text, thrift
    text.close()
    thrift.close()


def _check_bystanders(bystanders, n: int) -> None:
    text, thrift = bystanders
    assert text.put("fuzz_bystander", f"item {n}") == b"+1"
    assert text.ask("get fuzz_bystander") == f":item {n}".encode()
    assert thrift.put("fuzz_bystander_t", [b"t%d" % n], 0) == 1
    assert [i.data for i in thrift.get("fuzz_bystander_t", 1, 0, 0)] == [b"t%d" % n]


def _send_and_drain(port: int, chunks: list[bytes], timeout: float = 0.5) -> bytes:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    received = b""
    try:
        for chunk in chunks:
            sock.sendall(chunk)
        sock.shutdown(socket.SHUT_WR)
        sock.settimeout(timeout)
        while True:
            try:
                data = sock.recv(65536)
            except OSError:
                break
            if not data:
                break
            received += data
    except OSError:
        pass  # the server closed first (a frame it cannot follow): allowed
    finally:
        sock.close()
    return received


# --- text -------------------------------------------------------------------------------------

queue = st.sampled_from([b"fuzz_q", b"fuzz_q+r", b"", b"bad/name", b"fuzz_\xff"])
number = st.sampled_from([b"0", b"10", b"-1", b"x", b"99999999999999999999", b""])
word = st.sampled_from(
    [b"put", b"get", b"peek", b"monitor", b"confirm", b"version", b"GET", b"frob", b""]
)
line = st.one_of(
    st.builds(lambda w, q, n: b" ".join([w, q, n]) + b"\n", word, queue, number),
    st.builds(
        lambda q, items: b"put " + q + b":\n" + b"".join(i + b"\n" for i in items) + b"\n",
        queue,
        st.lists(st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")), max_size=5),
    ),
    st.binary(max_size=60),
    st.just(b"x" * 1100 + b"\n"),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(lines=st.lists(line, min_size=1, max_size=12), cut=st.integers(1, 40))
def test_text_streams_never_break_the_server_or_a_bystander(fronts, bystanders, lines, cut):
    stream = b"".join(lines)
    if FORBIDDEN.search(stream):
        stream = FORBIDDEN.sub(b"xxxx", stream)
    chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
    received = _send_and_drain(fronts.text_port, chunks)
    assert b"Internal error" not in received
    for reply in received.split(b"\n")[:-1]:
        assert TEXT_REPLY.fullmatch(reply), reply
    assert fronts.proc.poll() is None
    _check_bystanders(bystanders, len(stream))


# --- thrift -----------------------------------------------------------------------------------


def _frame(method: str, args) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin(method, TMessageType.CALL, 1)
    args.write(proto)
    proto.write_message_end()
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


K = kestrel.Kestrel
calls = st.sampled_from(
    [
        _frame("put", K.put_args(queue_name="fuzz_t", items=[b"a", b"bb"], expiration_msec=0)),
        _frame("get", K.get_args(queue_name="fuzz_t", max_items=3, timeout_msec=0)),
        _frame("get", K.get_args(queue_name="fuzz_t", max_items=2, auto_abort_msec=50)),
        _frame("confirm", K.confirm_args(queue_name="fuzz_t", ids={1, 2, 3})),
        _frame("abort", K.abort_args(queue_name="fuzz_t", ids={4})),
        _frame("peek", K.peek_args(queue_name="fuzz_t")),
        _frame("get_version", K.get_version_args()),
        _frame("__can__finagle__trace__v3__", K.get_version_args()),
    ]
)


@st.composite
def damaged(draw) -> bytes:
    frame = bytearray(draw(calls))
    for _ in range(draw(st.integers(0, 4))):
        pos = draw(st.integers(0, len(frame) - 1))
        frame[pos] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        frame = frame[: draw(st.integers(0, len(frame)))]
    return bytes(frame)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    frames=st.lists(st.one_of(calls, damaged(), st.binary(max_size=40)), min_size=1, max_size=8),
    cut=st.integers(1, 64),
)
def test_thrift_streams_never_break_the_server_or_a_bystander(fronts, bystanders, frames, cut):
    stream = b"".join(frames)
    chunks = [stream[i : i + cut] for i in range(0, len(stream), cut)]
    _send_and_drain(fronts.thrift_port, chunks)
    assert fronts.proc.poll() is None
    _check_bystanders(bystanders, len(stream))
    assert not [e for e in fronts.events("request_failed")]
