"""Kestrel's thrift interface on the wire: framed transport, binary protocol (sans-IO).

The IDL (``kestrel.thrift`` beside this file) is loaded with thriftpy2, whose
codec decodes calls and encodes replies.  Its decoder trusts the lengths it
reads (a damaged list length makes it allocate or loop billions of times), so
every frame is walked first by :func:`check_message`: each string and
container must fit in the bytes that are left, every type must be one the
binary protocol has, nesting stays shallow.  Only a frame that passes is
decoded.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import thriftpy2
from thriftpy2.thrift import TApplicationException, TMessageType

from kestreld.frontends.core.limits import MAX_REQUEST_ITEM_BYTES

try:  # the Cython codec thriftpy2 builds on install; its pure-Python one otherwise
    from thriftpy2.protocol.cybin import TCyBinaryProtocol as _Protocol
    from thriftpy2.transport import TCyMemoryBuffer as _Buffer
except ImportError:  # pragma: no cover
    from thriftpy2.protocol.binary import TBinaryProtocol as _Protocol  # type: ignore[assignment]
    from thriftpy2.transport import TMemoryBuffer as _Buffer  # type: ignore[assignment]

IDL_PATH = Path(__file__).with_name("kestrel.thrift")
#: The generated module: Item, QueueInfo, Status and the Kestrel service.
kestrel = thriftpy2.load(str(IDL_PATH), module_name="kestrel_thrift")
SERVICE = kestrel.Kestrel
METHODS = frozenset(SERVICE.thrift_services)

#: Bytes a frame may carry besides its items (names, ids, field headers).
FRAME_OVERHEAD = 64 * 1024
#: Item bytes one frame may carry whatever max_item_size is: a frame is buffered
#: whole before it is decoded, so this bounds a connection's input buffer.
FRAME_ITEMS_CAP = MAX_REQUEST_ITEM_BYTES

CALL = TMessageType.CALL
ONEWAY = TMessageType.ONEWAY
REPLY = TMessageType.REPLY
EXCEPTION = TMessageType.EXCEPTION

UNKNOWN = TApplicationException.UNKNOWN
UNKNOWN_METHOD = TApplicationException.UNKNOWN_METHOD
INVALID_MESSAGE_TYPE = TApplicationException.INVALID_MESSAGE_TYPE
PROTOCOL_ERROR = TApplicationException.PROTOCOL_ERROR
INTERNAL_ERROR = TApplicationException.INTERNAL_ERROR

_VERSION_1 = 0x80010000
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
#: Wire types of a fixed size (bool, byte, double, i16, i32, i64).
_FIXED = {2: 1, 3: 1, 4: 8, 6: 2, 8: 4, 10: 8}
#: The fewest bytes a value of each variable type takes (string, struct, map, set, list).
_SMALLEST = {11: 4, 12: 1, 13: 6, 14: 5, 15: 5}
_MAX_DEPTH = 8


class BadFrame(Exception):
    """A frame that does not hold one well-formed binary-protocol message."""


def max_frame_size(max_item_size: int, max_items: int = 1024) -> int:
    """The largest frame accepted: ``max_items`` items of ``max_item_size`` (at most
    :data:`FRAME_ITEMS_CAP` bytes of them) plus headers."""
    return min(max_item_size * max_items, FRAME_ITEMS_CAP) + FRAME_OVERHEAD


def check_message(frame: bytes) -> tuple[str, int, int, int]:
    """Walk one message: (method name, message type, sequence id, offset of its arguments).

    Raises :class:`BadFrame` when the header cannot be read; :class:`BadArguments`
    (a subclass, carrying the header) when only the arguments are malformed.
    """
    end = len(frame)
    if end < 4:
        raise BadFrame("frame too short for a message header")
    (word,) = _U32.unpack_from(frame, 0)
    if word & 0x80000000:  # strict: version | type, name, seqid
        if word & 0xFFFF0000 != _VERSION_1:
            raise BadFrame(f"unknown protocol version {word >> 16:#x}")
        mtype = word & 0xFF
        name, pos = _string(frame, 4, end)
    else:  # old style: name, type byte, seqid
        name, pos = _string(frame, 0, end)
        if pos >= end:
            raise BadFrame("message header cut short")
        mtype = frame[pos]
        pos += 1
    if pos + 4 > end:
        raise BadFrame("message header cut short")
    (seqid,) = _I32.unpack_from(frame, pos)
    pos += 4
    try:
        method = name.decode("ascii")
    except UnicodeDecodeError:
        raise BadFrame("method name is not ASCII") from None
    try:
        last = _value(frame, pos, end, 12, 0)
    except BadFrame as e:
        raise BadArguments(method, mtype, seqid, str(e)) from None
    if last != end:
        raise BadArguments(method, mtype, seqid, f"{end - last} bytes after the arguments")
    return method, mtype, seqid, pos


class BadArguments(BadFrame):
    """The header was read but the arguments are malformed: answerable with an exception."""

    def __init__(self, method: str, mtype: int, seqid: int, problem: str) -> None:
        super().__init__(problem)
        self.method = method
        self.mtype = mtype
        self.seqid = seqid


def _string(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    if pos + 4 > end:
        raise BadFrame("string length cut short")
    (n,) = _I32.unpack_from(buf, pos)
    pos += 4
    if n < 0 or pos + n > end:
        raise BadFrame(f"string of {n} bytes does not fit")
    return buf[pos : pos + n], pos + n


def _value(buf: bytes, pos: int, end: int, ttype: int, depth: int) -> int:
    """Offset after one value of wire type ``ttype`` at ``pos`` (raises BadFrame)."""
    size = _FIXED.get(ttype)
    if size is not None:
        if pos + size > end:
            raise BadFrame("value cut short")
        return pos + size
    if ttype == 11:
        return _string(buf, pos, end)[1]
    if depth >= _MAX_DEPTH:
        raise BadFrame("nested too deeply")
    if ttype == 12:
        while True:
            if pos >= end:
                raise BadFrame("struct cut short")
            ftype = buf[pos]
            if ftype == 0:
                return pos + 1
            pos = _value(buf, pos + 3, end, ftype, depth + 1)  # type byte, i16 field id
    if ttype in (14, 15):
        if pos + 5 > end:
            raise BadFrame("list header cut short")
        etype = buf[pos]
        (n,) = _I32.unpack_from(buf, pos + 1)
        return _elements(buf, pos + 5, end, (etype,), n, depth)
    if ttype == 13:
        if pos + 6 > end:
            raise BadFrame("map header cut short")
        ktype, vtype = buf[pos], buf[pos + 1]
        (n,) = _I32.unpack_from(buf, pos + 2)
        return _elements(buf, pos + 6, end, (ktype, vtype), n, depth)
    raise BadFrame(f"unknown type {ttype}")


def _elements(buf: bytes, pos: int, end: int, types: tuple[int, ...], n: int, depth: int) -> int:
    smallest = 0
    for t in types:
        least = _FIXED.get(t) or _SMALLEST.get(t)
        if least is None:
            raise BadFrame(f"unknown element type {t}")
        smallest += least
    if n < 0 or pos + n * smallest > end:
        raise BadFrame(f"container of {n} elements does not fit")
    if len(types) == 1 and types[0] in _FIXED:
        return pos + n * smallest
    for _ in range(n):
        for t in types:
            pos = _value(buf, pos, end, t, depth + 1)
    return pos


def decode_args(frame: bytes, method: str) -> Any:
    """The arguments struct of a checked call of ``method`` (a known method)."""
    proto = _Protocol(_Buffer(frame), strict_read=False)
    proto.read_message_begin()
    args = getattr(SERVICE, method + "_args")()
    args.read(proto)
    return args


def _framed(body: bytes) -> bytes:
    return _I32.pack(len(body)) + body


def encode_reply(method: str, seqid: int, value: Any = None) -> bytes:
    """A framed REPLY to ``method`` carrying ``value`` (None for a void method)."""
    buf = _Buffer()
    proto = _Protocol(buf)
    proto.write_message_begin(method, REPLY, seqid)
    result_type = getattr(SERVICE, method + "_result")
    result = result_type() if value is None else result_type(success=value)
    result.write(proto)
    proto.write_message_end()
    return _framed(buf.getvalue())


def encode_exception(method: str, seqid: int, kind: int, message: str) -> bytes:
    """A framed application exception (thrift's TApplicationException) for a call."""
    buf = _Buffer()
    proto = _Protocol(buf)
    proto.write_message_begin(method, EXCEPTION, seqid)
    TApplicationException(kind, message).write(proto)
    proto.write_message_end()
    return _framed(buf.getvalue())


__all__ = [
    "BadArguments",
    "BadFrame",
    "CALL",
    "INTERNAL_ERROR",
    "INVALID_MESSAGE_TYPE",
    "METHODS",
    "ONEWAY",
    "PROTOCOL_ERROR",
    "UNKNOWN_METHOD",
    "check_message",
    "decode_args",
    "encode_exception",
    "encode_reply",
    "kestrel",
    "max_frame_size",
]
