"""The admin port against a DNS-rebinding page, and over HTTPS.

A page of ``evil.example`` whose name now resolves to 127.0.0.1 sends its
requests with ``Host: evil.example:PORT`` (and, being "same origin" to the
browser, a matching ``Origin`` and ``Sec-Fetch-Site: same-origin``).  Every
test sends raw HTTP requests, as such a browser would, to a real kestreld.
"""

from __future__ import annotations

import json
import socket
import ssl

import pytest
from certs import CertificateAuthority, require_openssl
from kestreld_process import Conn, KestreldProcess

ADMIN = "admin_port = 0\n"
TOKEN = "s3cret-admin-token-0123456789"


def admin_address(proc: KestreldProcess) -> tuple[str, int]:
    host, port = proc.events("metrics_listening")[-1]["address"].rsplit(":", 1)
    return host, int(port)


def request(
    proc: KestreldProcess,
    method: str,
    path: str,
    host: str | None,
    headers: dict[str, str] | None = None,
    *,
    connect_to: str | None = None,
    tls: ssl.SSLContext | None = None,
) -> tuple[int, bytes]:
    """One raw HTTP/1.1 request with exactly these headers: (status, body)."""
    address, port = admin_address(proc)
    lines = [f"{method} {path} HTTP/1.1"]
    if host is not None:
        lines.append(f"Host: {host.replace('PORT', str(port))}")
    lines += [f"{k}: {v.replace('PORT', str(port))}" for k, v in (headers or {}).items()]
    data = ("\r\n".join(lines) + "\r\n\r\n").encode()
    with socket.create_connection((connect_to or address, port), timeout=15) as raw:
        sock = tls.wrap_socket(raw, server_hostname="localhost") if tls else raw
        sock.sendall(data)
        reply = b""
        while chunk := sock.recv(65536):
            reply += chunk
    head, _, body = reply.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


REBINDING = {"Origin": "http://evil.example:PORT", "Sec-Fetch-Site": "same-origin"}


def still_up(proc: KestreldProcess) -> bool:
    c = Conn(proc.connect())
    c.send("status\r\n")
    up = c.line() == b"UP"
    c.close()
    return up and proc.proc.poll() is None


@pytest.mark.parametrize("path", ["/shutdown", "/quiesce", "/reload"])
def test_a_rebinding_page_cannot_change_the_server(make_server, path):
    proc = make_server(ADMIN + "max_items = 5\n")
    proc.config_path.write_text(ADMIN + "max_items = 7\n")
    status, body = request(proc, "POST", path, "evil.example:PORT", REBINDING)
    assert status == 403, body
    assert b"Host" in body
    assert still_up(proc)
    c = Conn(proc.connect())
    c.send("dump_config q\r\n")
    assert b"  max_items=5" in c.until_end()  # not reloaded either
    c.close()


def test_a_plain_get_with_a_foreign_host_and_no_origin_is_refused(make_server):
    proc = make_server(ADMIN)
    assert request(proc, "GET", "/reload", "evil.example:PORT")[0] == 403
    assert request(proc, "GET", "/shutdown", "evil.example")[0] == 403
    assert still_up(proc)


def test_on_loopback_every_request_needs_a_host_naming_this_server(make_server):
    proc = make_server(ADMIN)
    for path in ("/stats.json", "/metrics", "/ping", "/", "/admin/overview.json"):
        assert request(proc, "GET", path, "evil.example:PORT")[0] == 403, path
    assert request(proc, "GET", "/stats.json", None)[0] == 403  # no Host at all
    assert request(proc, "GET", "/stats.json", "evil.example:notaport")[0] == 403
    assert proc.events("admin_request_refused")


@pytest.mark.parametrize("host", ["localhost:PORT", "127.0.0.1:PORT", "LOCALHOST", "127.0.0.1"])
def test_loopback_names_and_addresses_are_this_server(make_server, host):
    proc = make_server(ADMIN)
    status, body = request(proc, "GET", "/ping.json", host)
    assert (status, json.loads(body)) == (200, {"response": "pong"})


def test_ipv6_loopback_is_this_server(make_server):
    proc = make_server(ADMIN + 'admin_address = "::1"\n')
    assert request(proc, "GET", "/ping.json", "[::1]:PORT")[0] == 200
    assert request(proc, "GET", "/ping.json", "evil.example:PORT")[0] == 403


def test_a_loopback_host_may_change_the_server_without_a_token(make_server):
    proc = make_server(ADMIN)
    status, body = request(proc, "POST", "/shutdown", "localhost:PORT")
    assert (status, json.loads(body)) == (200, {"response": "ok"})
    assert proc.proc.wait(15) == 0


def test_admin_allowed_hosts_names_more_hosts(make_server):
    proc = make_server(ADMIN + 'admin_allowed_hosts = ["Kestreld-1.Internal"]\n')
    assert request(proc, "GET", "/ping.json", "kestreld-1.internal:PORT")[0] == 200
    assert request(proc, "GET", "/ping.json", "kestreld-2.internal:PORT")[0] == 403
    status, body = request(proc, "POST", "/reload", "kestreld-1.internal:PORT")
    assert status == 200, body


def test_the_token_does_not_open_a_loopback_port_to_a_foreign_host(make_server):
    proc = make_server(ADMIN + f'admin_token = "{TOKEN}"\n')
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert request(proc, "POST", "/shutdown", "evil.example:PORT", auth)[0] == 403
    assert still_up(proc)
    assert request(proc, "POST", "/reload", "127.0.0.1:PORT", auth)[0] == 200


def test_beyond_loopback_reading_takes_any_host_and_the_address_it_arrived_on_is_this_server(
    make_server,
):
    proc = make_server(ADMIN + 'admin_address = "0.0.0.0"\n')
    local = _non_loopback_address()
    if local is None:
        pytest.skip("this machine has no address beyond loopback")
    # A scraper elsewhere names the server however its DNS does: reading is open there.
    assert request(proc, "GET", "/ping.json", "kestreld.example", connect_to=local)[0] == 200
    # The same port reached over loopback (a local browser) follows the Host rule.
    assert request(proc, "GET", "/ping.json", "evil.example:PORT", connect_to="127.0.0.1")[0] == 403
    assert request(proc, "GET", "/ping.json", f"{local}:PORT", connect_to="127.0.0.1")[0] == 403
    # Changing stays refused without a token, whatever the Host.
    assert request(proc, "POST", "/shutdown", f"{local}:PORT", connect_to=local)[0] == 403
    assert still_up(proc)


def _non_loopback_address() -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.mark.parametrize(
    "value, message",
    [
        ('"kestreld-1"', "expected a list of host names"),
        ('["kestreld-1:8080"]', "without a port"),
        ('["a b"]', "is not a host name"),
    ],
)
def test_admin_allowed_hosts_must_be_names(tmp_path, value, message):
    from kestreld.config import ConfigError, build_config

    with pytest.raises(ConfigError, match=message):
        build_config({"admin_allowed_hosts": __import__("tomllib").loads(f"v = {value}")["v"]})


# --- HTTPS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    require_openssl()
    authority = CertificateAuthority(tmp_path_factory.mktemp("admin-pki"), "ca")
    authority.issue("server")
    return authority


def admin_tls(ca: CertificateAuthority) -> str:
    return (
        f'admin_tls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'admin_tls_key_file = "{ca.folder / "server.key"}"\n'
    )


def test_the_admin_port_speaks_https_with_its_certificate(make_server, ca):
    proc = make_server(ADMIN + admin_tls(ca))
    assert proc.events("metrics_listening")[-1]["tls"] is True
    status, body = request(proc, "GET", "/ping.json", "localhost:PORT", tls=ca.client_context())
    assert (status, json.loads(body)) == (200, {"response": "pong"})


def test_plain_http_to_the_https_admin_port_gets_no_answer(make_server, ca):
    proc = make_server(ADMIN + admin_tls(ca))
    with pytest.raises((ValueError, IndexError, ConnectionError)):
        request(proc, "GET", "/ping.json", "localhost:PORT")
    assert still_up(proc)


def test_reload_renews_the_admin_certificate(make_server, ca, tmp_path):
    import shutil

    live = tmp_path / "live"
    live.mkdir()
    for ext in ("crt", "key"):
        shutil.copy(ca.folder / f"server.{ext}", live / f"admin.{ext}")
    config = ADMIN + (
        f'admin_tls_cert_file = "{live / "admin.crt"}"\n'
        f'admin_tls_key_file = "{live / "admin.key"}"\n'
    )
    proc = make_server(config)
    renewed = CertificateAuthority(tmp_path / "renewed", "renewed-ca")
    renewed.issue("server")
    for ext in ("crt", "key"):
        shutil.copy(renewed.folder / f"server.{ext}", live / f"admin.{ext}")
    c = Conn(proc.connect())
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    c.close()
    status, _ = request(proc, "GET", "/ping.json", "localhost", tls=renewed.client_context())
    assert status == 200
    with pytest.raises(ssl.SSLCertVerificationError):
        request(proc, "GET", "/ping.json", "localhost", tls=ca.client_context())


def test_admin_tls_needs_both_files_and_they_must_load(tmp_path, ca):
    from kestreld.config import ConfigError, build_config

    with pytest.raises(ConfigError, match="admin_tls_cert_file and admin_tls_key_file"):
        build_config({"admin_tls_cert_file": str(ca.folder / "server.crt")})
    proc = KestreldProcess(
        tmp_path / "q",
        ADMIN + f'admin_tls_cert_file = "{tmp_path / "missing.crt"}"\n'
        f'admin_tls_key_file = "{ca.folder / "server.key"}"\n',
        config_path=tmp_path / "k.conf",
    )
    with pytest.raises(RuntimeError, match="missing.crt"):
        proc.start()


def test_the_unspecified_address_is_no_name_of_this_server(make_server):
    # Browsers have dialled http://0.0.0.0:PORT to reach local services ("0.0.0.0 day").
    proc = make_server(ADMIN + 'admin_address = "0.0.0.0"\n')
    assert request(proc, "GET", "/ping.json", "0.0.0.0:PORT", connect_to="127.0.0.1")[0] == 403
    assert request(proc, "GET", "/ping.json", "127.0.0.1:PORT", connect_to="127.0.0.1")[0] == 200


@pytest.mark.parametrize(
    "header, host",
    [
        ("localhost:9090", "localhost"),
        ("LocalHost.", "localhost"),
        ("[::1]:9090", "::1"),
        ("[::1]", "::1"),
        ("10.0.0.5", "10.0.0.5"),
        ("evil.example:9090", "evil.example"),
        ("::1", None),  # a bare IPv6 address: no browser sends it
        ("[::1", None),
        ("[::1]x", None),
        ("a:b", None),
        ("", None),
    ],
)
def test_host_of_reads_a_host_header(header, host):
    from kestreld.admin.http import host_of

    assert host_of(header) == host


# --- reload and check-config ------------------------------------------------------------------


def test_admin_allowed_hosts_applies_on_reload(make_server):
    proc = make_server(ADMIN)
    assert request(proc, "GET", "/ping.json", "kestreld-1.internal")[0] == 403
    proc.config_path.write_text(ADMIN + 'admin_allowed_hosts = ["kestreld-1.internal"]\n')
    c = Conn(proc.connect())
    c.send("reload\r\n")
    assert c.line() == b"Reloaded config."
    c.close()
    assert request(proc, "GET", "/ping.json", "kestreld-1.internal")[0] == 200


def test_changing_the_admin_certificate_files_needs_a_restart(make_server, ca):
    proc = make_server(ADMIN)
    proc.config_path.write_text(ADMIN + admin_tls(ca))
    c = Conn(proc.connect())
    c.send("reload\r\n")
    reply = c.line()
    c.close()
    assert b"needs a restart" in reply and b"admin_tls_cert_file" in reply
    assert request(proc, "GET", "/ping.json", "localhost")[0] == 200  # still plain HTTP


def test_check_config_warns_about_a_token_over_plain_http_beyond_loopback(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "k.conf"
    path.write_text(f'admin_port = 9090\nadmin_address = "0.0.0.0"\nadmin_token = "{TOKEN}"\n')
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "--check-config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "admin_token crosses the network in the clear" in result.stdout
    assert "admin_allowed_hosts=(none)" in result.stdout
