"""The sans-IO parts of kestreld/security: password hashes, the auth file, roles and
patterns, the failure limiter, the memcache auth token; and ``kestreld passwd``."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from kestreld.config import ConfigError
from kestreld.config.model import build_config
from kestreld.security import (
    AuthFileError,
    FailureLimiter,
    Role,
    hash_password,
    load_auth_file,
    parse_auth_file,
    parse_token,
    verify_password,
)
from kestreld.security.passwords import PasswordHashError, check_hash

#: Cheap hashes for tests that make many (the format and the check are the same).
FAST = {"log2_n": 4}


# --- passwords ------------------------------------------------------------------------------


def test_a_hash_checks_its_password_and_no_other():
    encoded = hash_password("s3cret", **FAST)
    assert encoded.startswith("$scrypt$ln=4,r=8,p=1$")
    assert verify_password(b"s3cret", encoded)
    assert not verify_password(b"s3cre", encoded)
    assert not verify_password(b"", encoded)


def test_the_same_password_hashes_differently_each_time():
    assert hash_password("pw", **FAST) != hash_password("pw", **FAST)


def test_new_hashes_use_the_default_cost():
    encoded = hash_password("pw")
    assert encoded.startswith("$scrypt$ln=14,r=8,p=1$")
    check_hash(encoded)


@pytest.mark.parametrize(
    "bad",
    [
        "plain",
        "$scrypt$ln=14,r=8,p=1$c2FsdA",  # no key
        "$scrypt$ln=30,r=8,p=1$c2FsdHNhbHQ$a2V5a2V5a2V5a2V5a2V5a2V5",  # too much memory
        "$scrypt$ln=14,r=8,p=1$c2FsdHNhbHQ$a2V5",  # key too short
    ],
)
def test_malformed_hashes_are_refused(bad):
    with pytest.raises(PasswordHashError):
        check_hash(bad)
    assert not verify_password(b"anything", bad)


# --- the auth file --------------------------------------------------------------------------


def test_auth_file_lines_give_users_roles_and_patterns():
    h = hash_password("pw", **FAST)
    users = parse_auth_file(
        f"# comment\n\nalice:{h}\nfeeder:{h}:write:orders*,invoices\nops:{h}:read,admin\n"
    ).users
    assert users["alice"].roles == frozenset(Role)  # no roles field: all three
    assert users["alice"].patterns == ()
    assert users["feeder"].roles == {Role.WRITE}
    assert users["feeder"].patterns == ("orders*", "invoices")
    assert users["ops"].roles == {Role.READ, Role.ADMIN}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("alice", "expected name:password hash"),
        ("alice:{h}:read:q:extra", "expected name:password hash"),
        ("al ice:{h}", "user name"),
        ("alice:", "empty password"),
        ("alice:$scrypt$ln=99$x$y", "not a $scrypt$"),
        ("alice:{h}:reed", "unknown role 'reed'"),
        ("alice:{h}:read:", "bad queue patterns"),
        ("alice:{h}\nalice:{h}", "listed twice"),
    ],
)
def test_a_malformed_auth_file_names_the_line(line, message):
    text = "# users\n" + line.format(h=hash_password("pw", **FAST))
    with pytest.raises(AuthFileError) as raised:
        parse_auth_file(text, "users.txt")
    assert message in str(raised.value)
    assert "users.txt line " in str(raised.value)


def test_a_plaintext_password_is_accepted_as_memcached_does_and_reported():
    parsed = parse_auth_file("# memcached -Y format\nalice:secret\n")
    assert parsed.users["alice"].password_hash == "secret"
    assert parsed.plaintext_lines == [2]


def test_an_unreadable_or_empty_auth_file_is_an_error(tmp_path):
    with pytest.raises(AuthFileError, match="does not exist"):
        load_auth_file(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("# nobody\n")
    with pytest.raises(AuthFileError, match="lists no users"):
        load_auth_file(str(empty))
    if os.geteuid() != 0:  # root reads anything
        locked = tmp_path / "locked"
        locked.write_text("a:b\n")
        locked.chmod(0)
        with pytest.raises(AuthFileError, match="cannot read"):
            load_auth_file(str(locked))


# --- roles and patterns ---------------------------------------------------------------------


def test_roles_and_patterns_decide_each_action():
    h = hash_password("pw", **FAST)
    users = parse_auth_file(f"all:{h}\nfeeder:{h}:write:orders*\nops:{h}:admin\n").users
    everyone, feeder, ops = users["all"], users["feeder"], users["ops"]
    assert everyone.permits(Role.ADMIN, None) and everyone.permits(Role.READ, "any")
    assert feeder.permits(Role.WRITE, "orders")
    assert feeder.permits(Role.WRITE, "orders_eu+audit")  # a reader belongs to its queue
    assert not feeder.permits(Role.WRITE, "invoices")
    assert not feeder.permits(Role.READ, "orders")
    assert not feeder.permits(Role.WRITE, None)  # server-wide needs an unlimited role
    assert ops.permits(Role.ADMIN, None) and ops.permits(Role.ADMIN, "orders")
    assert not ops.permits(Role.WRITE, "orders")


# --- the failure limiter ----------------------------------------------------------------------


def test_failures_are_free_at_first_then_delayed_doubling_to_a_ceiling():
    limiter = FailureLimiter(free=3, first_delay=0.25, max_delay=1.0)
    delays = [limiter.failed("10.0.0.1", float(t)) for t in range(7)]
    assert delays == [0.0, 0.0, 0.0, 0.25, 0.5, 1.0, 1.0]
    assert limiter.failed("10.0.0.2", 7.0) == 0.0  # another address is not slowed


def test_success_or_a_quiet_spell_forgets_an_address():
    limiter = FailureLimiter(free=1, first_delay=0.5, forget_after=60)
    limiter.failed("a", 0.0)
    assert limiter.failed("a", 1.0) == 0.5
    limiter.succeeded("a")
    assert limiter.failed("a", 2.0) == 0.0
    assert limiter.failed("a", 3.0) == 0.5
    assert limiter.failed("a", 100.0) == 0.0  # quiet for longer than forget_after


def test_a_flood_of_addresses_cannot_grow_the_table():
    limiter = FailureLimiter(capacity=100)
    for i in range(10_000):
        limiter.failed(f"10.0.{i // 256}.{i % 256}", float(i))
    assert len(limiter) == 100


# --- the memcache auth token ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "parsed"),
    [
        (b"alice secret", ("alice", b"secret")),
        (b"alice  secret", ("alice", b"secret")),  # memcached 1.6 skips runs of spaces
        (b" alice secret", ("alice", b"secret")),
        (b"alice secret extra", ("alice", b"secret")),
        (b"alicesecret", None),
        (b"alice ", None),
        (b"", None),
        (b"alice\tsecret", None),  # only spaces separate
    ],
)
def test_the_auth_token_is_read_as_memcached_reads_it(data, parsed):
    assert parse_token(data) == parsed


# --- config keys ----------------------------------------------------------------------------


def test_security_config_keys_are_validated():
    cfg = build_config({"auth_file": "/etc/kestreld/users", "max_queues": 10})
    assert (cfg.auth_file, cfg.max_queues, cfg.create_queue_on_get) == (
        "/etc/kestreld/users",
        10,
        True,
    )
    with pytest.raises(ConfigError, match="max_queues: must be at least 1"):
        build_config({"max_queues": 0})
    with pytest.raises(ConfigError, match="create_queue_on_get"):
        build_config({"create_queue_on_get": "sometimes"})


# --- kestreld passwd ------------------------------------------------------------------------


def passwd(*args: str, password: str = "s3cret") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "passwd", *args],
        input=password + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_passwd_prints_a_line_the_server_accepts():
    result = passwd("alice", "--roles", "read,write", "--queues", "orders*")
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    user = parse_auth_file(line).users["alice"]
    assert user.roles == {Role.READ, Role.WRITE} and user.patterns == ("orders*",)
    assert verify_password(b"s3cret", user.password_hash)


def test_passwd_writes_the_auth_file_replacing_the_users_line(tmp_path):
    path = tmp_path / "users"
    assert passwd("alice", "--file", str(path)).returncode == 0
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # a new file: its owner's only
    assert passwd("bob", "--file", str(path), "--roles", "read").returncode == 0
    assert passwd("alice", "--file", str(path), password="changed").returncode == 0
    users = load_auth_file(str(path)).users
    assert sorted(users) == ["alice", "bob"]
    assert verify_password(b"changed", users["alice"].password_hash)
    assert users["bob"].roles == {Role.READ}


def test_passwd_refuses_unusable_input(tmp_path):
    assert passwd("alice", password="two words").returncode == 2
    assert passwd("alice", password="").returncode == 2
    result = passwd("alice", "--roles", "superuser")
    assert result.returncode == 2 and "unknown role" in result.stderr
    broken = tmp_path / "broken"
    broken.write_text("not a line\n")
    result = passwd("alice", "--file", str(broken))
    assert result.returncode == 2 and "line 1" in result.stderr
    assert broken.read_text() == "not a line\n"
