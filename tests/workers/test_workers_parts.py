"""The parts of ``workers = N`` (kestreld/workers/): ownership, the channel's reply framing,
the box's stats, the text and thrift requests sent on (sans-IO), and a channel connection on
the event loop."""

from __future__ import annotations

import asyncio
import os
import zlib

import pytest
import uvloop

from kestreld.config import ConfigError
from kestreld.config.model import available_cores, build_config
from kestreld.frontends.text.parser import TextParser
from kestreld.frontends.thrift import codec
from kestreld.workers.box_stats import merge_dump, merge_stats
from kestreld.workers.ownership import Ownership, owner_of
from kestreld.workers.text_routing import text_request
from kestreld.workers.thrift_routing import is_exception
from kestreld.workers.upstream import (
    LIST,
    MONITOR,
    ONE,
    Upstream,
    item_end,
    reply_end,
    whole_items_end,
)


def test_owner_is_crc32_of_the_name_mod_the_worker_count():
    for name in ("jobs", "orders", "a", "photos_resize"):
        assert owner_of(name, 4) == zlib.crc32(name.encode()) % 4
        assert owner_of(name.encode(), 4) == owner_of(name, 4)


def test_a_fanout_reader_lives_with_its_queue():
    for n in (2, 3, 16):
        assert owner_of("orders+audit", n) == owner_of("orders", n)


def test_one_worker_owns_everything():
    assert owner_of("anything", 1) == 0
    assert Ownership(0, 1).owns("anything")


def test_every_name_has_exactly_one_owner():
    workers = [Ownership(i, 3) for i in range(3)]
    for name in (f"q{i}" for i in range(100)):
        assert sum(w.owns(name) for w in workers) == 1


def test_workers_defaults_to_one():
    assert build_config({}).workers == 1


def test_workers_auto_is_the_cores_this_process_may_use():
    assert build_config({"workers": "auto"}).workers == available_cores()


@pytest.mark.parametrize("bad", [0, -1, "many", 1.5, True])
def test_workers_must_be_a_count_or_auto(bad):
    with pytest.raises(ConfigError, match="workers"):
        build_config({"workers": bad})


def test_a_reply_ends_after_its_values_and_one_line():
    buf = b"VALUE q 0 5\r\nhel\r\n\r\nEND\r\nSTORED\r\n"
    end = reply_end(buf, 0, ONE)
    assert buf[:end] == b"VALUE q 0 5\r\nhel\r\n\r\nEND\r\n"
    assert reply_end(buf, end, ONE) == len(buf)


def test_a_reply_cut_short_is_not_complete():
    assert reply_end(b"VALUE q 0 5\r\nhel", 0, ONE) == -1
    assert reply_end(b"STORE", 0, ONE) == -1


def test_a_list_reply_runs_to_end_or_an_error():
    assert reply_end(b"STAT a 1\r\nSTAT b 2\r\nEND\r\nX", 0, LIST) == 25
    assert reply_end(b"STAT a 1\r\n", 0, LIST) == -1
    assert reply_end(b"SERVER_ERROR no\r\n", 0, LIST) == 17


def _stats(**values: int) -> bytes:
    return "".join(f"STAT {k} {v}\r\n" for k, v in values.items()).encode() + b"END\r\n"


def test_box_stats_sum_the_counts_and_keep_each_queues_lines():
    one = _stats(uptime=5, curr_items=2, curr_connections=3, total_connections=4,
                 worker_channel_connections=1, worker_channel_connections_total=1,
                 queue_a_items=2)  # fmt: skip
    two = _stats(uptime=7, curr_items=5, curr_connections=2, total_connections=2,
                 worker_channel_connections=1, worker_channel_connections_total=2,
                 queue_b_items=5)  # fmt: skip
    merged = merge_stats([one, two], 1).decode()
    lines = dict(line.split(" ", 2)[1:] for line in merged.split("\r\n") if line.startswith("STAT"))
    assert lines["curr_items"] == "7"
    assert lines["uptime"] == "5"  # the first worker's
    assert lines["curr_connections"] == "5"  # each worker's counts its clients only
    assert lines["total_connections"] == "6"
    assert lines["queue_a_items"] == "2" and lines["queue_b_items"] == "5"
    assert lines["worker"] == "1" and lines["workers"] == "2"
    assert "worker_channel_connections" not in lines
    assert merged.endswith("END\r\n")


def test_box_stats_say_how_many_workers_answered():
    merged = merge_stats([b"STAT curr_items 1\r\nEND\r\n", None], 0).decode()
    assert "STAT workers 2\r\n" in merged and "STAT workers_answering 1\r\n" in merged


def test_box_dumps_list_each_block_once_by_name():
    one = b"queue 'b' {\r\n  items=1\r\n}\r\nalias 'x' {\r\n  d=1\r\n}\r\nEND\r\n"
    two = b"queue 'a' {\r\n  items=2\r\n}\r\nalias 'x' {\r\n  d=1\r\n}\r\nEND\r\n"
    merged = merge_dump([one, two]).decode()
    assert merged.index("'a'") < merged.index("'b'") < merged.index("'x'")
    assert merged.count("alias 'x'") == 1
    assert merged.endswith("}\r\nEND\r\n")


def test_a_monitor_reply_runs_through_its_items_to_the_last_end():
    buf = b"VALUE m 0 2\r\nM1\r\nEND\r\nVALUE m 0 2\r\nM2\r\nEND\r\nEND\r\nSTORED\r\n"
    assert reply_end(buf, 0, MONITOR) == len(buf) - len(b"STORED\r\n")
    assert reply_end(b"END\r\n", 0, MONITOR) == 5


def test_a_text_request_is_sent_on_as_the_client_wrote_it():
    wire = b"put jobs 500:\none\ntwo\n\nget jobs 100\n"
    parser = TextParser(1024, 1024)
    requests = parser.feed(wire)
    assert b"".join(text_request(r) for r in requests) == wire
    again = TextParser(1024, 1024).feed(wire)
    assert again == requests


def test_a_thrift_reply_frame_says_whether_it_is_an_exception():
    assert is_exception(codec.encode_exception("put", 3, codec.INTERNAL_ERROR, "no"))
    assert not is_exception(codec.encode_reply("put", 3, 1))


def test_a_monitor_cut_short_keeps_only_its_whole_items():
    item = b"VALUE m 0 2\r\nM1\r\nEND\r\n"
    assert whole_items_end(item + item) == 2 * len(item)
    assert whole_items_end(item + b"VALUE m 0 2\r\nM2\r\n") == len(item)
    assert whole_items_end(item[:-3]) == 0
    assert whole_items_end(b"") == 0


def test_a_channel_connection_closed_while_it_connects_closes_no_later_descriptor(tmp_path):
    """The client leaves while its channel to the owner connects: the channel's descriptor
    is closed once, never again after its number went to another file (a connection's, in
    a worker: the worker then aborted in libuv)."""
    path = str(tmp_path / "worker-1.sock")
    opened: list[int] = []

    class Leaving(Upstream):
        def connection_made(self, transport):
            self.close()  # the client left before the channel was made
            super().connection_made(transport)
            # Runs after the loop closed the channel: the next descriptor gets its number.
            loop = asyncio.get_running_loop()
            loop.call_soon(lambda: opened.append(os.open(os.devnull, os.O_RDONLY)))

    async def main() -> None:
        server = await asyncio.get_running_loop().create_unix_server(asyncio.Protocol, path)
        Leaving(1, path).open(asyncio.get_running_loop())
        for _ in range(10):
            await asyncio.sleep(0.01)
        server.close()

    uvloop.run(main())
    try:
        os.fstat(opened[0])  # still open: nobody closed it for the channel
    finally:
        os.close(opened[0])


def test_a_monitor_item_is_whole_once_its_end_arrived():
    item = b"VALUE m 0 5\r\nEND\r\n\r\nEND\r\n"  # its data is an END line: sizes decide
    assert item_end(item + b"VALUE m 0 2\r\nM", 0) == len(item)
    assert item_end(item[:-3], 0) == -1  # not all here yet
    assert item_end(b"END\r\n", 0) == -1  # the monitor's own end: not an item
