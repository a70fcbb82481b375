"""Confirms are acknowledged like puts: once the reply is read, kill -9 cannot bring
the item back; with ``sync_journal = 0`` the acknowledgement waits for an fsync that
sets share.  The crash campaign (test_reliability_crash.py) does this under load;
these are the single, deterministic cases."""

from __future__ import annotations

import pytest
from kestreld_process import Conn
from metrics_scrape import METRICS_CONFIG, scrape, value

# No rewrite of the progress file during a test: the appended confirms alone must hold.
NO_COMPACTION = 'checkpoint_interval = "1h"\n'


def _fill(c: Conn, queue: str, n: int) -> None:
    for i in range(n):
        assert c.set(queue, f"{queue}{i}") == b"STORED"


def _drain(c: Conn, queue: str) -> list[bytes]:
    out = []
    while (v := c.get(queue)) is not None:
        out.append(v)
    return out


@pytest.mark.parametrize("sync", ["", "sync_journal = 0\n", 'sync_journal = "50ms"\n'])
def test_every_form_of_confirm_survives_kill_9_right_after_its_reply(make_server, sync):
    srv = make_server(NO_COMPACTION + sync)
    c = Conn(srv.connect())
    _fill(c, "d", 10)
    assert c.get("d") == b"d0"  # plain get
    assert c.get("d/open") == b"d1"
    assert c.get("d/close/open") == b"d2"  # closes d1
    assert c.get("d/close") is None  # closes d2
    other = Conn(srv.connect())
    assert other.get("d/open") == b"d3"
    assert other.get("d/open") == b"d4"
    other.send("confirm d 2\r\n")
    assert other.line() == b"END"
    assert c.get("d/open") == b"d5"  # open at the kill: comes back
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "d") == [b"d5", b"d6", b"d7", b"d8", b"d9"]


def test_fanout_readers_keep_their_own_confirms_through_a_kill(make_server):
    srv = make_server(NO_COMPACTION + '[queues."f+a"]\n[queues."f+b"]\n')
    c = Conn(srv.connect())
    _fill(c, "f", 4)
    assert [c.get("f+a") for _ in range(3)] == [b"f0", b"f1", b"f2"]
    assert c.get("f+b/open") == b"f0"
    assert c.get("f+b/close") is None
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "f+a") == [b"f3"]
    assert _drain(c, "f+b") == [b"f1", b"f2", b"f3"]
    assert _drain(c, "f") == [b"f0", b"f1", b"f2", b"f3"]


def test_close_acknowledgements_share_fsyncs_with_sets_under_sync_journal_0(make_server):
    srv = make_server(METRICS_CONFIG + NO_COMPACTION + "sync_journal = 0\n")
    producer = Conn(srv.connect())
    consumers = [Conn(srv.connect()) for _ in range(40)]
    _fill(producer, "g", len(consumers))
    for c in consumers:
        assert c.get("g/open") is not None
    before = value(scrape(srv), "kestreld_fsync_latency_seconds_count")
    # Everything at once: 40 closes on 40 connections and 40 pipelined sets.
    for c in consumers:
        c.send("get g/close\r\n")
    producer.send(b"".join(b"set g 0 0 1\r\nx\r\n" for _ in range(40)))
    for c in consumers:
        assert c.line() == b"END"
    assert [producer.line() for _ in range(40)] == [b"STORED"] * 40
    fsyncs = value(scrape(srv), "kestreld_fsync_latency_seconds_count") - before
    # Each of the 80 acknowledgements waited for an fsync; group commit shares them.
    assert 1 <= fsyncs <= 40, fsyncs
    srv.kill()
    srv.start()
    assert _drain(Conn(srv.connect()), "g") == [b"x"] * 40
