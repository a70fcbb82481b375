"""``kestreld queues``: the table of a running server's queues, asked over the protocol."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from kestreld_process import Conn

from kestreld.tools.queues_table import human_age, human_bytes


def queues(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "queues", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_table_shows_every_queue_and_reader_with_its_figures(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    assert c.get("orders+audit") is None  # a fanout reader
    for i in range(5):
        assert c.set("orders", f"order{i}") == b"STORED"
    assert c.set("invoices", "x" * 2048) == b"STORED"
    assert c.get("orders/open") == b"order0"  # one open read
    waiter = Conn(proc.connect())
    waiter.send("get empty/t=30000\r\n")  # a client blocked on an empty queue
    time.sleep(1.1)
    result = queues("--port", str(proc.port))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["QUEUE", "ITEMS", "BYTES", "OPEN", "WAITERS", "OLDEST", "JOURNAL"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    names = [line.split()[0] for line in lines[1:]]
    assert names == ["empty", "invoices", "orders", "+audit"]  # the reader under its queue
    assert rows["orders"][:2] == ["4", "24B"] and rows["orders"][2] == "1"
    assert rows["+audit"][:3] == ["5", "30B", "0"]
    assert rows["invoices"][:2] == ["1", "2.0KiB"]
    assert rows["empty"][3] == "1"  # waiters
    assert rows["empty"][4] == "0.0s"
    assert float(rows["+audit"][4].rstrip("s")) >= 1.0  # nobody read: the age grows
    # --json: the same figures, unformatted
    result = queues("--port", str(proc.port), "--json")
    by_name = {r["name"]: r for r in map(json.loads, result.stdout.splitlines())}
    assert by_name["orders+audit"]["items"] == 5
    assert by_name["orders+audit"]["oldest_item_age_ms"] >= 1000
    assert by_name["orders"]["open_reads"] == 1
    assert by_name["orders"]["journal_bytes"] == int(c.stats()["queue_orders_logsize"]) > 0
    waiter.close()
    c.close()


def test_the_server_is_found_through_a_config_file(make_server, tmp_path):
    proc = make_server()
    Conn(proc.connect()).set("through_config", "x")
    config = tmp_path / "q.conf"
    config.write_text(f'listen_address = "0.0.0.0"\nport = {proc.port}\n')
    result = queues("--config", str(config))
    assert result.returncode == 0, result.stderr
    assert "through_config" in result.stdout


def test_an_unreachable_server_exits_1_and_a_bad_config_2(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        result = queues("--port", str(port), "--timeout", "2")
    assert result.returncode == 1
    assert f"127.0.0.1:{port}" in result.stderr
    bad = tmp_path / "bad.conf"
    bad.write_text("port = -1\n")
    assert queues("--config", str(bad)).returncode == 2


def test_no_queues_says_so(make_server):
    proc = make_server()
    result = queues("--port", str(proc.port))
    assert result.returncode == 0
    assert result.stdout.startswith("no queues on 127.0.0.1:")


def test_human_figures():
    assert human_bytes(None) == "-" and human_bytes(0) == "0B" and human_bytes(1536) == "1.5KiB"
    assert human_bytes(5 * 1024**3) == "5.0GiB"
    assert human_age(None) == "-" and human_age(1500) == "1.5s" and human_age(61_000) == "1m01s"
    assert human_age(3 * 3600_000 + 60_000) == "3h01m" and human_age(49 * 3600_000) == "2d01h"
