"""The tools that talk to a running server (``kestreld ping``, ``queues``, ``move``) log in:
TLS, mutual TLS and an auth file with roles, against real servers, through the documented
flags.  A failure says which of TLS, authentication or permission failed, and exits 1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from certs import CertificateAuthority, require_openssl
from kestreld_process import Conn

from kestreld.client import Client
from kestreld.security import hash_password

FAST = {"log2_n": 4}  # cheap hashes


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    require_openssl()
    authority = CertificateAuthority(tmp_path_factory.mktemp("pki"), "ca")
    authority.issue("server")
    authority.issue("client", "alice", client=True)
    return authority


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory):
    return CertificateAuthority(tmp_path_factory.mktemp("other-pki"), "other-ca")


def tls_config(ca: CertificateAuthority, mutual: bool = False) -> str:
    lines = [
        f'tls_cert_file = "{ca.folder / "server.crt"}"',
        f'tls_key_file = "{ca.folder / "server.key"}"',
    ]
    if mutual:
        lines += [f'tls_ca_file = "{ca.cert}"', "tls_verify_client = true"]
    return "\n".join(lines) + "\n"


def auth_config(tmp_path) -> str:
    users = tmp_path / "users"
    users.write_text(
        "\n".join(
            [
                f"admin:{hash_password('admin-pw', **FAST)}:read,write,admin",
                f"reader:{hash_password('reader-pw', **FAST)}:read",
            ]
        )
        + "\n"
    )
    return f'auth_file = "{users}"\n'


def password_file(tmp_path, password: str) -> str:
    path = tmp_path / f"pw-{password}"
    path.write_text(password + "\n")
    path.chmod(0o600)
    return str(path)


def tool(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def tls_flags(ca: CertificateAuthority) -> list[str]:
    return ["--tls-ca-file", str(ca.cert)]


def client_cert_flags(ca: CertificateAuthority) -> list[str]:
    return [
        "--tls-cert-file",
        str(ca.folder / "client.crt"),
        "--tls-key-file",
        str(ca.folder / "client.key"),
    ]


def put(proc, queue: str, *items: str, login: tuple[str, str] | None = None) -> None:
    c = Conn(proc.connect())
    if login is not None:
        token = f"{login[0]} {login[1]}".encode()
        c.send(b"set auth 0 0 %d\r\n%s\r\n" % (len(token), token))
        assert c.line() == b"STORED"
    for item in items:
        assert c.set(queue, item) == b"STORED"
    c.close()


# --- TLS --------------------------------------------------------------------------------------


def test_ping_over_tls_prints_version_and_status(make_server, ca):
    proc = make_server(tls_config(ca))
    result = tool("ping", "--port", str(proc.port), *tls_flags(ca))
    assert result.returncode == 0, result.stderr
    version, status = result.stdout.splitlines()
    assert version == proc.events("listening")[0]["version"]
    assert status == "status: UP"


def test_queues_over_tls_shows_the_table(make_server, ca, tmp_path):
    proc = make_server(tls_config(ca))
    result = tool("queues", "--port", str(proc.port), *tls_flags(ca))
    assert result.returncode == 0, result.stderr
    assert "no queues" in result.stdout


def test_an_untrusted_server_certificate_is_a_tls_error(make_server, ca, other_ca):
    proc = make_server(tls_config(ca))
    for command in ("ping", "queues"):
        result = tool(command, "--port", str(proc.port), "--tls-ca-file", str(other_ca.cert))
        assert result.returncode == 1, (command, result.stdout)
        assert "TLS failed: CERTIFICATE_VERIFY_FAILED" in result.stderr, result.stderr


def test_a_server_name_the_certificate_lacks_is_a_tls_error(make_server, ca):
    proc = make_server(tls_config(ca))
    flags = [*tls_flags(ca), "--port", str(proc.port)]
    result = tool("queues", *flags, "--tls-server-name", "kestreld.example")
    assert result.returncode == 1
    assert "TLS failed" in result.stderr and "kestreld.example" in result.stderr
    assert tool("queues", *flags, "--tls-server-name", "localhost").returncode == 0


def test_plaintext_to_a_tls_port_says_tls_is_required(make_server, ca):
    proc = make_server(tls_config(ca))
    result = tool("queues", "--port", str(proc.port))
    assert result.returncode == 1
    assert "TLS required" in result.stderr and "--tls" in result.stderr


def test_tls_to_a_plaintext_port_is_a_tls_error(make_server, ca):
    proc = make_server()
    result = tool("queues", "--port", str(proc.port), *tls_flags(ca))
    assert result.returncode == 1
    assert "TLS failed" in result.stderr


# --- mutual TLS -------------------------------------------------------------------------------


def test_mutual_tls_with_the_client_certificate_moves_items(make_server, ca):
    proc = make_server(tls_config(ca, mutual=True))
    flags = ["--port", str(proc.port), *tls_flags(ca), *client_cert_flags(ca)]
    assert tool("ping", *flags).returncode == 0
    client = Client([f"127.0.0.1:{proc.port}"], tls=ca.client_context(ca.folder / "client.crt"))
    assert client.put("mtls_src", b"one") and client.put("mtls_src", b"two")
    result = tool("move", "mtls_src", "mtls_dst", *flags)
    assert result.returncode == 0, result.stderr
    assert "moved 2 items" in result.stdout
    assert client.get("mtls_dst") == b"one"
    client.close()


def test_mutual_tls_without_a_client_certificate_is_a_tls_error(make_server, ca):
    proc = make_server(tls_config(ca, mutual=True))
    result = tool("queues", "--port", str(proc.port), *tls_flags(ca))
    assert result.returncode == 1
    assert "TLS failed" in result.stderr, result.stderr


def test_a_client_key_without_its_certificate_is_a_usage_error(make_server, ca):
    result = tool("queues", "--tls-key-file", str(ca.folder / "client.key"))
    assert result.returncode == 2
    assert "--tls-key-file needs --tls-cert-file" in result.stderr


# --- authentication and roles ------------------------------------------------------------------


def test_a_read_only_user_sees_queues(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    put(proc, "roles_jobs", "a", "b", login=("admin", "admin-pw"))
    pw = password_file(tmp_path, "reader-pw")
    result = tool("queues", "--port", str(proc.port), "--user", "reader", "--password-file", pw)
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if line.startswith("roles_jobs"))
    assert row.split()[1] == "2"


def test_a_read_only_user_cannot_move_and_nothing_is_lost(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    put(proc, "roles_src", "kept", login=("admin", "admin-pw"))
    pw = password_file(tmp_path, "reader-pw")
    result = tool(
        "move", "roles_src", "roles_dst", "--port", str(proc.port), "--user", "reader",
        "--password-file", pw,
    )  # fmt: skip
    assert result.returncode == 1
    assert "permission denied: user 'reader' may not put items to roles_dst" in result.stderr
    assert "needs the write role" in result.stderr
    c = Conn(proc.connect())
    c.send(b"set auth 0 0 14\r\nadmin admin-pw\r\n")
    assert c.line() == b"STORED"
    assert c.get("roles_src") == b"kept"  # the item in flight went back
    c.close()


def test_the_admin_user_moves_with_the_password_from_the_environment(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    put(proc, "env_src", "x", "y", login=("admin", "admin-pw"))
    result = tool(
        "move", "env_src", "env_dst", "--port", str(proc.port),
        env={"KESTRELD_USER": "admin", "KESTRELD_PASSWORD": "admin-pw"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "moved 2 items" in result.stdout


def test_ping_with_a_read_only_user_gives_the_version_without_the_status(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    pw = password_file(tmp_path, "reader-pw")
    result = tool("ping", "--port", str(proc.port), "--user", "reader", "--password-file", pw)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [proc.events("listening")[0]["version"]]
    pw = password_file(tmp_path, "admin-pw")
    result = tool("ping", "--port", str(proc.port), "--user", "admin", "--password-file", pw)
    assert result.stdout.splitlines()[1:] == ["status: UP"]


def test_a_wrong_password_is_an_authentication_error(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    pw = password_file(tmp_path, "not-the-password")
    for command in ("ping", "queues"):
        result = tool(command, "--port", str(proc.port), "--user", "reader", "--password-file", pw)
        assert result.returncode == 1, command
        assert "authentication failed for user 'reader'" in result.stderr, result.stderr


def test_no_credentials_on_an_auth_server_says_authentication_is_required(make_server, tmp_path):
    proc = make_server(auth_config(tmp_path))
    result = tool("queues", "--port", str(proc.port))
    assert result.returncode == 1
    assert "authentication required" in result.stderr and "--user" in result.stderr


def test_a_user_without_a_password_is_refused_before_connecting(tmp_path):
    result = tool("queues", "--port", "1", "--user", "reader", env={"KESTRELD_PASSWORD": ""})
    assert result.returncode == 2
    assert "--password-file" in result.stderr and "KESTRELD_PASSWORD" in result.stderr


def test_there_is_no_password_flag():
    result = tool("queues", "--password", "secret")
    assert result.returncode == 2  # argparse: unrecognized (never on the command line)


def test_every_connecting_tool_documents_the_login_options():
    for command in ("ping", "queues", "move"):
        result = tool(command, "--help")
        assert result.returncode == 0
        for flag in (
            "--tls", "--tls-ca-file", "--tls-cert-file", "--tls-key-file", "--tls-server-name",
            "--user", "--password-file", "KESTRELD_PASSWORD",
        ):  # fmt: skip
            assert flag in result.stdout, (command, flag)


# --- TLS and authentication together -----------------------------------------------------------


def test_tls_with_mutual_certificates_and_a_login_all_at_once(make_server, ca, tmp_path):
    proc = make_server(tls_config(ca, mutual=True) + auth_config(tmp_path))
    pw = password_file(tmp_path, "admin-pw")
    flags = ["--port", str(proc.port), *tls_flags(ca), *client_cert_flags(ca)]
    result = tool("ping", *flags, "--user", "admin", "--password-file", pw)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "status: UP"
    result = tool("queues", *flags, "--user", "admin", "--password-file", pw)
    assert result.returncode == 0, result.stderr
