"""Queue aliases (Kestrel 2.4's AliasedQueue): a put to an alias goes to every destination."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from kestreld_process import Conn
from pymemcache.client.base import Client

ALIASES = """
[queues.full]
max_items = 1

[aliases.fan]
destination_queues = ["a", "b"]

[aliases.to_full]
destination_queues = ["ok", "full"]
"""


@pytest.fixture
def srv(make_server):
    return make_server(ALIASES)


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_set_to_an_alias_stores_the_item_in_every_destination(srv):
    mc = Client(("127.0.0.1", srv.port), timeout=10)
    assert mc.set("fan", b"hello", noreply=False) is True
    assert mc.get("a") == b"hello"
    assert mc.get("b") == b"hello"
    mc.close()


def test_set_to_an_alias_is_not_stored_when_one_destination_refuses(srv):
    c = Conn(srv.connect())
    assert c.set("full", "first") == b"STORED"
    assert c.set("to_full", "x") == b"NOT_STORED"
    assert c.get("ok") == b"x"  # the other destinations still got it (Kestrel's rule)
    assert c.get("full") == b"first"
    assert c.get("full") is None


def test_each_destination_applies_its_own_max_item_size(make_server):
    srv = make_server(
        '[queues.small]\nmax_item_size = 4\n[aliases.both]\ndestination_queues = ["big", "small"]\n'
    )
    c = Conn(srv.connect())
    assert c.set("both", "12345") == b"NOT_STORED"
    assert c.get("big") == b"12345"
    assert c.get("small") is None
    assert c.set("both", "1234") == b"STORED"


def test_noreply_set_to_an_alias_answers_nothing(srv):
    c = Conn(srv.connect())
    c.send("set fan 0 0 2 noreply\r\nhi\r\n")
    c.send("get a\r\n")
    assert c.until_end() == [b"VALUE a 0 2", b"hi", b"END"]


def test_get_peek_and_open_on_an_alias_answer_empty_and_create_nothing(srv):
    c = Conn(srv.connect())
    assert c.set("fan", "x") == b"STORED"
    for key in ("fan", "fan/peek", "fan/open", "fan/t=10", "fan+r", "fan/close"):
        c.send(f"get {key}\r\n")
        assert c.line() == b"END", key
    c.send("monitor fan 0 10\r\n")
    assert c.line() == b"END"
    files = [p.name for p in srv.queue_path.iterdir()]
    assert not [f for f in files if f.startswith("fan.") or f.startswith("fan+")], files
    stats = c.stats()
    assert "queue_fan_items" not in stats and "queue_fan+r_items" not in stats
    assert c.get("a") == b"x"


def test_delete_and_flush_of_an_alias_are_ignored(srv):
    c = Conn(srv.connect())
    assert c.set("fan", "x") == b"STORED"
    c.send("delete fan\r\n")
    assert c.line() == b"DELETED"
    c.send("flush fan\r\n")
    assert c.line() == b"END"
    c.send("flush_expired fan\r\n")
    assert c.line() == b"0"
    assert c.set("fan", "y") == b"STORED"  # still an alias
    assert [c.get("a"), c.get("a"), c.get("b"), c.get("b")] == [b"x", b"y", b"x", b"y"]


def test_stats_list_an_alias_with_exactly_put_items_put_bytes_and_children(srv):
    c = Conn(srv.connect())
    for data in ("abc", "de", "f"):
        assert c.set("fan", data) == b"STORED"
    stats = c.stats()
    keys = {k: v for k, v in stats.items() if k.startswith("queue_fan_")}
    assert keys == {
        "queue_fan_put_items": "3",
        "queue_fan_put_bytes": "6",
        "queue_fan_children": "a,b",
    }
    c.send("dump_stats fan\r\n")
    assert c.until_end() == [
        b"queue 'fan' {",
        b"  put_items=3",
        b"  put_bytes=6",
        b"  children=a,b",
        b"}",
        b"END",
    ]


def test_metrics_carry_the_alias_counters_with_an_alias_label(make_server):
    srv = make_server("metrics_port = 0\n" + ALIASES)
    c = Conn(srv.connect())
    assert c.set("fan", "abcd") == b"STORED"
    assert _wait_for(lambda: srv.events("metrics_listening"))
    address = srv.events("metrics_listening")[0]["address"]
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    assert re.search(r'^kestreld_alias_put_items_total\{alias="fan"\} 1\.0$', text, re.M)
    assert re.search(r'^kestreld_alias_put_bytes_total\{alias="fan"\} 4\.0$', text, re.M)
    assert re.search(r'^kestreld_alias_children\{alias="fan"\} 2\.0$', text, re.M)


def test_kestreld_queues_lists_the_destinations_not_the_alias(srv):
    c = Conn(srv.connect())
    assert c.set("fan", "x") == b"STORED"
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "queues", "--port", str(srv.port), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    names = [json.loads(line)["name"] for line in result.stdout.splitlines()]
    assert names == ["a", "b"]


def test_dump_config_shows_the_aliases(srv):
    c = Conn(srv.connect())
    c.send("dump_config\r\n")
    lines = c.until_end()
    start = lines.index(b"alias 'fan' {")
    assert lines[start + 1 : start + 3] == [b"  destination_queues=a,b", b"}"]
    c.send("dump_config to_full\r\n")
    assert c.until_end() == [
        b"alias 'to_full' {",
        b"  destination_queues=ok,full",
        b"}",
        b"END",
    ]


def test_reload_adds_and_removes_an_alias(srv):
    c = Conn(srv.connect())
    srv.config_path.write_text('[aliases.new]\ndestination_queues = ["n1", "n2"]\n')
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert c.set("new", "x") == b"STORED"
    assert [c.get("n1"), c.get("n2")] == [b"x", b"x"]
    # "fan" is gone: a set to it now creates an ordinary queue.
    assert c.set("fan", "plain") == b"STORED"
    assert c.get("fan") == b"plain"
    assert c.get("a") is None
    stats = c.stats()
    assert "queue_fan_put_items" not in stats and stats["queue_new_put_items"] == "1"


def test_sighup_applies_a_changed_alias(srv):
    c = Conn(srv.connect())
    srv.config_path.write_text('[aliases.fan]\ndestination_queues = ["c"]\n')
    srv.proc.send_signal(signal.SIGHUP)
    assert _wait_for(lambda: srv.events("config_reloaded"))
    assert c.set("fan", "x") == b"STORED"
    assert c.get("c") == b"x"
    assert c.get("a") is None
    assert c.stats()["queue_fan_children"] == "c"


def test_an_alias_named_like_a_configured_queue_masks_it_with_a_warning(make_server):
    srv = make_server(
        '[queues.jobs]\nmax_items = 10\n[aliases.jobs]\ndestination_queues = ["j1", "j2"]\n'
    )
    assert srv.events("queues_masked_by_aliases")[0]["queues"] == "jobs"
    c = Conn(srv.connect())
    assert c.set("jobs", "x") == b"STORED"
    assert c.get("jobs") is None
    assert [c.get("j1"), c.get("j2")] == [b"x", b"x"]
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert len(srv.events("queues_masked_by_aliases")) == 2  # warned again at reload


@pytest.mark.parametrize(
    "config, error",
    [
        ('[aliases.x]\ndestination_queues = ["x"]\n', "points at itself"),
        (
            '[aliases.x]\ndestination_queues = ["y"]\n[aliases.y]\ndestination_queues = ["z"]\n',
            "is itself an alias",
        ),
        ('[aliases.x]\ndestination_queue = ["y"]\n', "unknown alias setting"),
        ("[aliases.x]\ndestination_queues = []\n", "non-empty list"),
        ('[aliases.x]\ndestination_queues = ["a.b"]\n', "not a legal queue name"),
        ('[aliases.x]\ndestination_queues = ["q+r"]\n', "not a legal queue name"),
    ],
)
def test_a_bad_alias_is_refused_at_start_and_at_reload(make_server, config, error):
    bad = make_server(config, start=False)
    with pytest.raises(RuntimeError, match=error):
        bad.start(timeout=20)
    srv = make_server('[aliases.ok]\ndestination_queues = ["d"]\n')
    c = Conn(srv.connect())
    srv.config_path.write_text(config)
    c.send("reload\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR config not reloaded") and error.encode() in reply
    assert c.set("ok", "x") == b"STORED"  # the old config is kept
    assert c.get("d") == b"x"
