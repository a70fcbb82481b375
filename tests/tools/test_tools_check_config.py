"""``kestreld --check-config FILE``: validate, print the effective config, exit 0 or 2."""

from __future__ import annotations

import os
import subprocess
import sys

import repo

from kestreld.compiled import implementation

ROOT = repo.ROOT


def check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "--check-config", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def sections(text: str) -> dict[str, dict[str, str]]:
    """``name { key=value ... }`` blocks of the output."""
    out: dict[str, dict[str, str]] = {}
    current = None
    for line in text.splitlines():
        if line.endswith("{"):
            current = out[line[:-1].strip()] = {}
        elif line == "}":
            current = None
        elif current is not None:
            key, _, value = line.strip().partition("=")
            current[key] = value
    return out


def test_the_production_config_is_valid_and_every_setting_is_shown():
    result = check(str(ROOT / "config" / "production.conf"))
    assert result.returncode == 0, result.stderr
    found = sections(result.stdout)
    server = found["server"]
    assert server["listen_address"] == "0.0.0.0"
    assert server["port"] == "22133"
    assert server["queue_path"] == "/var/spool/kestrel"
    assert server["metrics_port"] == "9090"
    assert server["metrics_address"] == "0.0.0.0"  # unset: the listen address
    assert server["checkpoint_interval"] == "1000"  # "1s" in ms
    assert found["queue defaults"]["sync_journal"] == "100"
    assert found["queue defaults"]["max_journal_size"] == str(16 * 1024 * 1024)
    assert result.stdout.rstrip().endswith("OK")
    assert "no authentication" in result.stdout  # it warns about the open ports


def test_flags_override_the_file_as_they_would_for_the_server(tmp_path):
    config = tmp_path / "k.conf"
    config.write_text(
        'port = 22133\nmax_items = 10\n[queues.jobs]\nmax_age = "30s"\n'
        '[queues."jobs+audit"]\nmax_memory_size = "1MiB"\n'
    )
    result = check(str(config), "--port", "23000", "--queue-path", str(tmp_path / "q"))
    assert result.returncode == 0, result.stderr
    found = sections(result.stdout)
    assert found["server"]["port"] == "23000"
    assert found["server"]["queue_path"] == str(tmp_path / "q")
    assert found["server"]["listen_address"] == "127.0.0.1"
    assert "no authentication" not in result.stdout  # loopback only: nothing to warn about
    assert found["queue 'jobs'"]["max_age"] == "30000"
    assert found["queue 'jobs'"]["max_items"] == "10"  # inherited from the defaults
    assert found["queue 'jobs+audit'"]["max_age"] == "30000"  # inherited from jobs
    assert found["queue 'jobs+audit'"]["max_memory_size"] == str(1024 * 1024)
    assert not (tmp_path / "q").exists()  # checking starts nothing


def test_a_bad_value_exits_2_naming_the_file_and_key(tmp_path):
    config = tmp_path / "bad.conf"
    config.write_text('[queues.jobs]\nmax_age = "30 fortnights"\n')
    result = check(str(config))
    assert result.returncode == 2
    assert result.stdout == ""
    assert str(config) in result.stderr and "queues.jobs.max_age" in result.stderr


def test_an_unknown_key_broken_toml_and_a_missing_file_exit_2(tmp_path):
    unknown = tmp_path / "unknown.conf"
    unknown.write_text("max_itmes = 10\n")
    result = check(str(unknown))
    assert result.returncode == 2 and "max_itmes: unknown setting" in result.stderr
    broken = tmp_path / "broken.conf"
    broken.write_text("port = \n")
    result = check(str(broken))
    assert result.returncode == 2 and "not valid TOML" in result.stderr
    result = check(str(tmp_path / "missing.conf"))
    assert result.returncode == 2 and "does not exist" in result.stderr


def test_an_exposed_admin_port_without_a_token_is_warned_about_and_a_token_never_shown(tmp_path):
    config = tmp_path / "k.conf"
    config.write_text('metrics_port = 9090\nmetrics_address = "0.0.0.0"\n')
    result = check(str(config))
    assert result.returncode == 0, result.stderr
    assert "admin_token is not set" in result.stdout
    config.write_text(
        'admin_port = 9090\nadmin_address = "0.0.0.0"\nadmin_token = "0123456789abcdef-secret"\n'
    )
    result = check(str(config))
    assert result.returncode == 0, result.stderr
    assert "admin_token is not set" not in result.stdout
    assert sections(result.stdout)["server"]["admin_token"] == "(set)"
    assert "0123456789abcdef-secret" not in result.stdout
    config.write_text('admin_token = "short"\n')
    result = check(str(config))
    assert result.returncode == 2 and "admin_token: at least 16 characters" in result.stderr


def test_it_warns_that_an_auth_file_without_client_certificates_shuts_the_thrift_port(tmp_path):
    users = tmp_path / "users"
    users.write_text("alice:secret\n")
    conf = tmp_path / "k.conf"
    conf.write_text(f'listen_address = "127.0.0.1"\nauth_file = "{users}"\nthrift_port = 2229\n')
    result = check(str(conf))
    assert result.returncode == 0, result.stderr
    assert "the thrift port refuses every call" in result.stdout + result.stderr
    conf.write_text(f'listen_address = "127.0.0.1"\nauth_file = "{users}"\n')
    result = check(str(conf))
    assert result.returncode == 0, result.stderr
    assert "thrift port refuses" not in result.stdout + result.stderr


def test_settings_left_to_the_build_show_the_value_the_server_will_use(tmp_path):
    config = tmp_path / "k.conf"
    config.write_text(f'queue_path = "{tmp_path / "q"}"\n')
    compiled = sections(check(str(config)).stdout)["server"]
    plain = sections(check_plain(str(config)).stdout)["server"]
    if implementation() == "compiled":
        assert compiled["busy_poll_us"] == "30 (compiled build's default)"
    assert plain["busy_poll_us"] == "0 (plain Python build's default)"
    assert compiled["status_file"] == f"{tmp_path / 'q' / '.kestreld-status'} (in queue_path)"


def check_plain(*args: str) -> subprocess.CompletedProcess:
    """``check`` on the plain Python of the compiled modules."""
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "--check-config", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KESTRELD_NO_EXTENSIONS": "1"},
    )
