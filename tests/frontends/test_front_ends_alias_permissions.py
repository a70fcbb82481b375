"""Permissions are judged on the queues a request reaches, alike on the three front ends.

A user who may write ``pub*`` but not ``secret`` cannot reach ``secret`` through an
alias whose destinations include it: the put is refused with the front end's own
permission error and nothing is stored anywhere.  An alias whose destinations are
all writable takes the put.  Real clients: raw sockets for memcache and text, a
thriftpy2 client with a TLS client certificate for thrift (its only way to
authenticate).
"""

from __future__ import annotations

import pytest
from certs import CertificateAuthority, require_openssl
from kestrel_fronts import TextConn, start_fronts
from kestrel_fronts import kestrel as idl
from kestreld_process import Conn
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory

from kestreld.security import hash_password

ALIASES = """
[aliases.pub_fan]
destination_queues = ["secret", "pub1"]
[aliases.pub_ok]
destination_queues = ["pub2", "pub3"]
"""


def _user(name: str, password: str, roles: str, patterns: str = "") -> str:
    fields = [name, hash_password(password, log2_n=4), roles]
    if patterns:
        fields.append(patterns)
    return ":".join(fields)


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    require_openssl()
    authority = CertificateAuthority(tmp_path_factory.mktemp("pki"), "ca")
    authority.issue("server")
    authority.issue("pub", "pub", client=True)
    return authority


@pytest.fixture(scope="module")
def proc(tmp_path_factory, ca):
    folder = tmp_path_factory.mktemp("alias_permissions")
    users = folder / "users"
    users.write_text(
        _user("pub", "p", "read,write", "pub*") + "\n" + _user("admin", "a", "read,write,admin")
    )
    config = (
        f'auth_file = "{users}"\n'
        f'tls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'tls_key_file = "{ca.folder / "server.key"}"\n'
        f'tls_ca_file = "{ca.cert}"\n'
        "tls_verify_client = true\n" + ALIASES
    )
    server = start_fronts(folder / "queues", config)
    server.ca = ca
    yield server
    server.stop()


def _tls(proc, sock):
    """Every port speaks TLS here, with a client certificate (tls_verify_client)."""
    return proc.ca.client_context(proc.ca.folder / "pub.crt").wrap_socket(
        sock, server_hostname="localhost"
    )


def _memcache(proc, user: str, password: str) -> Conn:
    c = Conn(_tls(proc, proc.connect()))
    token = f"{user} {password}".encode()
    c.send(b"set auth 0 0 %d\r\n%s\r\n" % (len(token), token))
    assert c.line() == b"STORED"
    return c


def _text(proc, user: str, password: str) -> TextConn:
    c = TextConn(proc.text_port)
    c.sock = _tls(proc, c.sock)
    assert c.ask(f"auth {user} {password}") == b"+1"
    return c


def _thrift(proc, ca):
    return make_client(
        idl.Kestrel,
        "localhost",
        proc.thrift_port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=20000,
        ssl_context=ca.client_context(ca.folder / "pub.crt"),
    )


def _nothing_stored(proc) -> None:
    admin = _memcache(proc, "admin", "a")
    for queue in ("secret", "pub1", "pub_fan"):
        admin.send(f"get {queue}\r\n")
        assert admin.line() == b"END", f"{queue} received an item"
    admin.close()


def test_memcache_put_through_an_alias_needs_write_on_every_destination(proc):
    c = _memcache(proc, "pub", "p")
    c.send(b"set secret 0 0 1\r\nx\r\n")
    assert c.line() == b"CLIENT_ERROR permission denied"
    c.send(b"set pub_fan 0 0 1\r\nx\r\n")
    assert c.line() == b"CLIENT_ERROR permission denied"
    c.send(b"set pub_ok 0 0 1\r\nx\r\n")
    assert c.line() == b"STORED"
    c.close()
    _nothing_stored(proc)


def test_text_put_through_an_alias_needs_write_on_every_destination(proc):
    c = _text(proc, "pub", "p")
    assert c.put("pub_fan", "x", "y") == b"-Permission denied."
    assert c.put("pub_ok", "x") == b"+1"
    c.close()
    _nothing_stored(proc)


def test_thrift_put_through_an_alias_needs_write_on_every_destination(proc, ca):
    client = _thrift(proc, ca)
    try:
        with pytest.raises(TApplicationException) as refused:
            client.put("pub_fan", [b"x"], 0)
        assert "permission denied" in refused.value.message
        assert client.put("pub_ok", [b"x"], 0) == 1
    finally:
        client.close()
    _nothing_stored(proc)


def test_a_fanout_reader_is_judged_by_its_own_name(proc):
    c = _text(proc, "pub", "p")
    assert c.ask("get secret+r") == b"-Permission denied."
    assert c.ask("get pub9+r") == b"*"
    c.close()
