"""Kestrel queue semantics through a real server: blocking gets, reliable reads,
fanout, expiry and limits."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from kestreld_process import Conn
from waiting import stat, wait_until, wait_waiters

# --- blocking gets and hand-off ---------------------------------------------------------


def test_blocking_get_times_out_on_time(conn, qname):
    for timeout_ms in (50, 200):
        start = time.monotonic()
        assert conn.get(f"{qname}/t={timeout_ms}") is None
        elapsed = (time.monotonic() - start) * 1000
        # Never early; late only by scheduling, which a loaded 2-core machine stretches
        # (the margin holds at load average 4; the timer itself is ms-accurate).
        assert timeout_ms - 1 <= elapsed <= timeout_ms + 400


def test_blocking_get_receives_item_put_while_waiting(server, qname):
    waiter = Conn(server.connect())
    waiter.send(f"get {qname}/t=5000\r\n")
    wait_waiters(server, qname, 1)
    producer = Conn(server.connect())
    start = time.monotonic()
    assert producer.set(qname, "wake") == b"STORED"
    assert waiter.read_value() == b"wake"
    assert time.monotonic() - start < 4, "woken by the put, not by its 5 s timeout"


def test_waiters_are_served_in_fifo_order(server, qname):
    waiters = []
    for _ in range(5):
        c = Conn(server.connect())
        c.send(f"get {qname}/t=5000\r\n")
        waiters.append(c)
        wait_waiters(server, qname, len(waiters))  # they arrive in this order
    producer = Conn(server.connect())
    for i in range(5):
        producer.set(qname, f"{i}")
    assert [w.read_value() for w in waiters] == [b"0", b"1", b"2", b"3", b"4"]


def test_disconnected_waiter_never_swallows_an_item(server, qname):
    dead = Conn(server.connect())
    dead.send(f"get {qname}/t=10000\r\n")
    wait_waiters(server, qname, 1)
    dead.sock.close()
    wait_waiters(server, qname, 0)
    live = Conn(server.connect())
    live.send(f"get {qname}/t=5000\r\n")
    wait_waiters(server, qname, 1)
    Conn(server.connect()).set(qname, "precious")
    assert live.read_value() == b"precious"


def test_requests_after_a_blocking_get_wait_for_it(conn, server, qname):
    conn.send(f"get {qname}/t=5000\r\nversion\r\n")
    wait_waiters(server, qname, 1)
    Conn(server.connect()).set(qname, "first")
    assert conn.read_value() == b"first"
    assert conn.line().startswith(b"VERSION")


def test_thousand_waiting_clients_ten_thousand_items_each_delivered_once(server, qname):
    n_clients, n_items = 1000, 10_000
    received: list[bytes] = []
    lock = threading.Lock()
    socks = []
    for _ in range(n_clients):
        s = server.connect(timeout=60)
        socks.append(s)

    def consume(group: list[socket.socket]) -> None:
        conns = [Conn(s) for s in group]
        mine = []
        active = list(conns)
        while active:
            for c in active:
                c.send(f"get {qname}/t=1500\r\n")
            still = []
            for c in active:
                v = c.read_value()
                if v is not None:
                    mine.append(v)
                    still.append(c)
            active = still
        with lock:
            received.extend(mine)

    groups = [socks[i::20] for i in range(20)]
    threads = [threading.Thread(target=consume, args=(g,)) for g in groups]
    for t in threads:
        t.start()
    time.sleep(0.3)
    producer = Conn(server.connect())
    payload = b"".join(f"set {qname} 0 0 6\r\n{i:06d}\r\n".encode() for i in range(n_items))
    producer.send(payload)
    for _ in range(n_items):
        assert producer.line() == b"STORED"
    for t in threads:
        t.join(120)
    assert sorted(received) == [f"{i:06d}".encode() for i in range(n_items)]
    for s in socks:
        s.close()


# --- reliable reads -----------------------------------------------------------------------


def test_open_then_close_confirms(conn, qname):
    conn.set(qname, "job")
    assert conn.get(f"{qname}/open") == b"job"
    assert conn.get(f"{qname}/close") is None
    assert conn.stats()[f"queue_{qname}_open_transactions"] == "0"
    assert conn.get(qname) is None


def test_close_open_confirms_previous_and_opens_next(conn, qname):
    for i in range(3):
        conn.set(qname, f"j{i}")
    assert conn.get(f"{qname}/open") == b"j0"
    assert conn.get(f"{qname}/close/open") == b"j1"
    assert conn.get(f"{qname}/open/close") == b"j2"
    stats = conn.stats()
    assert stats[f"queue_{qname}_open_transactions"] == "1"
    assert stats[f"queue_{qname}_items"] == "0"


def test_abort_returns_item_to_head(conn, qname):
    conn.set(qname, "a")
    conn.set(qname, "b")
    assert conn.get(f"{qname}/open") == b"a"
    assert conn.get(f"{qname}/abort") is None
    assert conn.get(qname) == b"a"
    assert conn.stats()[f"queue_{qname}_canceled_transactions"] == "1"


def test_plain_get_while_read_is_open_is_error(conn, qname):
    conn.set(qname, "a")
    conn.set(qname, "b")
    conn.get(f"{qname}/open")
    conn.send(f"get {qname}\r\n")
    assert conn.line() == b"ERROR"
    conn.send("version\r\n")
    assert conn.line().startswith(b"VERSION")


def test_open_reads_over_limit_is_error(make_server):
    srv = make_server("max_open_reads = 2\n")
    c = Conn(srv.connect())
    for i in range(3):
        c.set("q", str(i))
    assert c.get("q/open") == b"0"
    assert c.get("q/open") == b"1"
    c.send("get q/open\r\n")
    assert c.line() == b"ERROR"


def test_disconnect_returns_open_reads_in_original_order(server, qname):
    c = Conn(server.connect())
    for i in range(3):
        c.set(qname, f"i{i}")
    c.set(qname, "tail")
    assert [c.get(f"{qname}/open") for _ in range(3)] == [b"i0", b"i1", b"i2"]
    c.close()
    wait_until(lambda: stat(server, f"queue_{qname}_open_transactions") == "0", "reads returned")
    d = Conn(server.connect())
    assert [d.get(qname) for _ in range(4)] == [b"i0", b"i1", b"i2", b"tail"]


def test_aborted_item_goes_to_a_waiting_consumer(server, qname):
    holder = Conn(server.connect())
    holder.set(qname, "x")
    assert holder.get(f"{qname}/open") == b"x"
    waiter = Conn(server.connect())
    waiter.send(f"get {qname}/t=5000\r\n")
    wait_waiters(server, qname, 1)
    holder.send(f"get {qname}/abort\r\n")
    assert holder.line() == b"END"
    assert waiter.read_value() == b"x"


def test_confirm_closes_oldest_open_reads(conn, qname):
    for i in range(3):
        conn.set(qname, str(i))
    for _ in range(3):
        conn.get(f"{qname}/open")
    conn.send(f"confirm {qname} 2\r\n")
    assert conn.line() == b"END"
    assert conn.stats()[f"queue_{qname}_open_transactions"] == "1"
    conn.send(f"confirm {qname} 5\r\n")  # kestreld: closes the one that is open
    assert conn.line() == b"END"
    conn.send(f"confirm {qname} 1\r\n")
    assert conn.line() == b"ERROR"


@pytest.mark.parametrize(
    "opts", ["peek/open", "peek/close", "abort/open", "abort/close", "peek/abort"]
)
def test_conflicting_get_options_are_client_error(conn, qname, opts):
    conn.send(f"get {qname}/{opts}\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")


@pytest.mark.parametrize("t", ["t=abc", "t=-5", "t="])
def test_bad_timeout_is_client_error(conn, qname, t):
    conn.send(f"get {qname}/{t}\r\n")
    assert conn.line() == b"CLIENT_ERROR bad timeout"


def test_empty_queue_name_in_get_is_client_error(conn):
    conn.send("get /open\r\n")
    assert conn.line().startswith(b"CLIENT_ERROR")


def test_unknown_get_options_are_ignored_and_last_timeout_wins(conn, qname):
    conn.set(qname, "v")
    assert conn.get(f"{qname}/fancy/t=5/t=10") == b"v"


def test_open_transaction_timeout_returns_item(make_server):
    srv = make_server("open_transaction_timeout = 300\nexpiration_timer_frequency = 100\n")
    c = Conn(srv.connect())
    c.set("q", "slow")
    assert c.get("q/open") == b"slow"
    other = Conn(srv.connect())
    assert other.get("q") is None  # still open
    assert wait_until(lambda: other.get("q"), "the timed-out read is returned") == b"slow"


# --- monitor ------------------------------------------------------------------------------


def test_monitor_streams_open_items_then_end(conn, qname):
    for i in range(3):
        conn.set(qname, f"m{i}")
    conn.send(f"monitor {qname} 1 2\r\n")
    assert conn.read_value() == b"m0"
    assert conn.read_value() == b"m1"
    assert conn.line() == b"END"
    assert conn.stats()[f"queue_{qname}_open_transactions"] == "2"
    conn.send(f"confirm {qname} 2\r\n")
    assert conn.line() == b"END"


def test_monitor_waits_for_items_until_its_time_is_up(server, qname):
    c = Conn(server.connect())
    start = time.monotonic()
    c.send(f"monitor {qname} 3\r\n")
    wait_waiters(server, qname, 1)
    Conn(server.connect()).set(qname, "late")
    assert c.read_value() == b"late"
    assert c.line() == b"END"
    assert time.monotonic() - start >= 2.9, "END only once its 3 s are up"


# --- fanout -------------------------------------------------------------------------------


def test_fanout_reader_sees_items_added_after_it_was_created(conn, qname):
    conn.set(qname, "before")
    assert conn.get(f"{qname}+audit") is None  # creates the reader
    conn.set(qname, "after")
    assert conn.get(qname) == b"before"
    assert conn.get(qname) == b"after"
    assert conn.get(f"{qname}+audit") == b"after"
    assert conn.get(f"{qname}+audit") is None


def test_fanout_readers_are_independent(conn, qname):
    conn.get(f"{qname}+a")
    conn.get(f"{qname}+b")
    for i in range(3):
        conn.set(qname, str(i))
    assert [conn.get(f"{qname}+a") for _ in range(3)] == [b"0", b"1", b"2"]
    assert conn.get(f"{qname}+b/open") == b"0"
    stats = conn.stats()
    assert stats[f"queue_{qname}_children"] == "a,b"
    assert stats[f"queue_{qname}+a_items"] == "0"
    assert stats[f"queue_{qname}+b_items"] == "2"
    assert stats[f"queue_{qname}_items"] == "3"


def test_delete_fanout_reader_removes_only_it(conn, qname):
    conn.get(f"{qname}+r")
    conn.set(qname, "x")
    conn.send(f"delete {qname}+r\r\n")
    assert conn.line() == b"DELETED"
    assert conn.get(qname) == b"x"
    assert f"queue_{qname}+r_items" not in conn.stats()


def test_fanout_only_parent_keeps_no_items(make_server):
    srv = make_server('[queues.fo]\nfanout_only = true\n[queues."fo+x"]\n')
    c = Conn(srv.connect())
    c.set("fo", "1")
    assert c.get("fo") is None
    assert c.get("fo+x") == b"1"


def test_configured_fanout_reader_exists_from_start(make_server):
    srv = make_server('[queues."cfg+audit"]\nmax_items = 10\n')
    c = Conn(srv.connect())
    c.set("cfg", "hello")
    assert c.get("cfg+audit") == b"hello"
    assert c.get("cfg") == b"hello"


# --- expiry -------------------------------------------------------------------------------


def test_item_with_relative_expiry_expires(conn, qname):
    conn.set(qname, "short", exptime=1)
    conn.set(qname, "keep")
    time.sleep(1.2)
    assert conn.get(qname) == b"keep"
    assert conn.stats()[f"queue_{qname}_expired_items"] == "1"


def test_item_with_absolute_expiry_in_past_is_never_delivered(conn, qname):
    conn.set(qname, "gone", exptime=int(time.time()) - 5)
    assert conn.get(qname) is None


def test_max_age_expires_items(make_server):
    srv = make_server("max_age = 200\n")
    c = Conn(srv.connect())
    c.set("q", "old")
    time.sleep(0.4)
    c.set("q", "new")
    assert c.get("q") == b"new"


def test_background_sweep_expires_and_moves_to_expire_to_queue(make_server):
    srv = make_server(
        'expiration_timer_frequency = "100ms"\n[queues.src]\nmax_age = 200\nexpire_to_queue = "dead"\n'
    )
    c = Conn(srv.connect())
    c.set("src", "letter")
    wait_until(lambda: c.stats()["queue_src_expired_items"] == "1", "the sweep expired it")
    stats = c.stats()
    assert stats["queue_src_items"] == "0"
    assert stats["queue_src_expired_items"] == "1"
    assert c.get("dead") == b"letter"


def test_max_expire_sweep_limits_each_sweep(make_server):
    srv = make_server('expiration_timer_frequency = "1s"\nmax_expire_sweep = 2\n')
    c = Conn(srv.connect())
    at = int(time.time()) + 2  # one absolute second for all six: they expire together
    for i in range(6):
        c.set("q", str(i), exptime=at)
    # Each sweep (one a second) takes 2: the count climbs 2, 4, 6, seen at every step
    # by looks 20 ms apart.
    seen = [0]
    deadline = time.monotonic() + 30
    while seen[-1] < 6:
        assert time.monotonic() < deadline, f"expired counts seen: {seen}"
        now = int(c.stats()["queue_q_expired_items"])
        if now != seen[-1]:
            seen.append(now)
        time.sleep(0.02)
    assert seen == [0, 2, 4, 6]


def test_max_queue_age_deletes_empty_idle_queue(make_server):
    srv = make_server('expiration_timer_frequency = "100ms"\n[queues.tmp]\nmax_queue_age = 300\n')
    c = Conn(srv.connect())
    c.get("tmp")
    wait_until(lambda: c.stats()["queue_expires"] == "1", "the idle queue was deleted")
    stats = c.stats()
    assert "queue_tmp_items" not in stats
    assert stats["queue_expires"] == "1"


# --- limits -------------------------------------------------------------------------------


def test_max_items_refuses_when_full(make_server):
    srv = make_server("max_items = 3\n")
    c = Conn(srv.connect())
    assert [c.set("q", str(i)) for i in range(4)] == [b"STORED"] * 3 + [b"NOT_STORED"]


def test_discard_old_when_full_drops_oldest(make_server):
    srv = make_server("max_items = 3\ndiscard_old_when_full = true\n")
    c = Conn(srv.connect())
    for i in range(5):
        assert c.set("q", str(i)) == b"STORED"
    assert [c.get("q") for _ in range(4)] == [b"2", b"3", b"4", None]
    assert c.stats()["queue_q_discarded"] == "2"


def test_max_size_refuses_once_queue_holds_that_many_bytes(make_server):
    srv = make_server("max_size = 10\n")
    c = Conn(srv.connect())
    assert c.set("q", "12345") == b"STORED"
    assert c.set("q", "67890") == b"STORED"
    assert c.set("q", "x") == b"NOT_STORED"


def test_per_queue_table_overrides_defaults(make_server):
    srv = make_server("max_items = 100\n[queues.small]\nmax_items = 1\n")
    c = Conn(srv.connect())
    assert c.set("small", "1") == b"STORED"
    assert c.set("small", "2") == b"NOT_STORED"
    assert c.set("big", "1") == b"STORED"
    assert c.set("big", "2") == b"STORED"
