"""The queue core keeps exact accounts: counts, limits, discards, expiries and timeouts
stay right through read-behind, restarts and kill -9, and what the server acknowledged
(a flush, a new reader, a discard) is on disk first.  Each test drives a real server."""

from __future__ import annotations

import os
import time

import pytest
from kestreld_process import Conn
from waiting import wait_until

SMALL = 'max_memory_size = "4KiB"\nmax_journal_size = "16KiB"\n'
NO_COMPACTION = 'checkpoint_interval = "1h"\n'
KB = "x" * 1000


def _q(c: Conn, queue: str) -> dict[str, int]:
    stats = c.stats()
    prefix = f"queue_{queue}_"
    return {
        k[len(prefix) :]: int(v)
        for k, v in stats.items()
        if k.startswith(prefix) and v.lstrip("-").isdigit()
    }


def _drain(c: Conn, key: str) -> list[bytes]:
    out = []
    while (v := c.get(key)) is not None:
        out.append(v)
    return out


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


# --- 1: counts through read-behind ------------------------------------------------------


def test_counts_stay_exact_through_read_behind(make_server):
    srv = make_server(SMALL)
    c = Conn(srv.connect())
    for i in range(30):
        assert c.set("rb", f"{i:03d}" + KB[3:]) == b"STORED"
    for left in range(29, -1, -1):
        assert c.get("rb") is not None
        s = _q(c, "rb")
        assert (s["items"], s["bytes"]) == (left, left * 1000), s
        assert s["mem_items"] <= s["items"]
    assert c.get("rb") is None
    assert c.stats()["curr_items"] == "0"


def test_max_items_holds_after_read_behind_drained(make_server):
    srv = make_server(SMALL + "max_items = 5\n")
    c = Conn(srv.connect())
    for _ in range(5):
        assert c.set("lim", KB) == b"STORED"
    assert c.set("lim", KB) == b"NOT_STORED"
    assert len(_drain(c, "lim")) == 5
    assert [c.set("lim", KB) for _ in range(6)] == [b"STORED"] * 5 + [b"NOT_STORED"]


# --- 2: a new fanout reader starts at the tail, also at a restart --------------------------


def test_reader_first_named_in_config_at_restart_starts_at_tail(make_server, tmp_path):
    srv = make_server("")
    c = Conn(srv.connect())
    for i in range(1, 4):
        assert c.set("nr", f"a{i}") == b"STORED"
    assert c.get("nr") == b"a1"
    srv.stop()
    srv.config_path.write_text('[queues."nr+new"]\n')
    srv.start()
    c = Conn(srv.connect())
    assert c.get("nr+new") is None
    assert c.set("nr", "a4") == b"STORED"
    assert _drain(c, "nr+new") == [b"a4"]
    assert _drain(c, "nr") == [b"a2", b"a3", b"a4"]


def test_deleted_configured_reader_starts_at_tail_after_restart(make_server):
    srv = make_server('[queues."dr+r"]\n')
    c = Conn(srv.connect())
    for i in range(3):
        assert c.set("dr", f"b{i}") == b"STORED"
    c.send("delete dr+r\r\n")
    assert c.line() == b"DELETED"
    srv.stop()
    srv.start()
    c = Conn(srv.connect())
    assert c.get("dr+r") is None


# --- 3: fanout_only drops the default reader ----------------------------------------------


def test_switching_to_fanout_only_drops_the_default_reader(make_server):
    srv = make_server('max_journal_size = "4KiB"\ncheckpoint_interval = "100ms"\n')
    c = Conn(srv.connect())
    for _ in range(12):
        assert c.set("fo", KB) == b"STORED"
    srv.stop()
    srv.config_path.write_text(
        'max_journal_size = "4KiB"\ncheckpoint_interval = "100ms"\n[queues.fo]\nfanout_only = true\n'
    )
    srv.start()
    c = Conn(srv.connect())
    assert c.get("fo") is None
    assert not os.path.exists(os.path.join(srv.queue_path, "fo.read."))

    # Without a reader holding them, every segment but the newest is retired.
    def segments() -> list[str]:
        return [n for n in os.listdir(srv.queue_path) if n.startswith("fo.") and ".read." not in n]

    wait_until(lambda: len(segments()) == 1, "old segments retired")


# --- 4: bytes after a restart -----------------------------------------------------------


def test_bytes_after_restart_skip_out_of_order_confirms_and_expiry_headers(make_server):
    srv = make_server(SMALL)  # read-behind: the counts come from the journal
    c = Conn(srv.connect())
    for i in range(30):
        assert c.set("by", KB, exptime=3600 if i % 2 else 0) == b"STORED"
    early = Conn(srv.connect())
    assert early.get("by/open") is not None and early.get("by/open") is not None  # ids 1, 2
    for _ in range(7):  # ids 3..9 confirmed while 1 and 2 are open: out of order
        assert c.get("by") is not None
    early.close()  # 1 and 2 go back
    wait_until(lambda: _q(c, "by")["open_transactions"] == 0, "reads given back")
    assert (_q(c, "by")["items"], _q(c, "by")["bytes"]) == (23, 23000)
    srv.stop()
    srv.start()
    c = Conn(srv.connect())
    s = _q(c, "by")
    assert (s["items"], s["bytes"]) == (23, 23000)


# --- 5: pipelined sets with discard_old_when_full -----------------------------------------


def test_pipelined_sets_discard_old_within_max_items(make_server):
    srv = make_server('max_items = 3\ndiscard_old_when_full = true\n[queues."pd+r"]\n')
    c = Conn(srv.connect())
    c.send("".join(f"set pd 0 0 2\r\nd{i}\r\n" for i in range(1, 7)))
    assert [c.line() for _ in range(6)] == [b"STORED"] * 6
    for key in ("pd", "pd+r"):
        s = _q(c, key)
        assert (s["items"], s["discarded"]) == (3, 3), (key, s)
    assert _drain(c, "pd") == [b"d4", b"d5", b"d6"]
    assert _drain(c, "pd+r") == [b"d4", b"d5", b"d6"]


# --- 6: discards, drops and expiries are journaled --------------------------------------


def test_discards_are_not_brought_back_by_kill_9(make_server):
    srv = make_server(NO_COMPACTION + "max_items = 3\ndiscard_old_when_full = true\n")
    c = Conn(srv.connect())
    for i in range(1, 6):
        assert c.set("dk", f"d{i}") == b"STORED"
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "dk") == [b"d3", b"d4", b"d5"]


def test_full_reader_drops_are_not_brought_back_by_kill_9(make_server):
    srv = make_server(NO_COMPACTION + '[queues."fr+r"]\nmax_items = 2\n')
    c = Conn(srv.connect())
    for i in range(1, 5):
        assert c.set("fr", f"f{i}") == b"STORED"
    assert _q(c, "fr+r")["discarded"] == 2
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "fr+r") == [b"f1", b"f2"]
    assert _drain(c, "fr") == [b"f1", b"f2", b"f3", b"f4"]


def test_expiries_are_not_brought_back_by_kill_9(make_server):
    srv = make_server(NO_COMPACTION + '[queues.ex]\nexpire_to_queue = "ext"\n')
    c = Conn(srv.connect())
    now = int(time.time())
    for i in range(1, 4):
        assert c.set("ex", f"x{i}", exptime=now + 1) == b"STORED"
    time.sleep(2.2)
    c.send("flush_expired ex\r\n")  # or the sweep expired them already
    assert c.line() in (b"0", b"1", b"2", b"3")
    assert _q(c, "ex")["expired_items"] == 3
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert c.get("ex") is None
    assert _drain(c, "ext") == [b"x1", b"x2", b"x3"]


# --- issue 23: flush, a new reader and expiry hand-offs ---------------------------------


def test_flush_is_durable_before_its_reply(make_server):
    srv = make_server(NO_COMPACTION)
    c = Conn(srv.connect())
    for i in range(5):
        assert c.set("fl", f"f{i}") == b"STORED"
        assert c.set("fa", f"a{i}") == b"STORED"
    c.send("flush fl\r\n")
    assert c.line() == b"END"
    assert c.set("fl", "after") == b"STORED"
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "fl") == [b"after"]
    c.send("flush_all\r\n")
    assert c.line() == b"Flushed all queues."
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert c.get("fl") is None and c.get("fa") is None


def test_reader_created_at_run_time_is_durable_before_the_next_write(make_server):
    srv = make_server(NO_COMPACTION)
    c = Conn(srv.connect())
    assert c.get("rt+r") is None
    assert c.set("rt", "x1") == b"STORED"
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert c.get("rt+r") == b"x1"
    assert c.get("rt") == b"x1"


def test_expired_aborted_item_never_goes_to_a_waiting_get(make_server):
    srv = make_server("")
    c = Conn(srv.connect())
    assert c.set("ew", "old", exptime=int(time.time()) + 1) == b"STORED"
    holder = Conn(srv.connect())
    assert holder.get("ew/open") == b"old"
    waiter = Conn(srv.connect())
    waiter.send("get ew/t=4000\r\n")
    time.sleep(2.2)
    holder.send("get ew/abort\r\n")
    assert holder.line() == b"END"
    assert waiter.read_value() is None
    assert _q(c, "ew")["expired_items"] == 1


# --- 8, 9, 10: bounded resources ----------------------------------------------------------


@pytest.mark.one_process  # the RSS of the server's one process
def test_timed_out_waiters_are_freed_behind_a_long_waiter(make_server):
    srv = make_server("")
    long_waiter = Conn(srv.connect())
    long_waiter.send("get tw/t=600000\r\n")
    c = Conn(srv.connect())
    for _ in range(200):
        assert c.get("tw/t=1") is None
    before = _rss_kib(srv.pid)
    n = 20000
    batch = "get tw/t=1\r\n" * 200
    for _ in range(n // 200):
        c.send(batch)
        for _ in range(200):
            assert c.line() == b"END"
    grown = _rss_kib(srv.pid) - before
    # 150 B per leaked waiter would be ~3 MB here.
    assert grown < 1500, f"RSS grew {grown} KiB over {n} timed-out waiters"
    assert _q(c, "tw")["waiters"] == 1


@pytest.mark.one_process  # the descriptors of the server's one process
def test_descriptors_per_queue_do_not_grow_with_segments(make_server):
    srv = make_server('max_journal_size = "4KiB"\nmax_memory_size = "8KiB"\n[queues."sg+slow"]\n')
    c = Conn(srv.connect())
    for _ in range(300):
        assert c.set("sg", KB) == b"STORED"
    base = _fds(srv.pid)
    for _ in range(300):
        assert c.get("sg+slow") is not None
        assert _fds(srv.pid) <= base + 6  # the LRU's 4, the reader's progress file
    assert _drain(c, "sg") and True


def test_flush_with_a_read_open_moves_the_head_and_gives_the_read_back_after_kill(make_server):
    srv = make_server(NO_COMPACTION + 'max_memory_size = "64KiB"\n')
    c = Conn(srv.connect())
    assert c.set("fo2", "first") == b"STORED"
    c.send("".join("set fo2 0 0 4\r\nitem\r\n" for _ in range(20000)))
    for _ in range(20000):
        assert c.line() == b"STORED"
    holder = Conn(srv.connect())
    assert holder.get("fo2/open") == b"first"
    c.send("flush fo2\r\n")
    assert c.line() == b"END"
    assert _q(c, "fo2")["items"] == 0
    progress = os.path.join(srv.queue_path, "fo2.read.")
    candidates = [n for n in os.listdir(srv.queue_path) if n.startswith("fo2.read")]
    size = sum(os.path.getsize(os.path.join(srv.queue_path, n)) for n in candidates)
    assert size < 1000, f"progress file of {size} bytes after a flush ({progress})"
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert _drain(c, "fo2") == [b"first"]


def test_an_item_expired_on_arrival_is_not_revived_by_kill_9(make_server):
    srv = make_server(NO_COMPACTION)
    c = Conn(srv.connect())
    assert c.set("ea", "keep") == b"STORED"
    assert c.set("ea", "gone", exptime=1_000_000_000) == b"STORED"  # 2001: expired already
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    assert (_q(c, "ea")["items"], _q(c, "ea")["bytes"]) == (1, 4)
    assert _drain(c, "ea") == [b"keep"]


def test_flush_noreply_is_silent(make_server):
    srv = make_server(NO_COMPACTION)
    c = Conn(srv.connect())
    assert c.set("fn", "a") == b"STORED"
    assert c.set("fm", "b") == b"STORED"
    c.send("flush fn noreply\r\nversion\r\n")
    assert c.line().startswith(b"VERSION")
    assert c.get("fn") is None and _q(c, "fn")["items"] == 0
    c.send("flush_all noreply\r\nversion\r\n")
    assert c.line().startswith(b"VERSION")
    assert c.get("fm") is None
