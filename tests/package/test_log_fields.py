"""Log events carry flat fields: strings, numbers, booleans, never a dict or a list."""

from __future__ import annotations

import json

from kestreld_process import Conn

CONFIG = """
metrics_port = 0
[queues.orders]
max_items = 100
[queues."orders+audit"]
max_items = 100
[aliases.everything]
destination_queues = ["orders", "jobs"]
"""


def test_queue_loaded_says_the_items_of_the_queue_and_of_each_reader(make_server):
    srv = make_server(CONFIG)
    conn = Conn(srv.connect())
    assert conn.set("orders", "a") == b"STORED"
    assert conn.set("orders", "b") == b"STORED"
    assert conn.get("orders") == b"a"
    conn.close()
    srv.restart()
    # The log holds both runs: the restart's events are the last ones.
    orders = [e for e in srv.events("queue_loaded") if e["queue"] == "orders"][-1]
    assert orders["items"] == 1
    audit = srv.events("reader_loaded")[-1]
    assert (audit["queue"], audit["reader"], audit["items"]) == ("orders", "audit", 2)


def test_no_event_of_a_start_and_a_restart_has_a_nested_field(make_server):
    srv = make_server(CONFIG)
    conn = Conn(srv.connect())
    assert conn.set("everything", "x") == b"STORED"
    conn.close()
    srv.restart()
    events = [json.loads(line) for line in srv.log_lines if line.startswith("{")]
    assert {e["event"] for e in events} >= {"queue_loaded", "alias_created", "listening"}
    nested = [e for e in events if any(isinstance(v, dict | list) for v in e.values())]
    assert nested == []
