"""Limits on what a client can make exist: ``max_queues`` and ``create_queue_on_get``,
through a real server and real clients."""

from __future__ import annotations

import os

from kestreld_process import Conn

TOO_MANY = b"SERVER_ERROR too many queues (max_queues = 3); "


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _files(folder) -> int:
    return sum(len(files) for _, _, files in os.walk(folder))


def test_a_new_name_beyond_max_queues_is_refused_and_existing_queues_keep_working(make_server):
    proc = make_server("max_queues = 3\n")
    c = Conn(proc.connect())
    for name in ("a", "b", "c"):
        assert c.set(name, name) == b"STORED"
    assert c.set("d", "x") == TOO_MANY + b"d not created"
    c.send(b"get e\r\n")
    assert c.line() == TOO_MANY + b"e not created"
    c.send(b"get a b newname\r\n")  # a multi-key get: a refused key just has no item
    assert c.until_end() == [b"VALUE a 0 1", b"a", b"VALUE b 0 1", b"b", b"END"]
    assert c.set("c", "more") == b"STORED"
    assert c.get("c") == b"c"
    assert c.stats()["queue_create_refusals"] == "3"
    c.send(b"delete a\r\n")
    assert c.line() == b"DELETED"
    assert c.set("d", "now") == b"STORED"  # room again
    c.close()


def test_queues_named_in_the_config_are_never_refused(make_server):
    # feed exists from start-up (its reader is configured) and counts: room for one more.
    proc = make_server('max_queues = 2\n[queues.jobs]\nmax_items = 10\n[queues."feed+audit"]\n')
    c = Conn(proc.connect())
    assert c.set("first", "x") == b"STORED"
    assert c.set("jobs", "x") == b"STORED"
    assert c.set("feed", "x") == b"STORED"
    assert c.set("other", "x").startswith(b"SERVER_ERROR too many queues")
    c.close()


def test_a_flood_of_new_names_keeps_memory_and_files_bounded(make_server, tmp_path):
    proc = make_server("max_queues = 3\n", queue_path=tmp_path / "q")
    c = Conn(proc.connect())
    for name in ("a", "b", "c"):
        assert c.set(name, "x") == b"STORED"
    files, rss = _files(tmp_path / "q"), _rss_kib(proc.pid)
    batch = 500
    for start in range(0, 10_000, batch):
        c.send(b"".join(b"get flood%d\r\n" % i for i in range(start, start + batch)))
        for _ in range(batch):
            assert c.line().startswith(b"SERVER_ERROR too many queues")
    # At most the three queues' own checkpoints can still appear (written each second).
    assert _files(tmp_path / "q") <= files + 3
    assert _rss_kib(proc.pid) - rss < 16 * 1024  # measured: +1 MiB; unlimited: +44 MiB
    stats = c.stats()
    assert stats["queue_creates"] == "3"
    assert stats["queue_create_refusals"] == "10000"
    c.close()


def test_without_create_queue_on_get_a_fetch_never_makes_a_queue(make_server, tmp_path):
    proc = make_server(
        'create_queue_on_get = false\n[queues."feed+audit"]\n', queue_path=tmp_path / "q"
    )
    c = Conn(proc.connect())
    assert c.get("nothing") is None
    assert c.get("nothing/t=50") is None
    assert c.get("nothing/open") is None
    c.send(b"monitor nothing 0\r\n")
    assert c.line() == b"END"
    assert c.stats()["queue_creates"] == "0"
    assert not any("nothing" in f for f in os.listdir(tmp_path / "q"))
    assert c.set("jobs", "one") == b"STORED"  # a set still makes its queue
    assert c.get("jobs") == b"one"
    assert c.get("jobs+newreader") is None  # nor a fanout reader
    assert c.set("feed", "item") == b"STORED"
    assert c.get("feed+audit") == b"item"  # a reader named in the config exists
    assert "queue_jobs+newreader_items" not in c.stats()
    c.close()


def test_reload_changes_the_limits_live(make_server):
    proc = make_server("max_queues = 1\n")
    c = Conn(proc.connect())
    assert c.set("a", "x") == b"STORED"
    assert c.set("b", "x").startswith(b"SERVER_ERROR too many queues")
    proc.config_path.write_text("max_queues = 2\ncreate_queue_on_get = false\n")
    c.send(b"reload\r\n")
    assert c.line() == b"Reloaded config."
    assert c.set("b", "x") == b"STORED"
    assert c.get("c") is None
    assert c.stats()["queue_creates"] == "2"
    c.close()
