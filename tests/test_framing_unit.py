"""The memcache framing on its own (sans-IO): bytes in, requests handed to a sink.

A recording sink stands where the connection does; the command table is a
small real one (a line command, a storage command, memcached's noreply rule).
Runs against whichever implementation is loaded (compiled or Python).
"""

from __future__ import annotations

import pytest

from kestreld.protocol.framing import (
    GO,
    KEEP,
    LATER,
    SKIP,
    STOP,
    STORAGE,
    Command,
    Framing,
    Sink,
)
from kestreld.protocol.replies import BAD_COMMAND_LINE, BAD_DATA_CHUNK, LINE_TOO_LONG


def _noop(*args):
    return None


GET = Command(b"get", _noop)
DELETE = Command(b"delete", _noop, noreply_after=2)
SET = Command(b"set", _noop, shape=STORAGE, noreply_after=5, accept=_noop)
UNKNOWN = Command(b"", _noop)
TABLE = {c.word: c for c in (GET, DELETE, SET)}


class Recorder(Sink):
    """Records what the framing hands over; answers with scripted verdicts."""

    def __init__(self) -> None:
        self.events: list[tuple] = []
        self.verdicts: list[int] = []  # for request(), in order; GO when empty
        self.keep = True  # block_header's answer: KEEP or SKIP

    def request(self, command, args, quiet):
        self.events.append(("request", command.word, list(args), quiet))
        return self.verdicts.pop(0) if self.verdicts else GO

    def block_header(self, command, args, size, quiet):
        self.events.append(("header", command.word, size, quiet))
        return KEEP if self.keep else SKIP

    def block(self, command, args, data, quiet):
        self.events.append(("block", command.word, bytes(data), quiet))
        return GO

    def bad_block(self, quiet):
        self.events.append(("bad_block", quiet))

    def fatal(self, reply):
        self.events.append(("fatal", reply))


@pytest.fixture
def wire():
    framing = Framing(TABLE, UNKNOWN, 64)
    sink = Recorder()

    def feed(data: bytes) -> None:
        ready = framing.receive(data) if framing.holds_input() else data
        if ready is not None:
            framing.parse(sink, ready)

    return framing, sink, feed


def test_a_whole_line_is_one_request(wire):
    framing, sink, feed = wire
    feed(b"get q\r\n")
    assert sink.events == [("request", b"get", [b"get", b"q"], False)]
    assert not framing.holds_input() and not framing.mid_request()


def test_a_line_sent_byte_by_byte_is_one_request(wire):
    framing, sink, feed = wire
    for byte in b"get q/open\r\n":
        feed(bytes([byte]))
    assert sink.events == [("request", b"get", [b"get", b"q/open"], False)]


def test_a_bare_newline_ends_a_line(wire):
    _, sink, feed = wire
    feed(b"get a\nget b\n")
    assert [e[2][1] for e in sink.events] == [b"a", b"b"]


def test_an_unknown_word_goes_to_the_unknown_entry(wire):
    _, sink, feed = wire
    feed(b"bogus x\r\n")
    assert sink.events == [("request", b"", [b"bogus", b"x"], False)]


def test_command_words_are_case_insensitive(wire):
    _, sink, feed = wire
    feed(b"GET q\r\n")
    assert sink.events[0][1] == b"get"


def test_noreply_only_where_memcached_allows_it(wire):
    _, sink, feed = wire
    feed(b"delete q noreply\r\nget q noreply\r\n")
    assert [e[3] for e in sink.events] == [True, False]


def test_a_kept_block_is_handed_over_whole(wire):
    _, sink, feed = wire
    feed(b"set q 0 0 5\r\nhel")
    feed(b"lo\r\nget q\r\n")
    assert sink.events == [
        ("header", b"set", 5, False),
        ("block", b"set", b"hello", False),
        ("request", b"get", [b"get", b"q"], False),
    ]


def test_block_bytes_are_never_taken_for_a_command(wire):
    _, sink, feed = wire
    feed(b"set q 0 0 9\r\nget x\r\nab\r\n")
    assert [e[0] for e in sink.events] == ["header", "block"]
    assert sink.events[1][2] == b"get x\r\nab"


def test_a_large_block_arriving_in_pieces_is_joined_once(wire):
    framing, sink, feed = wire
    data = b"x" * 200_000
    feed(b"set q 0 0 200000\r\n")
    for i in range(0, len(data), 7000):
        feed(data[i : i + 7000])
        assert framing.mid_request() or sink.events[-1][0] == "block"
    feed(b"\r\n")
    assert sink.events[-1] == ("block", b"set", data, False)


def test_a_skipped_block_is_dropped_and_the_next_request_parsed(wire):
    _, sink, feed = wire
    sink.keep = False
    feed(b"set q 0 0 5\r\nhe")
    feed(b"llo\r\nget q\r\n")
    assert sink.events == [("header", b"set", 5, False), ("request", b"get", [b"get", b"q"], False)]


def test_a_block_without_its_terminator_is_a_bad_chunk_and_its_line_is_dropped(wire):
    _, sink, feed = wire
    feed(b"set q 0 0 2\r\nabcd\r\nget q\r\n")
    assert sink.events == [
        ("header", b"set", 2, False),
        ("bad_block", False),
        ("request", b"get", [b"get", b"q"], False),
    ]


def test_a_line_too_long_is_fatal(wire):
    _, sink, feed = wire
    feed(b"get " + b"q" * 100)
    assert sink.events == [("fatal", LINE_TOO_LONG)]


def test_a_negative_length_is_fatal(wire):
    _, sink, feed = wire
    feed(b"set q 0 0 -1\r\n")
    assert sink.events == [("fatal", BAD_DATA_CHUNK)]


def test_a_missing_length_is_fatal(wire):
    _, sink, feed = wire
    feed(b"set q 0\r\n")
    assert sink.events == [("fatal", BAD_COMMAND_LINE)]


def test_later_keeps_the_request_for_when_the_sink_resumes(wire):
    framing, sink, feed = wire
    sink.verdicts = [GO, LATER]
    feed(b"get a\r\nget b\r\nget c\r\n")
    assert [e[2][1] for e in sink.events] == [b"a", b"b"]
    kept = framing.take_input()
    assert kept == b"get b\r\nget c\r\n"
    assert not framing.holds_input()
    framing.parse(sink, kept)
    assert [e[2][1] for e in sink.events] == [b"a", b"b", b"b", b"c"]


def test_stop_keeps_what_follows_unread_even_a_line_too_long(wire):
    framing, sink, feed = wire
    sink.verdicts = [STOP]
    feed(b"get a\r\n" + b"z" * 100)
    assert sink.events == [("request", b"get", [b"get", b"a"], False)]
    assert framing.holds_input()
    framing.parse(sink, framing.take_input())
    assert sink.events[-1] == ("fatal", LINE_TOO_LONG)


def test_keep_holds_input_until_taken(wire):
    framing, sink, _ = wire
    framing.keep(b"get q\r\n")
    assert framing.holds_input() and framing.mid_request()
    assert framing.take_input() == b"get q\r\n"
    assert framing.take_input() == b""
    assert sink.events == []
