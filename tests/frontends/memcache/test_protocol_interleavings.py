"""Hypothesis: random interleavings of command words, with and without data blocks.

Each example is a stream of requests on one connection: storage and meta
commands carrying payloads (destructive commands, binary, CRLFs), memcached
commands a queue does not support, unknown words, ``set``/``get`` of its own
queue, in any letter case, with ``noreply`` where memcached allows it and
CRLF or bare LF line ends.  The replies are predicted exactly from a model of
the example's queue, and a bystander's set/get around each example stays
exact: no payload ever runs, the stream never leaves step.

Words with a server-wide effect when sent as a request (``flush_all``,
``shutdown``, ``status``, ``delete`` of another queue) are left out of the
request words, since running them would be right; they are in the payloads.
"""

from __future__ import annotations

import itertools
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kestreld_process import Conn

BLOCK_WORDS = ["set", "add", "replace", "append", "prepend", "cas", "ms"]
LINE_WORDS = ["incr", "decr", "touch", "gat", "gats", "mg", "md", "ma", "mn", "me", "verbosity"]
NOREPLY_AFTER = {"incr": 3, "decr": 3, "touch": 3, "verbosity": 2}
KNOWN = set(BLOCK_WORDS + LINE_WORDS) | {
    "get", "gets", "delete", "flush", "flush_all", "flush_expired", "flush_all_expired",
    "confirm", "monitor", "stats", "dump_stats", "dump_config", "reload", "version",
    "shutdown", "quit", "status", "watch", "lru", "slabs", "lru_crawler", "cache_memlimit",
}  # fmt: skip
PAYLOADS = [b"flush_all", b"shutdown", b"delete bystander", b"quit", b"set bystander 0 0 1\r\nz"]

_examples = itertools.count()

payloads = st.one_of(st.sampled_from(PAYLOADS), st.binary(max_size=40))
unknown_words = st.from_regex(r"[a-z_]{1,12}", fullmatch=True).filter(lambda w: w not in KNOWN)
cases = st.sampled_from(["lower", "upper", "title"])


def _case(word: str, case: str) -> str:
    return getattr(word, case)()


@st.composite
def requests(draw):
    kind = draw(st.sampled_from(["block", "line", "unknown", "get"]))
    case = draw(cases)
    noreply = draw(st.booleans())
    return (
        kind,
        case,
        noreply,
        draw(payloads),
        draw(st.sampled_from(BLOCK_WORDS)),
        draw(st.sampled_from(LINE_WORDS)),
        draw(unknown_words),
        draw(st.sampled_from([b"\r\n", b"\n"])),
    )


def _build(queue: str, reqs) -> tuple[bytes, list[bytes]]:
    """The bytes of the stream and the exact reply it must get."""
    model: list[bytes] = []
    wire = bytearray()
    expect: list[bytes] = []
    for kind, case, noreply, payload, bword, lword, uword, eol in reqs:
        if kind == "block":
            word = _case(bword, case)
            n = len(payload)
            if bword == "ms":
                line = f"{word} {queue} {n} T0"
                noreply = False  # meta commands have flags, not noreply
            elif bword == "cas":
                line = f"{word} {queue} 0 0 {n} 7"
            else:
                line = f"{word} {queue} 0 0 {n}"
            if noreply:
                line += " noreply"
            wire += line.encode() + eol + payload + eol
            if bword == "set":
                model.append(payload)
                if not noreply:
                    expect.append(b"STORED\r\n")
            elif not noreply:
                expect.append(
                    f"CLIENT_ERROR {bword} is not supported by a queue server\r\n".encode()
                )
        elif kind == "line":
            word = _case(lword, case)
            args = {"incr": "k 1", "decr": "k 1", "touch": "k 10", "verbosity": "1"}.get(lword, "k")
            quiet = noreply and lword in NOREPLY_AFTER
            wire += f"{word} {args}{' noreply' if quiet else ''}".encode() + eol
            if not quiet:
                expect.append(
                    f"CLIENT_ERROR {lword} is not supported by a queue server\r\n".encode()
                )
        elif kind == "unknown":
            wire += f"{_case(uword, case)} {queue}".encode() + eol
            expect.append(f"CLIENT_ERROR unknown command {uword}\r\n".encode())
        else:
            wire += f"{_case('get', case)} {queue}".encode() + eol
            if model:
                item = model.pop(0)
                expect.append(b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (queue.encode(), len(item), item))
            else:
                expect.append(b"END\r\n")
    return bytes(wire), expect


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(reqs=st.lists(requests(), min_size=1, max_size=25))
def test_random_interleavings_are_answered_exactly_and_a_bystander_is_untouched(server, reqs):
    queue = f"hq{next(_examples)}"
    bystander = Conn(server.connect())
    try:
        assert bystander.set("bystander", "before") == b"STORED"
        wire, expect = _build(queue, reqs)
        c = Conn(server.connect())
        try:
            c.send(wire + b"version\r\n")
            want = b"".join(expect)
            got = c.exact(len(want))
            assert got == want
            assert re.fullmatch(rb"VERSION \S+", c.line())
        finally:
            c.close()
        assert bystander.set("bystander", "after") == b"STORED"
        assert bystander.get("bystander") == b"before"
        assert bystander.get("bystander") == b"after"
        assert bystander.get("bystander") is None
    finally:
        bystander.close()
    assert server.proc.poll() is None
