"""The memcache framing on its own (sans-IO): bytes in, requests handed to a sink.

A recording sink stands where the connection does; the command table is a
small real one (a line command, a storage command, memcached's noreply rule).
Runs against whichever implementation is loaded (compiled or Python).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kestreld.frontends.memcache import framing as framing_module
from kestreld.frontends.memcache.codes import GO, KEEP, LATER, SKIP, STOP, STORAGE
from kestreld.frontends.memcache.framing import Command, Framing, Sink
from kestreld.frontends.memcache.replies import BAD_COMMAND_LINE, BAD_DATA_CHUNK, LINE_TOO_LONG


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


#: Bytes a request line may hold around its words: every ASCII whitespace, a stray \r,
#: bytes above 127 (not whitespace for bytes.split) and a NUL.
_LINE_BYTES = st.binary(max_size=40).map(
    lambda b: bytes(b" \t\x0b\x0c\rab\x85\xa0\x00"[x % 10] for x in b)
)


@given(_LINE_BYTES)
def test_a_line_splits_into_its_words_as_bytes_split_does(line):
    framing = Framing(TABLE, UNKNOWN, 64)
    sink = Recorder()
    framing.parse(sink, b"get " + line + b"\n")
    words = (b"get " + line).split()
    assert sink.events == [("request", b"get", words, False)]


@given(_LINE_BYTES, st.integers(0, 45), st.integers(0, 45))
def test_the_compiled_splitter_is_bytes_split_on_any_range(line, pos, stop):
    """(The plain build's _split_words is bytes.split itself: this holds the compiled one.)"""
    stop = min(stop, len(line))
    pos = min(pos, stop)
    assert framing_module._split_words(line, pos, stop) == line[pos:stop].split()


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


# --- get keys: parsed once per distinct key, a fresh Fetch per request -------------------------


def test_a_repeated_get_key_gives_a_fresh_fetch_with_the_same_options():
    from kestreld.frontends.memcache import commands
    from kestreld.session.fetch import MISS, Fetch

    first = commands.parse_get(b"jobs/close/open/t=250")
    assert isinstance(first, Fetch)
    assert (first.name, first.close, first.open, first.timeout) == ("jobs", True, True, 250)
    first.with_id, first.outcome, first.item = True, 0, object()  # what a request does to it
    again = commands.parse_get(b"jobs/close/open/t=250")
    assert again is not first and isinstance(again, Fetch)
    assert (again.name, again.close, again.open, again.abort, again.peek) == (
        "jobs", True, True, False, False,
    )  # fmt: skip
    assert (again.timeout, again.key, again.with_id) == (250, b"jobs/close/open/t=250", False)
    assert (again.outcome, again.item, again.reply, again.behind, again.reader) == (
        MISS, None, None, None, None,
    )  # fmt: skip


def test_a_bad_get_key_is_answered_the_same_every_time_and_the_cache_stays_bounded():
    from kestreld.frontends.memcache import commands

    bad = commands.parse_get(b"q/t=soon")
    assert bad == commands.parse_get(b"q/t=soon") and bad.startswith(b"CLIENT_ERROR bad timeout")
    assert commands.parse_get(b"../etc/open") == commands.BAD_QUEUE_NAME
    for i in range(commands._GET_CACHE_LIMIT + 10):
        commands.parse_get(b"q%d/open" % i)
    assert len(commands._GET_CACHE) <= commands._GET_CACHE_LIMIT
    assert commands.parse_get(b"q7/open").name == "q7"


def test_a_command_runs_its_handlers_through_its_own_methods():
    """What the connection calls (compiled: through the vtable): a plain Command's methods
    run the handlers in its fields; the table's get and set override them (commands.py)."""
    calls = []
    sink = Recorder()

    def run(conn, args, *block):
        calls.append(("run", conn, list(args), block))

    def accept(conn, args, size):
        calls.append(("accept", conn, size))
        return size < 10

    command = Command(b"put", run, shape=STORAGE, accept=accept)
    assert command.accept_block(sink, [b"put", b"q"], 3) is True
    assert command.accept_block(sink, [b"put", b"q"], 30) is False
    command.run_block(sink, [b"put", b"q"], b"abc")
    command.run_line(sink, [b"put"])
    assert calls == [
        ("accept", sink, 3),
        ("accept", sink, 30),
        ("run", sink, [b"put", b"q"], (b"abc",)),
        ("run", sink, [b"put"], ()),
    ]


def test_the_tables_get_and_set_keep_their_handlers_in_their_fields():
    from kestreld.frontends.memcache.auth import LOCKED
    from kestreld.frontends.memcache.commands import COMMANDS, accept_set, cmd_get, cmd_set

    # auth.py builds its tables from these fields (a plain Command each): they must stay
    # the handlers the table's own methods call.
    assert COMMANDS[b"get"].run is cmd_get and COMMANDS[b"gets"].run is cmd_get
    assert COMMANDS[b"set"].run is cmd_set and COMMANDS[b"set"].accept is accept_set
    assert type(LOCKED[b"get"]) is Command
