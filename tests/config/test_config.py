"""Config files: units, inheritance, bad files refused at start-up, live reload."""

from __future__ import annotations

import subprocess
import sys

import pytest
import repo
from kestreld_process import Conn
from waiting import wait_until

from kestreld.config import ConfigError, build_config, load_config, parse_duration, parse_size

ROOT = repo.ROOT


@pytest.mark.parametrize(
    "value, expected",
    [
        (1024, 1024),
        ("16MiB", 16 * 1024 * 1024),
        ("16MB", 16 * 1024 * 1024),
        ("4KiB", 4096),
        ("1GiB", 1 << 30),
        ("512", 512),
    ],
)
def test_sizes_accept_bytes_and_units(value, expected):
    assert parse_size("k", value) == expected


@pytest.mark.parametrize(
    "value, expected",
    [
        (250, 250),
        ("100ms", 100),
        ("30s", 30_000),
        ("5m", 300_000),
        ("1h", 3_600_000),
        ("1d", 86_400_000),
    ],
)
def test_durations_accept_ms_and_units(value, expected):
    assert parse_duration("k", value) == expected


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"max_items": "lots"}, "max_items"),
        ({"max_size": "12 parsecs"}, "max_size"),
        ({"max_age": -5}, "max_age"),
        ({"journal": "maybe"}, "journal"),
        ({"no_such_key": 1}, "no_such_key"),
        ({"queues": {"jobs": {"max_itemz": 3}}}, "queues.jobs.max_itemz"),
        ({"queues": {"../etc": {}}}, "queues.../etc"),
        ({"max_journal_size": 100}, "max_journal_size"),
        ({"expire_to_queue": "a/b"}, "expire_to_queue"),
        ({"port": 70000}, "port"),
        ({"text_port": 70000}, "text_port"),
        ({"thrift_port": -1}, "thrift_port"),
        ({"port": 2229, "thrift_port": 2229}, "thrift_port"),
    ],
)
def test_bad_values_name_the_key(doc, key):
    with pytest.raises(ConfigError) as e:
        build_config(doc)
    assert key in str(e.value)


def test_fanout_reader_inherits_from_its_parent():
    cfg = build_config(
        {
            "max_items": 5,
            "queues": {"jobs": {"max_age": "30m"}, "jobs+audit": {"max_memory_size": "16MiB"}},
        }
    )
    audit = cfg.queue("jobs+audit")
    assert (audit.max_items, audit.max_age, audit.max_memory_size) == (5, 1_800_000, 16 << 20)
    assert cfg.queue("jobs+other").max_age == 1_800_000
    assert cfg.queue("elsewhere").max_age is None


def test_shipped_configs_are_valid():
    for name in ("production.conf", "development.conf"):
        load_config(str(ROOT / "config" / name))


def test_bad_config_file_fails_at_start_up_naming_the_key(tmp_path):
    conf = tmp_path / "bad.conf"
    conf.write_text('max_memory_size = "lots"\n')
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kestreld",
            "--config",
            str(conf),
            "--queue-path",
            str(tmp_path / "q"),
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    assert "max_memory_size" in proc.stderr


def test_flags_override_the_config_file(make_server, tmp_path):
    srv = make_server(
        "port = 1\nqueue_path = '/nonexistent/never'\n"
    )  # the fixture passes --port/--queue-path
    assert Conn(srv.connect()).set("q", "x") == b"STORED"
    assert (srv.queue_path / ".lock").exists()


def test_reload_changes_queue_settings_live(make_server):
    srv = make_server("max_items = 2\n")
    c = Conn(srv.connect())
    assert [c.set("q", "1"), c.set("q", "2"), c.set("q", "3")] == [
        b"STORED",
        b"STORED",
        b"NOT_STORED",
    ]
    srv.config_path.write_text('max_items = 5\n[queues.q]\nmax_age = "1h"\n')
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    assert c.set("q", "3") == b"STORED"
    c.send("dump_config q\r\n")
    lines = c.until_end()
    assert b"  max_items=5" in lines
    assert b"  max_age=3600000" in lines
    wait_until(lambda: srv.events("config_reloaded"), "config_reloaded logged")


def test_reload_with_a_bad_file_keeps_the_old_config(make_server):
    srv = make_server("max_items = 2\n")
    c = Conn(srv.connect())
    srv.config_path.write_text("max_items = [\n")
    c.send("reload\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR")
    c.send("dump_config q\r\n")
    assert b"  max_items=2" in c.until_end()


def test_reload_adds_configured_fanout_readers(make_server):
    srv = make_server("")
    c = Conn(srv.connect())
    c.set("orders", "early")
    srv.config_path.write_text('[queues."orders+audit"]\n')
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    c.set("orders", "late")
    assert c.get("orders+audit") == b"late"


def test_text_and_thrift_ports_are_off_unless_configured():
    assert (build_config({}).text_port, build_config({}).thrift_port) == (0, 0)
    cfg = build_config({"text_port": 2222, "thrift_port": 2229})
    assert (cfg.text_port, cfg.thrift_port) == (2222, 2229)


def test_production_config_serves_all_three_front_ends():
    cfg = load_config(str(ROOT / "config" / "production.conf"))
    assert (cfg.port, cfg.text_port, cfg.thrift_port) == (22133, 2222, 2229)


def test_admin_keys_admin_port_is_metrics_port_and_filters_must_be_regexes():
    cfg = build_config({"admin_port": 9999, "admin_address": "127.0.0.1"})
    assert (cfg.metrics_port, cfg.metrics_address) == (9999, "127.0.0.1")
    cfg = build_config(
        {"enable_session_trace": True, "stats_filters": ["q/.*/mem_.*"], "admin_token": "x" * 16}
    )
    assert cfg.enable_session_trace and cfg.stats_filters == ("q/.*/mem_.*",)
    for doc, message in (
        ({"stats_filters": ["(unclosed"]}, "stats_filters: '(unclosed' is not a regular"),
        ({"stats_filters": "q/.*"}, "stats_filters: expected a list"),
        ({"admin_port": 1, "metrics_port": 2}, "admin_port: same setting as metrics_port"),
        ({"admin_token": "short"}, "admin_token: at least 16 characters"),
    ):
        with pytest.raises(ConfigError) as e:
            build_config(doc)
        assert message in str(e.value)
