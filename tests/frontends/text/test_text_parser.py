"""The text protocol's parser, without a socket: bytes in, requests and errors out."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from kestreld.frontends.text.parser import TextError, TextParser, TextRequest


def parser(max_line: int = 64, max_item: int = 128, max_items: int = 4) -> TextParser:
    return TextParser(max_line, max_item, max_items)


def test_a_line_is_a_request_with_lower_case_command_and_words():
    assert parser().feed(b"GET work 500\n") == [TextRequest(b"get", [b"work", b"500"])]


def test_a_carriage_return_before_the_newline_is_dropped():
    assert parser().feed(b"peek work\r\n") == [TextRequest(b"peek", [b"work"])]


def test_a_request_split_across_packets_comes_out_once_complete():
    p = parser()
    assert p.feed(b"get f") == []
    assert p.feed(b"oo 10") == []
    assert p.feed(b"0\n") == [TextRequest(b"get", [b"foo", b"100"])]


def test_put_collects_item_lines_until_the_empty_line():
    p = parser()
    assert p.feed(b"put work 1000:\nhello\r\n") == []
    assert p.feed(b"world\n\n") == [TextRequest(b"put", [b"work", b"1000"], [b"hello", b"world"])]


def test_put_with_no_items_is_a_put_of_nothing():
    assert parser().feed(b"put work:\n\n") == [TextRequest(b"put", [b"work"], [])]


def test_items_keep_their_bytes_including_colons_and_non_ascii():
    [req] = parser().feed(b"put q:\n:a: b\xff\n\n")
    assert req.items == [b":a: b\xff"]


def test_too_many_items_is_one_error_and_the_stream_stays_in_step():
    p = parser(max_items=2)
    events = p.feed(b"put q:\na\nb\nc\nd\n\nget q\n")
    assert events == [
        TextError("Too many items in one put (at most 2)."),
        TextRequest(b"get", [b"q"]),
    ]


def test_an_empty_line_is_a_request_with_no_command():
    assert parser().feed(b"\n") == [TextRequest(b"", [])]


def test_a_request_line_over_the_limit_is_fatal_and_ends_parsing():
    p = parser(max_line=10)
    events = p.feed(b"get " + b"x" * 20 + b"\nget q\n")
    assert len(events) == 1 and events[0].fatal
    assert p.feed(b"get q\n") == []


def test_an_unterminated_line_over_the_limit_is_fatal_before_its_end_arrives():
    p = parser(max_line=10)
    [event] = p.feed(b"g" * 30)
    assert isinstance(event, TextError) and event.fatal
    assert p.pending == 0


def test_item_lines_may_be_longer_than_request_lines():
    p = parser(max_line=10, max_item=100)
    assert p.feed(b"put q:\n" + b"i" * 50 + b"\n\n") == [TextRequest(b"put", [b"q"], [b"i" * 50])]


def test_an_item_over_its_limit_is_fatal():
    p = parser(max_line=10, max_item=20)
    [event] = p.feed(b"put q:\n" + b"i" * 30 + b"\n\n")
    assert event.fatal and "Item" in event.message


def test_a_long_line_arriving_in_small_pieces_is_not_rescanned():
    p = parser(max_line=10, max_item=1 << 20)
    p.feed(b"put q:\n")
    for _ in range(100):
        assert p.feed(b"x" * 1000) == []
    assert p.scanned == 100_000
    assert p.feed(b"\n\n") == [TextRequest(b"put", [b"q"], [b"x" * 100_000])]


@given(st.lists(st.binary(max_size=40), max_size=20), st.data())
def test_any_split_of_a_stream_gives_the_same_requests(chunks, data):
    stream = b"".join(chunks)
    whole = parser().feed(stream)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=6)))
    p = parser()
    pieces = []
    last = 0
    for cut in cuts + [len(stream)]:
        pieces += p.feed(stream[last:cut])
        last = cut
    assert pieces == whole
