"""Configuring statuses and ``[zookeeper]``: what is accepted, and the clear errors of
what is not, at start-up and from ``kestreld --check-config``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import repo

from kestreld.config import ConfigError, build_config
from kestreld.config.model import ZooKeeperConfig

ROOT = repo.ROOT

GOOD = {"hosts": "zk1:2181,zk2:2181", "path_prefix": "/kestrel/prod"}


def zookeeper(**overrides: object) -> ZooKeeperConfig | None:
    table = dict(GOOD, **overrides)
    return build_config({"zookeeper": {k: v for k, v in table.items() if v is not None}}).zookeeper


def test_a_zookeeper_table_with_defaults():
    zk = zookeeper()
    assert zk == ZooKeeperConfig(
        hosts="zk1:2181,zk2:2181",
        path_prefix="/kestrel/prod",
        session_timeout=10_000,
        credentials=None,
        acl="open_unsafe",
        advertise_address=None,
    )
    assert zk.host_list() == [("zk1", 2181), ("zk2", 2181)]
    assert zookeeper(hosts="zk1,[::1]:2182").host_list() == [("zk1", 2181), ("::1", 2182)]


def test_status_settings_and_their_defaults():
    config = build_config({})
    assert (config.default_status, config.status_file, config.status_change_grace_period) == (
        "UP",
        None,
        0,
    )
    assert config.connection_limit_refuse_writes is None
    config = build_config(
        {
            "default_status": "readonly",
            "status_file": "/var/run/kestrel-status",
            "status_change_grace_period": "30s",
            "connection_limit_refuse_writes": 5000,
            "connection_limit_refuse_reads": 8000,
        }
    )
    assert config.default_status == "READONLY"
    assert config.status_change_grace_period == 30_000
    assert (config.connection_limit_refuse_writes, config.connection_limit_refuse_reads) == (
        5000,
        8000,
    )


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"path_prefix": None}, "zookeeper.path_prefix: required"),
        ({"path_prefix": "kestrel"}, "zookeeper.path_prefix: 'kestrel' must be an absolute path"),
        ({"hosts": "zk1:21x81"}, "zookeeper.hosts: 'zk1:21x81' has no valid port"),
        ({"hosts": "zk1:2181,,zk2"}, "zookeeper.hosts: '' is not host:port"),
        ({"hosts": "zk1:2181/kestrel"}, "zookeeper.hosts: 'zk1:2181/kestrel' has a path"),
        ({"hosts": "zk1:99999"}, "has no valid port"),
        ({"acl": "world_writable"}, "zookeeper.acl: unknown ACL 'world_writable'"),
        ({"acl": "everyone_read_creator_all"}, "needs zookeeper.credentials"),
        ({"credentials": "nopassword"}, 'zookeeper.credentials: expected "user:password"'),
        ({"session_timeout": "10"}, "zookeeper.session_timeout: at least 100ms"),
        ({"sesion_timeout": "10s"}, "zookeeper.sesion_timeout: unknown setting"),
    ],
)
def test_a_bad_zookeeper_table_names_the_key(overrides, message):
    with pytest.raises(ConfigError) as e:
        zookeeper(**overrides)
    assert message in str(e.value)


@pytest.mark.parametrize(
    "doc, message",
    [
        ({"status_change_grace_period": "-5s"}, "status_change_grace_period: must not be negative"),
        ({"status_change_grace_period": -5}, "status_change_grace_period: must not be negative"),
        ({"default_status": "down"}, "default_status: expected one of UP, WRITEAVOID"),
        ({"connection_limit_refuse_reads": -1}, "connection_limit_refuse_reads: must not be"),
        ({"zookeeper": "zk1:2181"}, "zookeeper: expected a table"),
    ],
)
def test_bad_status_settings_name_the_key(doc, message):
    with pytest.raises(ConfigError) as e:
        build_config(doc)
    assert message in str(e.value)


def run_kestreld(args: list[str], hide_kazoo: bool = False) -> subprocess.CompletedProcess:
    """``python -m kestreld ARGS``; ``hide_kazoo``: as if kazoo were not installed."""
    prelude = "import sys\n" + ("sys.modules['kazoo'] = None\n" if hide_kazoo else "")
    code = prelude + "from kestreld.cli import main\nraise SystemExit(main(sys.argv[1:]))\n"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


ZK_CONFIG = '[zookeeper]\nhosts = "127.0.0.1:2181"\npath_prefix = "/kestrel/test"\n'


def test_check_config_shows_the_zookeeper_table_with_the_password_hidden(tmp_path):
    config = tmp_path / "k.conf"
    config.write_text(
        'status_change_grace_period = "5s"\n' + ZK_CONFIG + 'credentials = "kestrel:s3cret"\n'
        'acl = "everyone_read_creator_all"\n'
    )
    result = run_kestreld(["--check-config", str(config)])
    assert result.returncode == 0, result.stderr
    assert "  status_change_grace_period=5000" in result.stdout
    assert "zookeeper {" in result.stdout
    assert "  path_prefix=/kestrel/test" in result.stdout
    assert "  credentials=kestrel:(hidden)" in result.stdout
    assert "s3cret" not in result.stdout
    assert "  advertise_address=127.0.0.1" in result.stdout
    assert "loopback address" in result.stdout  # the warning


@pytest.mark.parametrize("hide_kazoo", [False, True])
def test_a_bad_zookeeper_config_stops_start_up_and_check_config(tmp_path, hide_kazoo):
    config = tmp_path / "k.conf"
    if hide_kazoo:
        config.write_text(ZK_CONFIG)
        message = "zookeeper: needs the kazoo library, which is not installed"
    else:
        config.write_text('[zookeeper]\nhosts = "127.0.0.1:2181"\n')
        message = "zookeeper.path_prefix: required"
    checked = run_kestreld(["--check-config", str(config)], hide_kazoo)
    assert checked.returncode == 2
    assert message in checked.stderr
    started = run_kestreld(
        ["--config", str(config), "--queue-path", str(tmp_path / "q"), "--port", "0"], hide_kazoo
    )
    assert started.returncode == 2
    assert message in started.stderr
    if hide_kazoo:
        assert "kestreld[zookeeper]" in started.stderr
