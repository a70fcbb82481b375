"""config/kestreld@.service: one server per core, each its own port, folder and metrics port.

There is no systemd to run it here, so the unit is re-enacted: its
ExecStartPre and ExecStart run for two instances with ``%i`` replaced by the
instance's port, on per-instance configs made from production.conf the way
docs/operations.md makes them; the instances serve independently, a client
lists both ports, and the unit's KillSignal stops each within TimeoutStopSec.
"""

from __future__ import annotations

import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import repo

from kestreld.client import Client

ROOT = repo.ROOT
UNIT = ROOT / "config" / "kestreld@.service"
OPERATIONS = ROOT / "docs" / "operations.md"

pytestmark = pytest.mark.timeout(120)


def unit_settings() -> dict[str, list[str]]:
    """``key`` -> values (a key may repeat), from every section."""
    out: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def instance_config(port: int, metrics_port: int, spool: Path) -> str:
    """production.conf for one instance, as the recipe in docs/operations.md edits it."""
    text = (ROOT / "config" / "production.conf").read_text()
    for key, value in [
        ("listen_address", '"127.0.0.1"'),  # this test's machine is shared
        ("port", str(port)),
        ("queue_path", f'"{spool}/{port}"'),
        ("metrics_port", str(metrics_port)),
        ("text_port", str(free_port())),  # production.conf opens Kestrel's 2222 and 2229
        ("thrift_port", str(free_port())),
    ]:
        text, n = re.subn(rf"(?m)^{key}\s*=.*$", f"{key} = {value}", text)
        assert n == 1, key
    return text


def command(line: str, port: int, etc: Path) -> list[str]:
    """An Exec line for instance ``port``, run from this checkout."""
    words = shlex.split(line.replace("%i", str(port)).replace("/etc/kestreld", str(etc)))
    assert words[0] == "/usr/local/bin/kestreld"
    return [sys.executable, "-m", "kestreld", *words[1:]]


def test_the_unit_runs_a_graceful_kestreld_per_instance():
    settings = unit_settings()
    assert settings["ExecStart"] == ["/usr/local/bin/kestreld --config /etc/kestreld/%i.conf"]
    assert settings["ExecStartPre"] == [
        "/usr/local/bin/kestreld --check-config /etc/kestreld/%i.conf"
    ]
    assert settings["KillSignal"] == ["SIGTERM"]
    assert settings["User"] == ["kestrel"] and settings["Restart"] == ["on-failure"]
    assert int(settings["LimitNOFILE"][0]) >= 10_000 + 1024  # above production max_connections
    assert settings["ReadWritePaths"] == ["/var/spool/kestrel"]
    assert settings["WantedBy"] == ["multi-user.target"]


def test_the_docs_generate_the_instance_configs_the_unit_reads():
    text = OPERATIONS.read_text()
    assert "kestreld@.service" in text
    assert "/etc/kestreld/$port.conf" in text
    assert "systemctl enable --now kestreld@$port" in text


def test_two_instances_serve_independently_and_stop_on_the_kill_signal(tmp_path):
    settings = unit_settings()
    etc, spool = tmp_path / "etc", tmp_path / "spool"
    etc.mkdir()
    ports = [free_port(), free_port()]
    procs = []
    try:
        for port in ports:
            (etc / f"{port}.conf").write_text(instance_config(port, free_port(), spool))
            check = subprocess.run(
                command(settings["ExecStartPre"][0], port, etc),
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert check.returncode == 0, check.stderr
            procs.append(
                subprocess.Popen(
                    command(settings["ExecStart"][0], port, etc),
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        deadline = time.monotonic() + 60
        for port in ports:  # until both listen (a client would mark them down meanwhile)
            while not listening(port):
                assert time.monotonic() < deadline, "instances did not start"
                time.sleep(0.2)
        with Client([f"127.0.0.1:{p}" for p in ports], connect_timeout=5.0) as client:
            assert len(client.version()) == 2
            for i in range(40):
                assert client.put("spread", f"item{i}")
            per_server = {
                address: stats.queue("spread").get("items", 0)
                for address, stats in client.stats().items()
            }
            assert sum(per_server.values()) == 40 and all(per_server.values())  # both used
            got = sorted(client.get("spread").decode() for _ in range(40))
            assert got == sorted(f"item{i}" for i in range(40))
        assert sorted(p.name for p in spool.iterdir()) == sorted(str(p) for p in ports)
        stop_timeout = float(settings["TimeoutStopSec"][0])
        kill_signal = getattr(signal, settings["KillSignal"][0])
        for proc in procs:
            proc.send_signal(kill_signal)
            assert proc.wait(stop_timeout) == 0
            assert '"stopped"' in proc.stderr.read()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
