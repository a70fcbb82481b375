"""Error queues (Kestrel 3.0's puntErrorToQueue, puntManyErrorsToQueue, puntManyErrorsCount).

Every abort of an open read (``/abort``, a dropped connection, an
``open_transaction_timeout``) adds one to the item's error count; the punt keys
decide whether it goes back to the head or moves to another queue, keeping its count.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time

import pytest
from kestreld_process import Conn
from waiting import wait_until


def _open(c: Conn, queue: str) -> bytes | None:
    return c.get(f"{queue}/open")


def _abort(c: Conn, queue: str) -> None:
    c.send(f"get {queue}/abort\r\n")
    assert c.line() == b"END"


def _errors_in_journal(folder, queue: str) -> list[int]:
    """The error counts of the PUT records in ``queue``'s journal segments (journal dump)."""
    segments = sorted(
        str(p) for p in folder.iterdir() if re.fullmatch(re.escape(queue) + r"\.\d+", p.name)
    )
    assert segments, f"no journal segment of {queue}"
    out = subprocess.run(
        [sys.executable, "-m", "kestreld", "journal", "dump", *segments],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [int(m) for m in re.findall(r" PUT .* errors=(\d+) ", out)]


def test_without_punt_keys_an_aborted_item_goes_back_to_the_head(make_server):
    srv = make_server("")
    c = Conn(srv.connect())
    assert c.set("q", "one") == b"STORED"
    assert c.set("q", "two") == b"STORED"
    for _ in range(3):
        assert _open(c, "q") == b"one"
        _abort(c, "q")
    assert c.get("q") == b"one"
    assert c.stats()["queue_q_punted_items"] == "0"


def test_punt_error_to_queue_moves_an_aborted_item_at_once(make_server):
    srv = make_server('[queues.q]\npunt_error_to_queue = "errors"\n')
    c = Conn(srv.connect())
    assert c.set("q", "bad") == b"STORED"
    assert c.set("q", "next") == b"STORED"
    assert _open(c, "q") == b"bad"
    _abort(c, "q")
    assert c.get("q") == b"next"
    assert c.get("errors") == b"bad"
    stats = c.stats()
    assert stats["queue_q_punted_items"] == "1"
    assert stats["queue_q_canceled_transactions"] == "1"


def test_punt_many_errors_moves_the_item_on_its_count_th_abort(make_server):
    srv = make_server(
        '[queues.q]\npunt_many_errors_to_queue = "poison"\npunt_many_errors_count = 3\n'
    )
    c = Conn(srv.connect())
    assert c.set("q", "crashy") == b"STORED"
    for _ in range(2):
        assert _open(c, "q") == b"crashy"
        _abort(c, "q")  # errors 1 and 2: back to the head
    assert "queue_poison_items" not in c.stats()  # not moved yet: poison does not exist
    assert _open(c, "q") == b"crashy"
    _abort(c, "q")  # the third
    assert c.get("q") is None
    assert c.get("poison/peek") == b"crashy"
    assert _errors_in_journal(srv.queue_path, "poison") == [3]


def test_with_both_keys_few_errors_go_to_the_error_queue_many_to_the_other(make_server):
    srv = make_server(
        'checkpoint_interval = "50ms"\n'
        "[queues.work]\n"
        'punt_error_to_queue = "retry"\n'
        'punt_many_errors_to_queue = "poison"\n'
        "punt_many_errors_count = 2\n"
        "[queues.retry]\n"
        'punt_error_to_queue = "work"\n'
    )
    c = Conn(srv.connect())
    assert c.set("work", "item") == b"STORED"
    assert _open(c, "work") == b"item"
    _abort(c, "work")  # 1 error: below the count, to retry
    assert c.get("work") is None
    assert _open(c, "retry") == b"item"
    _abort(c, "retry")  # 2 errors: retry punts it back to work, keeping its count
    assert _open(c, "work") == b"item"
    _abort(c, "work")  # 3 >= 2: poison
    assert c.get("work") is None and c.get("retry") is None
    assert c.get("poison/peek") == b"item"
    assert _errors_in_journal(srv.queue_path, "retry") == [1]
    assert _errors_in_journal(srv.queue_path, "work")[-1] == 2
    assert _errors_in_journal(srv.queue_path, "poison") == [3]
    stats = c.stats()
    assert stats["queue_work_punted_items"] == "2"
    assert stats["queue_retry_punted_items"] == "1"


def test_a_dropped_connection_counts_as_an_abort(make_server):
    srv = make_server('[queues.q]\npunt_error_to_queue = "errors"\n')
    c = Conn(srv.connect())
    assert c.set("q", "held") == b"STORED"
    consumer = Conn(srv.connect())
    assert _open(consumer, "q") == b"held"
    consumer.close()
    wait_until(lambda: c.get("errors/peek") == b"held", "the held item moves to errors")
    assert c.get("q") is None
    assert c.stats()["queue_q_punted_items"] == "1"


def test_an_open_transaction_timeout_counts_as_an_abort(make_server):
    srv = make_server(
        'expiration_timer_frequency = "50ms"\n'
        '[queues.q]\nopen_transaction_timeout = "200ms"\npunt_error_to_queue = "errors"\n'
    )
    c = Conn(srv.connect())
    assert c.set("q", "slow") == b"STORED"
    consumer = Conn(srv.connect())
    assert _open(consumer, "q") == b"slow"
    wait_until(lambda: c.get("errors/peek") == b"slow", "the timed-out read moves to errors")
    assert c.get("q") is None
    consumer.close()


def test_aborts_of_every_kind_add_up_to_the_count(make_server):
    srv = make_server(
        'expiration_timer_frequency = "50ms"\n'
        "[queues.q]\n"
        'open_transaction_timeout = "300ms"\n'
        'punt_many_errors_to_queue = "poison"\n'
        "punt_many_errors_count = 3\n"
    )
    c = Conn(srv.connect())
    assert c.set("q", "x") == b"STORED"
    assert _open(c, "q") == b"x"
    _abort(c, "q")  # 1: /abort
    dropped = Conn(srv.connect())
    assert _open(dropped, "q") == b"x"
    dropped.close()  # 2: a dropped connection
    wait_until(lambda: c.get("q/peek") == b"x", "the dropped read comes back")
    slow = Conn(srv.connect())
    assert _open(slow, "q") == b"x"  # 3: a timed-out read
    wait_until(lambda: c.get("poison/peek") == b"x", "the third abort moves it to poison")
    assert c.get("q") is None
    assert _errors_in_journal(srv.queue_path, "poison") == [3]
    slow.close()


def test_a_fanout_reader_punts_by_its_own_keys(make_server):
    srv = make_server('[queues."q+audit"]\npunt_error_to_queue = "audit_errors"\n')
    c = Conn(srv.connect())
    assert c.get("q+audit") is None  # creates the reader
    assert c.set("q", "x") == b"STORED"
    assert _open(c, "q") == b"x"
    _abort(c, "q")  # the queue's own reader has no punt keys: back to its head
    assert _open(c, "q+audit") == b"x"
    _abort(c, "q+audit")
    assert c.get("q+audit") is None
    assert c.get("audit_errors") == b"x"
    assert c.get("q") == b"x"


def test_expire_to_queue_keeps_the_error_count(make_server):
    # The retry-with-delay recipe: errors wait in "delay", then expire back to "work".
    srv = make_server(
        'expiration_timer_frequency = "50ms"\n'
        '[queues.work]\npunt_error_to_queue = "delay"\n'
        '[queues.delay]\nmax_age = "200ms"\nexpire_to_queue = "work"\n'
    )
    c = Conn(srv.connect())
    assert c.set("work", "job") == b"STORED"
    assert _open(c, "work") == b"job"
    _abort(c, "work")
    assert c.get("work") is None
    wait_until(lambda: c.get("work/peek") == b"job", "the item comes back after the delay")
    assert _errors_in_journal(srv.queue_path, "work") == [0, 1]


def test_a_punted_item_stays_moved_across_a_restart(make_server):
    srv = make_server(
        'checkpoint_interval = "50ms"\nsync_journal = 0\n[queues.q]\npunt_error_to_queue = "e"\n'
    )
    c = Conn(srv.connect())
    assert c.set("q", "moved") == b"STORED"
    assert c.set("q", "stays") == b"STORED"
    assert _open(c, "q") == b"moved"
    _abort(c, "q")
    time.sleep(0.3)
    c.close()
    srv.restart()
    c = Conn(srv.connect())
    assert [c.get("q"), c.get("q")] == [b"stays", None]
    assert c.get("e") == b"moved"


def test_kill_9_during_moves_never_loses_an_item(make_server):
    srv = make_server('sync_journal = 0\n[queues.q]\npunt_error_to_queue = "e"\n')
    c = Conn(srv.connect())
    items = [f"item{i}" for i in range(40)]
    for data in items:
        assert c.set("q", data) == b"STORED"
    # Abort everything in one burst of pipelined requests, then kill -9 at once.
    burst = b"".join(b"get q/open\r\nget q/abort\r\n" for _ in items)
    c.sock.sendall(burst)
    time.sleep(0.01)
    srv.kill()
    srv.start()
    c = Conn(srv.connect())
    seen = []
    for queue in ("q", "e"):
        while (data := c.get(queue)) is not None:
            seen.append(data.decode())
    assert set(items) <= set(seen), f"lost: {set(items) - set(seen)}"


@pytest.mark.parametrize(
    "config, error",
    [
        ("punt_many_errors_count = 0\n", "punt_many_errors_count: must be at least 1"),
        ("punt_many_errors_count = -1\n", "must not be negative"),
        ('[queues.q]\npunt_error_to_queue = "q"\n', "is the queue itself"),
        ('[queues.q]\npunt_many_errors_to_queue = "q+r"\n', "is the queue itself"),
        ('[queues."q+r"]\npunt_error_to_queue = "q"\n', "is the queue itself"),
        ('[queues.q]\npunt_error_to_queue = "a.b"\n', "not a legal queue name"),
    ],
)
def test_bad_punt_settings_are_refused_at_start_and_at_reload(make_server, config, error):
    bad = make_server(config, start=False)
    with pytest.raises(RuntimeError, match=re.escape(error)):
        bad.start(timeout=20)
    srv = make_server('[queues.q]\npunt_error_to_queue = "e"\n')
    c = Conn(srv.connect())
    srv.config_path.write_text(config)
    c.send("reload\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR config not reloaded") and error.encode() in reply
    assert c.set("q", "x") == b"STORED"
    assert _open(c, "q") == b"x"
    _abort(c, "q")
    assert c.get("e") == b"x"  # the old config still applies


def test_an_inherited_punt_target_naming_the_queue_itself_keeps_the_item(make_server):
    srv = make_server('punt_error_to_queue = "errors"\n')
    c = Conn(srv.connect())
    assert c.set("errors", "e") == b"STORED"
    assert _open(c, "errors") == b"e"
    _abort(c, "errors")
    assert c.get("errors") == b"e"


def test_reload_turns_punting_on_and_off(make_server):
    srv = make_server("")
    c = Conn(srv.connect())
    assert c.set("q", "x") == b"STORED"
    srv.config_path.write_text('[queues.q]\npunt_error_to_queue = "e"\n')
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert _open(c, "q") == b"x"
    _abort(c, "q")
    assert c.get("e/peek") == b"x"
    srv.config_path.write_text("")
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert _open(c, "e") == b"x"
    _abort(c, "e")
    assert c.get("e") == b"x"  # no punt keys: back to the head


def test_dump_config_shows_the_punt_keys(make_server):
    srv = make_server(
        '[queues.q]\npunt_error_to_queue = "e"\npunt_many_errors_to_queue = "p"\n'
        "punt_many_errors_count = 7\n"
    )
    c = Conn(srv.connect())
    c.send("dump_config q\r\n")
    lines = c.until_end()
    assert b"  punt_error_to_queue=e" in lines
    assert b"  punt_many_errors_to_queue=p" in lines
    assert b"  punt_many_errors_count=7" in lines
