"""What an operator relies on: SIGHUP and ``reload``, the ``listening`` event, fanout limits."""

from __future__ import annotations

import signal
import time

from kestreld_process import Conn


def _wait_for(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_sighup_reloads_the_config_and_keeps_serving(make_server):
    srv = make_server("max_items = 1\n")
    c = Conn(srv.connect())
    assert c.set("q", "1") == b"STORED"
    assert c.set("q", "2") == b"NOT_STORED"
    srv.config_path.write_text("max_items = 5\n")
    srv.proc.send_signal(signal.SIGHUP)
    assert _wait_for(lambda: srv.events("config_reloaded")), "SIGHUP is logged as a reload"
    assert srv.proc.poll() is None, "SIGHUP does not stop the server"
    assert c.set("q", "2") == b"STORED"
    assert [c.get("q"), c.get("q")] == [b"1", b"2"]
    assert srv.events("reload_requested")[0]["reason"] == "SIGHUP"


def test_reload_names_the_keys_that_need_a_restart(make_server):
    srv = make_server("max_items = 1\n")
    c = Conn(srv.connect())
    srv.config_path.write_text("max_items = 3\ncheckpoint_interval = 5000\nmetrics_port = 9\n")
    c.send("reload\r\n")
    reply = c.line()
    assert reply.startswith(b"Reloaded config; needs a restart to apply: ")
    assert set(reply.split(b": ", 1)[1].split()) == {b"checkpoint_interval", b"metrics_port"}
    assert _wait_for(lambda: srv.events("config_reload_needs_restart"))
    (event,) = srv.events("config_reload_needs_restart")
    assert set(event["keys"].split(",")) == {"checkpoint_interval", "metrics_port"}
    assert c.set("q", "1") == b"STORED"
    assert c.set("q", "2") == b"STORED", "queue settings applied"
    c.send("dump_config q\r\n")
    assert b"  max_items=3" in c.until_end()


def test_reload_applies_log_level_live(make_server):
    srv = make_server('log_level = "info"\n')
    c = Conn(srv.connect())
    srv.config_path.write_text('log_level = "warning"\n')
    for _ in range(2):  # config_reloaded is an info event: dropped once warning applies
        c.send("reload\r\n")
        assert c.line() == b"Reloaded config."
    srv.config_path.write_text('log_level = "info"\n')
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert _wait_for(lambda: srv.events("config_reloaded"))
    # Logs arrive in order: the two reloads at "warning" logged nothing before this one.
    assert len(srv.events("config_reloaded")) == 1


def test_reload_without_a_config_file_says_so(server):
    c = Conn(server.connect())
    c.send("reload\r\nversion\r\n")
    assert c.line() == b"SERVER_ERROR no config file to reload (started without --config)"
    assert c.line().startswith(b"VERSION ")


def test_listening_event_names_the_config_file(make_server, server):
    srv = make_server("")
    assert srv.events("listening")[0]["config"] == str(srv.config_path.resolve())
    assert server.events("listening")[0]["config"] is None


# --- fanout readers are queues of their own (Kestrel 2.x) -------------------------------------


def test_a_full_fanout_reader_never_refuses_sets_to_its_queue(make_server):
    srv = make_server('[queues."orders+audit"]\nmax_items = 2\n')
    c = Conn(srv.connect())
    assert c.get("orders+billing") is None  # a second reader, unlimited
    assert [c.set("orders", str(i)) for i in range(4)] == [b"STORED"] * 4
    assert [c.get("orders") for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    assert [c.get("orders+billing") for _ in range(4)] == [b"0", b"1", b"2", b"3"]
    # audit was full from the third item on: it dropped the new ones for itself.
    assert [c.get("orders+audit") for _ in range(3)] == [b"0", b"1", None]
    stats = c.stats()
    assert stats["queue_orders+audit_discarded"] == "2"
    assert stats["queue_orders_children"] == "audit,billing"


def test_a_full_fanout_reader_with_discard_old_keeps_the_newest(make_server):
    srv = make_server('[queues."orders+audit"]\nmax_items = 2\ndiscard_old_when_full = true\n')
    c = Conn(srv.connect())
    assert [c.set("orders", str(i)) for i in range(4)] == [b"STORED"] * 4
    assert [c.get("orders+audit") for _ in range(3)] == [b"2", b"3", None]
    assert [c.get("orders") for _ in range(4)] == [b"0", b"1", b"2", b"3"]


def test_a_full_queue_still_refuses_and_its_readers_are_untouched(make_server):
    srv = make_server("max_items = 2\n")
    c = Conn(srv.connect())
    assert c.get("jobs+r") is None
    assert [c.set("jobs", str(i)) for i in range(3)] == [b"STORED", b"STORED", b"NOT_STORED"]
    assert [c.get("jobs+r") for _ in range(3)] == [b"0", b"1", None]


def test_a_fanout_reader_that_dropped_items_survives_a_restart(make_server, tmp_path):
    srv = make_server('[queues."orders+audit"]\nmax_items = 1\n')
    c = Conn(srv.connect())
    assert [c.set("orders", str(i)) for i in range(3)] == [b"STORED"] * 3
    c.close()
    srv.stop()
    srv.start()
    c = Conn(srv.connect())
    assert [c.get("orders+audit") for _ in range(2)] == [b"0", None]
    assert [c.get("orders") for _ in range(4)] == [b"0", b"1", b"2", None]
