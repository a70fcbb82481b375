"""``stats`` keeps each queue's lines between calls: queues and readers that come, go or are
masked between two calls show in the next exactly as in a first one."""

from __future__ import annotations

from kestreld_process import Conn


def _queue_keys(stats: dict[str, str], name: str) -> dict[str, str]:
    prefix = f"queue_{name}_"
    return {k[len(prefix) :]: v for k, v in stats.items() if k.startswith(prefix)}


def test_a_queue_created_after_a_stats_is_in_the_next_in_name_order(conn, qname):
    conn.set(f"{qname}_b", "x")
    conn.stats()
    conn.set(f"{qname}_a", "yy")
    stats = conn.stats()
    assert _queue_keys(stats, f"{qname}_a")["bytes"] == "2"
    keys = list(stats)
    assert keys.index(f"queue_{qname}_a_oldest_item_age") < keys.index(f"queue_{qname}_b_items")


def test_a_deleted_queue_leaves_the_next_stats(conn, qname):
    conn.set(qname, "x")
    assert "items" in _queue_keys(conn.stats(), qname)
    conn.send(f"delete {qname}\r\n")
    assert conn.line() == b"DELETED"
    assert _queue_keys(conn.stats(), qname) == {}


def test_a_queue_deleted_and_created_again_between_two_stats_shows_its_new_figures(conn, qname):
    conn.set(qname, "x")
    conn.set(qname, "y")
    conn.stats()
    conn.send(f"delete {qname}\r\n")  # the same number of queues after the set below
    assert conn.line() == b"DELETED"
    conn.set(qname, "z")
    mine = _queue_keys(conn.stats(), qname)
    assert (mine["items"], mine["total_items"], mine["bytes"]) == ("1", "1", "1")


def test_a_fanout_reader_added_after_a_stats_gets_its_lines_and_a_children_line(conn, qname):
    conn.set(qname, "x")
    conn.stats()
    assert conn.get(f"{qname}+audit") is None  # the reader is created, empty
    conn.set(qname, "yy")
    stats = conn.stats()
    assert stats[f"queue_{qname}_children"] == "audit"
    assert _queue_keys(stats, f"{qname}+audit")["items"] == "1"
    assert _queue_keys(stats, qname)["items"] == "2"
    keys = list(stats)
    assert keys.index(f"queue_{qname}_oldest_item_age") < keys.index(f"queue_{qname}_children")
    assert keys.index(f"queue_{qname}_children") < keys.index(f"queue_{qname}+audit_items")


def test_a_deleted_fanout_reader_leaves_the_next_stats_and_its_queue_stays(conn, qname):
    conn.get(f"{qname}+audit")
    conn.get(f"{qname}+billing")
    conn.set(qname, "x")
    assert conn.stats()[f"queue_{qname}_children"] == "audit,billing"
    conn.send(f"delete {qname}+audit\r\n")
    assert conn.line() == b"DELETED"
    stats = conn.stats()
    assert stats[f"queue_{qname}_children"] == "billing"
    assert _queue_keys(stats, f"{qname}+audit") == {}
    assert _queue_keys(stats, f"{qname}+billing")["items"] == "1"


def test_server_totals_count_every_reader_of_every_queue(make_server):
    srv = make_server()
    c = Conn(srv.connect())
    c.get("a+r")  # a fanout reader: each item is counted once per reader
    for name, data in (("a", "12"), ("a", "3"), ("b", "4567")):
        assert c.set(name, data) == b"STORED"
    c.stats()
    assert c.get("b") == b"4567"
    stats = c.stats()
    assert (stats["curr_items"], stats["bytes"], stats["total_items"]) == ("4", "6", "5")


def test_a_queue_masked_by_an_alias_after_a_reload_shows_only_the_alias(make_server):
    srv = make_server("")
    c = Conn(srv.connect())
    assert c.set("orders", "abc") == b"STORED"
    assert _queue_keys(c.stats(), "orders")["items"] == "1"
    srv.config_path.write_text('[aliases.orders]\ndestination_queues = ["shipped"]\n')
    c.send("reload\r\n")
    assert c.line().startswith(b"Reloaded config")
    stats = c.stats()
    assert _queue_keys(stats, "orders") == {
        "put_items": "0",
        "put_bytes": "0",
        "children": "shipped",
    }
    assert stats["curr_items"] == "1", "the masked queue's item still counts"
