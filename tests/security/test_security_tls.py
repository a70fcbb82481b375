"""TLS on the memcache port: real clients (pymemcache, ``openssl s_client``, raw sockets)
against a real kestreld, with certificates made by the ``openssl`` command in a temp dir."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import time

import pytest
from certs import CertificateAuthority, require_openssl
from kestreld_process import Conn
from pymemcache.client.base import Client
from waiting import wait_until


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    require_openssl()
    authority = CertificateAuthority(tmp_path_factory.mktemp("pki"), "ca")
    authority.issue("server")
    authority.issue("client", "alice", client=True)
    return authority


def tls_config(ca, **extra) -> str:
    lines = [
        f'tls_cert_file = "{ca.folder / "server.crt"}"',
        f'tls_key_file = "{ca.folder / "server.key"}"',
    ]
    lines += [f"{k} = {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def tls_conn(proc, context: ssl.SSLContext) -> Conn:
    raw = socket.create_connection(("127.0.0.1", proc.port), timeout=10)
    return Conn(context.wrap_socket(raw, server_hostname="localhost"))


def pymemcache_client(proc, context: ssl.SSLContext) -> Client:
    return Client(("127.0.0.1", proc.port), tls_context=context, connect_timeout=10, timeout=10)


def test_pymemcache_sets_and_gets_over_tls(make_server, ca):
    proc = make_server(tls_config(ca))
    client = pymemcache_client(proc, ca.client_context())
    assert client.set("jobs", b"over tls") is True
    assert client.get("jobs") == b"over tls"
    assert client.version().startswith(b"1.")
    client.close()


def test_openssl_s_client_talks_to_the_tls_port(make_server, ca):
    proc = make_server(tls_config(ca))
    client = subprocess.Popen(
        [
            require_openssl(),
            "s_client",
            "-connect",
            f"127.0.0.1:{proc.port}",
            "-CAfile",
            str(ca.cert),
            "-verify_return_error",
            "-quiet",
        ],  # fmt: skip
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    # s_client leaves at the end of its input: the input stays open until the replies came.
    assert client.stdin is not None and client.stdout is not None
    client.stdin.write(b"set s 0 0 5\r\nhello\r\nget s\r\n")
    client.stdin.flush()
    try:
        lines = [client.stdout.readline() for _ in range(4)]
    finally:
        client.stdin.close()
        client.kill()
        client.wait()
    assert lines == [b"STORED\r\n", b"VALUE s 0 5\r\n", b"hello\r\n", b"END\r\n"]


def test_a_plaintext_client_on_the_tls_port_is_closed_and_others_go_on(make_server, ca):
    proc = make_server(tls_config(ca))
    plain = Conn(proc.connect())
    plain.send(b"set q 0 0 1\r\nx\r\nget q\r\n")
    assert plain.closed(timeout=10)  # refused: no reply, the connection ends
    assert plain.buf == b"SERVER_ERROR this port requires TLS\r\n"
    plain.close()
    good = tls_conn(proc, ca.client_context())
    assert good.set("q", "y") == b"STORED"
    assert good.get("q") == b"y"  # nothing of the plaintext set was stored
    good.close()


def test_a_stalled_handshake_times_out_without_holding_up_other_clients(make_server, ca):
    proc = make_server(tls_config(ca, tls_handshake_timeout='"4s"'))
    stalled = Conn(proc.connect())
    stalled.send(b"\x16\x03\x01")  # the first bytes of a ClientHello, and then nothing
    started = time.monotonic()
    good = tls_conn(proc, ca.client_context())
    assert good.set("beside", "ok") == b"STORED"
    assert good.get("beside") == b"ok"
    assert not stalled.closed(timeout=0.01)  # served while the other one still stalls
    assert stalled.closed(timeout=30)  # then the server gave up on it
    assert time.monotonic() - started >= 3.5
    failed = wait_until(lambda: proc.events("tls_handshake_failed"), "the log line")
    assert failed[-1]["reason"] == "handshake timed out"
    assert good.set("beside", "still") == b"STORED"
    good.close()
    stalled.close()


def test_mutual_tls_requires_a_client_certificate_from_the_ca(make_server, ca, tmp_path):
    proc = make_server(tls_config(ca, tls_ca_file=f'"{ca.cert}"', tls_verify_client="true"))
    with_cert = tls_conn(proc, ca.client_context(ca.folder / "client.crt"))
    assert with_cert.set("m", "1") == b"STORED"
    with_cert.close()

    no_cert = None
    try:
        no_cert = tls_conn(proc, ca.client_context())
        # TLS 1.3: the refusal comes after the client's side of the handshake finished.
        no_cert.send(b"version\r\n")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            no_cert.line()
    except (ssl.SSLError, ConnectionError):
        pass
    finally:
        if no_cert is not None:
            no_cert.close()

    stranger_ca = CertificateAuthority(tmp_path / "other", "stranger")
    stranger_cert = stranger_ca.issue("mallory", "mallory", client=True)
    context = ca.client_context()
    context.load_cert_chain(str(stranger_cert), str(stranger_cert.with_suffix(".key")))
    stranger = None
    try:
        stranger = tls_conn(proc, context)
        stranger.send(b"version\r\n")
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
            stranger.line()
    except (ssl.SSLError, ConnectionError):
        pass
    finally:
        if stranger is not None:
            stranger.close()


def test_reload_rotates_the_certificate_without_dropping_connections(make_server, ca, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(ca.folder / "server.crt", live / "server.crt")
    shutil.copy(ca.folder / "server.key", live / "server.key")
    proc = make_server(
        f'tls_cert_file = "{live / "server.crt"}"\ntls_key_file = "{live / "server.key"}"\n'
    )
    old = tls_conn(proc, ca.client_context())
    assert old.set("rot", "before") == b"STORED"

    renewed = CertificateAuthority(tmp_path / "renewed", "renewed-ca")
    renewed.issue("server")
    shutil.copy(renewed.folder / "server.crt", live / "server.crt")
    shutil.copy(renewed.folder / "server.key", live / "server.key")
    old.send(b"reload\r\n")
    assert old.line() == b"Reloaded config."

    # New handshakes get the renewed certificate; the old connection keeps working.
    fresh = tls_conn(proc, renewed.client_context())
    assert fresh.get("rot") == b"before"
    fresh.close()
    with pytest.raises(ssl.SSLCertVerificationError):
        tls_conn(proc, ca.client_context())
    assert old.set("rot", "after") == b"STORED"

    # SIGHUP does the same (the daemon convention): back to the first certificate.
    shutil.copy(ca.folder / "server.crt", live / "server.crt")
    shutil.copy(ca.folder / "server.key", live / "server.key")
    reloaded = len(proc.events("tls_reloaded"))
    os.kill(proc.pid, signal.SIGHUP)
    # Each process serving the port reloads (a box of workers: each worker).
    wait_until(
        lambda: len(proc.events("tls_reloaded")) >= reloaded + proc.workers, "the SIGHUP reload"
    )
    again = tls_conn(proc, ca.client_context())
    assert again.get("rot") == b"after"
    again.close()
    assert old.get("rot") is None
    old.close()


def test_a_reload_with_broken_certificate_files_keeps_the_old_ones(make_server, ca, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(ca.folder / "server.crt", live / "server.crt")
    shutil.copy(ca.folder / "server.key", live / "server.key")
    proc = make_server(
        f'tls_cert_file = "{live / "server.crt"}"\ntls_key_file = "{live / "server.key"}"\n'
    )
    (live / "server.key").write_text("not a key\n")
    c = tls_conn(proc, ca.client_context())
    c.send(b"reload\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR config not reloaded: tls: cannot use certificate")
    c.close()
    again = tls_conn(proc, ca.client_context())  # still served with the old certificate
    assert again.set("k", "v") == b"STORED"
    again.close()


def test_tls_files_that_cannot_be_used_stop_start_up_naming_the_file(make_server, ca, tmp_path):
    missing = tmp_path / "nope.crt"
    proc = make_server(
        f'tls_cert_file = "{missing}"\ntls_key_file = "{ca.folder / "server.key"}"\n',
        start=False,
    )
    with pytest.raises(RuntimeError) as failed:
        proc.start()
    assert str(missing) in str(failed.value)
    mismatched = make_server(
        f'tls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'tls_key_file = "{ca.folder / "client.key"}"\n',
        start=False,
    )
    with pytest.raises(RuntimeError) as failed:
        mismatched.start()
    assert "cannot use certificate" in str(failed.value)


def test_tls_keys_must_come_together():
    from kestreld.config import ConfigError
    from kestreld.config.model import build_config

    with pytest.raises(ConfigError, match="tls_cert_file and tls_key_file"):
        build_config({"tls_cert_file": "a.crt"})
    with pytest.raises(ConfigError, match="tls_verify_client: needs tls_ca_file"):
        build_config({"tls_cert_file": "a", "tls_key_file": "b", "tls_verify_client": True})


def test_ping_counts_the_tls_ports_answer_as_up(make_server, ca):
    import sys

    proc = make_server(tls_config(ca))
    result = subprocess.run(
        [sys.executable, "-m", "kestreld", "ping", "--port", str(proc.port)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "requires TLS" in result.stdout


def test_reload_rotates_the_client_ca_of_mutual_tls(make_server, ca, tmp_path):
    other = CertificateAuthority(tmp_path / "other", "other-ca")
    bob = other.issue("bob", "bob", client=True)
    live = tmp_path / "live"
    live.mkdir()
    shutil.copy(ca.cert, live / "clients.crt")
    proc = make_server(
        tls_config(ca, tls_ca_file=f'"{live / "clients.crt"}"', tls_verify_client="true")
    )

    def answers(cert) -> bool:
        try:
            c = tls_conn(proc, ca.client_context(cert))
            c.send(b"version\r\n")
            c.line()
            c.close()
            return True
        except (ssl.SSLError, ConnectionError, OSError):
            return False

    alice = ca.folder / "client.crt"
    assert answers(alice) and not answers(bob)
    admin = tls_conn(proc, ca.client_context(alice))
    shutil.copy(other.cert, live / "clients.crt")
    admin.send(b"reload\r\n")
    assert admin.line() == b"Reloaded config."
    assert answers(bob) and not answers(alice)
    assert admin.set("still", "open") == b"STORED"  # the connection made before goes on
    admin.close()
