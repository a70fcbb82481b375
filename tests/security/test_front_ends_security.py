"""Authentication, roles, limits and aliases on Kestrel's text and thrift front ends,
with real clients: raw sockets for text, thriftpy2 (plain and mutual TLS) for thrift."""

from __future__ import annotations

import pytest
from certs import CertificateAuthority, require_openssl
from kestrel_fronts import TextConn, start_fronts
from kestrel_fronts import kestrel as idl
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.thrift import TApplicationException
from thriftpy2.transport import TFramedTransportFactory

from kestreld.security import hash_password

FAST = {"log2_n": 4}  # cheap hashes


def user(name: str, password: str, roles: str = "", patterns: str = "") -> str:
    fields = [name, hash_password(password, **FAST)]
    if roles or patterns:
        fields.append(roles or "read,write,admin")
    if patterns:
        fields.append(patterns)
    return ":".join(fields)


USERS = [
    user("alice", "secret"),
    user("reader", "r", "read"),
    user("writer", "w", "write"),
    user("orders", "o", "read,write,admin", "orders*"),
    user("ops", "a", "admin"),
]


def auth_config(tmp_path, extra: str = "") -> str:
    path = tmp_path / "users"
    path.write_text("\n".join(USERS) + "\n")
    return f'auth_file = "{path}"\n' + extra


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secured")
    proc = start_fronts(folder / "queues", auth_config(folder))
    yield proc
    proc.stop()


def text_login(proc, name: str, password: str) -> TextConn:
    c = TextConn(proc.text_port)
    assert c.ask(f"auth {name} {password}") == b"+1"
    return c


# --- text -------------------------------------------------------------------------------


def test_text_refuses_every_request_until_the_client_authenticates(secured, qname):
    c = TextConn(secured.text_port)
    try:
        assert c.ask(f"get {qname}") == b"-Unauthenticated."
        c.send(f"put {qname}:\none\ntwo\n\n")  # its item lines are read, not run
        assert c.line() == b"-Unauthenticated."
        assert c.ask("version") == b"-Unauthenticated."
        assert c.ask("status") == b"-Unauthenticated."
        assert c.ask("bogus") == b"-Unauthenticated."
        assert c.ask("auth alice wrong") == b"-Authentication failed."
        assert c.ask("auth alice") == b"-Authentication failed."
        assert c.ask("auth nobody secret") == b"-Authentication failed."
        assert c.ask(f"peek {qname}") == b"-Unauthenticated."
        assert c.ask("auth alice secret") == b"+1"
        assert c.ask(f"peek {qname}") == b"*"  # the refused put stored nothing
        assert c.put(qname, "one") == b"+1"
        assert c.ask(f"get {qname}") == b":one"
    finally:
        c.close()


def test_text_requests_pipelined_behind_auth_run_after_it(secured, qname):
    c = TextConn(secured.text_port)
    try:
        c.send(f"auth alice secret\nput {qname}:\nx\n\npeek {qname}\n")
        assert [c.line(), c.line(), c.line()] == [b"+1", b"+1", b":x"]
    finally:
        c.close()


def test_text_roles_decide_each_command_and_a_refused_put_keeps_the_stream(secured, qname):
    reader = text_login(secured, "reader", "r")
    writer = text_login(secured, "writer", "w")
    ops = text_login(secured, "ops", "a")
    try:
        reader.send(f"put {qname}:\nnot\nstored\n\n")
        assert reader.line() == b"-Permission denied."
        assert reader.ask(f"peek {qname}") == b"*"
        assert writer.put(qname, "job") == b"+1"
        assert writer.ask(f"get {qname}") == b"-Permission denied."
        assert writer.ask(f"monitor {qname} 10") == b"-Permission denied."
        assert writer.ask(f"flush {qname}") == b"-Permission denied."
        assert reader.ask(f"get {qname}") == b":job"
        assert reader.ask(f"confirm {qname} 1") == b"+1"
        assert reader.ask(f"delete {qname}") == b"-Permission denied."
        assert reader.ask("status") == b":UP"  # reading the status needs no role
        assert reader.ask("status readonly") == b"-Permission denied."
        assert reader.ask("shutdown") == b"-Permission denied."
        assert reader.ask("version").startswith(b":")
        assert writer.put(qname, "again") == b"+1"
        assert ops.ask(f"flush {qname}") == b"+0"
        assert ops.ask(f"get {qname}") == b"-Permission denied."
        assert reader.ask(f"peek {qname}") == b"*"
    finally:
        for c in (reader, writer, ops):
            c.close()


def test_text_queue_patterns_limit_a_user_to_its_queues(secured, qname):
    c = text_login(secured, "orders", "o")
    try:
        assert c.put(f"orders_{qname}", "a") == b"+1"
        assert c.ask(f"get orders_{qname}") == b":a"
        assert c.put(qname, "b") == b"-Permission denied."
        assert c.ask(f"get {qname}") == b"-Permission denied."
        assert c.ask("status up") == b"-Permission denied."  # server-wide: no pattern limit
    finally:
        c.close()


def test_text_without_auth_file_auth_is_a_no_op(tmp_path, qname):
    proc = start_fronts(tmp_path / "queues")
    try:
        c = TextConn(proc.text_port)
        assert c.ask(f"peek {qname}") == b"*"
        assert c.ask("auth anyone anything") == b"+0"
        c.close()
    finally:
        proc.stop()


LIMITS = """
max_queues = 3

[aliases.fan]
destination_queues = ["a", "b"]

[aliases.to_full]
destination_queues = ["a", "full"]

[queues.full]
max_items = 1
"""


@pytest.fixture
def limited(tmp_path):
    proc = start_fronts(tmp_path / "queues", LIMITS)
    yield proc
    proc.stop()


def test_text_max_queues_and_aliases(limited):
    c = TextConn(limited.text_port)
    try:
        assert c.put("fan", "x") == b"+1"  # a, b: two queues
        assert c.ask("get a") == b":x"
        assert c.ask("get b") == b":x"
        assert c.ask("monitor fan 5000") == b"*"  # an alias holds nothing: at once
        assert c.put("to_full", "1") == b"+1"  # a, full: three queues
        assert c.put("to_full", "2") == b"+0"  # full is full: not every destination stored
        too_many = b"-Too many queues (max_queues = 3); %s not created."
        assert c.put("fourth", "y") == too_many % b"fourth"
        assert c.ask("get fifth") == too_many % b"fifth"
        assert c.ask("monitor sixth 10") == too_many % b"sixth"
        assert c.put("b", "still") == b"+1"  # existing queues keep working
    finally:
        c.close()


# --- thrift -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    require_openssl()
    authority = CertificateAuthority(tmp_path_factory.mktemp("pki"), "ca")
    authority.issue("server")
    authority.issue("alice", "alice", client=True)
    authority.issue("reader", "reader", client=True)
    authority.issue("mallory", "mallory", client=True)
    return authority


def thrift(port: int, context=None, host: str = "127.0.0.1"):
    return make_client(
        idl.Kestrel,
        host,
        port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=20000,
        ssl_context=context,
    )


def refusal(call) -> str:
    with pytest.raises(TApplicationException) as e:
        call()
    return e.value.message


def test_thrift_without_client_certificates_refuses_every_call(secured, qname):
    client = thrift(secured.thrift_port)
    try:
        for call in (
            lambda: client.get_version(),
            lambda: client.put(qname, [b"x"], 0),
            lambda: client.get(qname, 1, 0, 0),
            lambda: client.current_status(),
        ):
            assert "tls_verify_client" in refusal(call)
        assert "tls_verify_client" in refusal(lambda: client.get_version())  # still open
    finally:
        client.close()
    c = text_login(secured, "alice", "secret")
    assert c.ask(f"peek {qname}") == b"*"  # the refused put stored nothing
    c.close()


@pytest.fixture(scope="module")
def mutual(tmp_path_factory, ca):
    folder = tmp_path_factory.mktemp("mutual")
    tls = (
        f'tls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'tls_key_file = "{ca.folder / "server.key"}"\n'
        f'tls_ca_file = "{ca.cert}"\n'
        "tls_verify_client = true\n"
    )
    proc = start_fronts(folder / "queues", auth_config(folder, tls))
    yield proc
    proc.stop()


def cert_client(proc, ca, name: str):
    context = ca.client_context(ca.folder / f"{name}.crt")
    return thrift(proc.thrift_port, context, host="localhost")


def test_thrift_authenticates_by_the_client_certificates_name(mutual, ca, qname):
    alice = cert_client(mutual, ca, "alice")
    try:
        assert alice.put(qname, [b"one", b"two"], 0) == 2
        assert [i.data for i in alice.get(qname, 5, 0, 0)] == [b"one", b"two"]
        alice.set_status(idl.Status.UP)
        alice.flush_queue(qname)
    finally:
        alice.close()


def test_thrift_roles_decide_each_method(mutual, ca, qname):
    alice = cert_client(mutual, ca, "alice")
    reader = cert_client(mutual, ca, "reader")
    try:
        assert "write" in refusal(lambda: reader.put(qname, [b"x"], 0))
        assert alice.put(qname, [b"x"], 0) == 1
        assert [i.data for i in reader.get(qname, 1, 0, 0)] == [b"x"]
        assert reader.peek(qname).items == 0
        assert "admin" in refusal(lambda: reader.flush_queue(qname))
        assert "admin" in refusal(lambda: reader.delete_queue(qname))
        assert "admin" in refusal(lambda: reader.flush_all_queues())
        assert "admin" in refusal(lambda: reader.set_status(idl.Status.READ_ONLY))
        assert reader.current_status() == idl.Status.UP
        assert reader.get_version()
    finally:
        alice.close()
        reader.close()


def test_thrift_refuses_a_certificate_naming_no_user(mutual, ca, qname):
    mallory = cert_client(mutual, ca, "mallory")
    try:
        message = refusal(lambda: mallory.put(qname, [b"x"], 0))
        assert "no user of the auth file named 'mallory'" in message
        assert "mallory" in refusal(lambda: mallory.get_version())
    finally:
        mallory.close()


def test_thrift_max_queues_and_aliases(limited):
    client = thrift(limited.thrift_port)
    try:
        assert client.put("fan", [b"t1", b"t2"], 0) == 2
        assert [i.data for i in client.get("a", 5, 0, 0)] == [b"t1", b"t2"]
        assert [i.data for i in client.get("b", 5, 0, 0)] == [b"t1", b"t2"]
        assert client.put("to_full", [b"f1", b"f2"], 0) == 1  # full holds one: stops there
        message = refusal(lambda: client.put("another", [b"y"], 0))
        assert "too many queues (max_queues = 3); another not created" in message
        assert "max_queues" in refusal(lambda: client.get("yet_another", 1, 0, 0))
        assert "max_queues" in refusal(lambda: client.peek("and_another"))
        assert client.put("b", [b"still"], 0) == 1
    finally:
        client.close()
