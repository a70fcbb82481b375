"""The connection core's promises, kept alike by the memcache, text and thrift ports.

Every case runs against the three front ends of one real kestreld, with raw
sockets speaking each wire format (thrift frames are encoded by thriftpy2
from the project's IDL): input buffered is bounded to about one request
beyond the one being answered (a client that pipelines more is paused, not
disconnected, and served in order afterwards), a client that never reads
cannot grow the server's memory, every close the server initiates sends the
replies owed first and gives held items back, a client that leaves during a
wait gets nothing taken for it (the item is back at once), and the idle
timeout closes a quiet connection.  Server memory is read from ``/proc``.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import struct
import threading
import time
from collections.abc import Callable

import pytest
from certs import CertificateAuthority, require_openssl
from kestrel_fronts import kestrel as idl
from kestrel_fronts import start_fronts
from thriftpy2.protocol.binary import TBinaryProtocol
from thriftpy2.thrift import TApplicationException, TMessageType
from thriftpy2.transport import TMemoryBuffer

from kestreld.security import hash_password

MiB = 1024 * 1024
BIG = 4 * MiB
FRONT_ENDS = ["memcache", "text", "thrift"]


# --- the three wire formats, as a client writes and reads them ---------------------------------


def _thrift_call(method: str, seqid: int = 1, **args) -> bytes:
    buf = TMemoryBuffer()
    proto = TBinaryProtocol(buf)
    proto.write_message_begin(method, TMessageType.CALL, seqid)
    proto.write_struct(getattr(idl.Kestrel, f"{method}_args")(**args))
    proto.write_message_end()
    body = buf.getvalue()
    return struct.pack(">i", len(body)) + body


class Client:
    """One raw connection to one front end: requests as bytes, replies as values."""

    def __init__(self, kind: str, port: int, timeout: float = 20.0) -> None:
        self.kind = kind
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""
        self.seqid = 0

    # requests ---------------------------------------------------------------------------

    def put_request(self, queue: str, data: bytes) -> bytes:
        if self.kind == "memcache":
            return b"set %s 0 0 %d\r\n%s\r\n" % (queue.encode(), len(data), data)
        if self.kind == "text":
            return b"put %s:\n%s\n\n" % (queue.encode(), data)
        return self._call("put", queue_name=queue, items=[data], expiration_msec=0)

    def wait_request(self, queue: str, ms: int, *, opening: bool = False) -> bytes:
        """A get that waits up to ``ms`` for one item (``opening``: held until confirmed)."""
        if self.kind == "memcache":
            return b"get %s%s/t=%d\r\n" % (queue.encode(), b"/open" if opening else b"", ms)
        if self.kind == "text":
            return b"get %s %d\n" % (queue.encode(), ms)  # text gets always open
        return self._call(
            "get", queue_name=queue, max_items=1, timeout_msec=ms,
            auto_abort_msec=30_000 if opening else 0,
        )  # fmt: skip

    def peek_request(self, queue: str) -> bytes:
        if self.kind == "memcache":
            return b"get %s/peek\r\n" % queue.encode()
        if self.kind == "text":
            return b"peek %s\n" % queue.encode()
        return self._call("peek", queue_name=queue)

    def version_request(self) -> bytes:
        if self.kind == "memcache":
            return b"version\r\n"
        if self.kind == "text":
            return b"version\n"
        return self._call("get_version")

    def _call(self, method: str, **args) -> bytes:
        self.seqid += 1
        return _thrift_call(method, self.seqid, **args)

    # replies ----------------------------------------------------------------------------

    def _fill(self, n: int) -> None:
        while len(self.buf) < n:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk

    def _line(self, end: bytes) -> bytes:
        while end not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(end)
        return line

    def reply(self) -> object:
        """The next reply: an item (bytes), None (no item), "ok" (stored / a version),
        or the error text."""
        if self.kind == "memcache":
            line = self._line(b"\r\n")
            if line.startswith(b"VALUE "):
                size = int(line.split()[3])
                self._fill(size + 2)
                data, self.buf = self.buf[:size], self.buf[size + 2 :]
                assert self._line(b"\r\n") == b"END"
                return data
            if line == b"END":
                return None
            if line == b"STORED" or line.startswith(b"VERSION "):
                return "ok"
            return line.decode()
        if self.kind == "text":
            line = self._line(b"\n")
            if line.startswith(b":"):
                data = line[1:]
                return "ok" if data[:1].isdigit() and b"." in data else data
            if line == b"*":
                return None
            if line == b"+1":
                return "ok"
            return line.decode()
        self._fill(4)
        (size,) = struct.unpack(">i", self.buf[:4])
        self._fill(4 + size)
        frame, self.buf = self.buf[4 : 4 + size], self.buf[4 + size :]
        proto = TBinaryProtocol(TMemoryBuffer(frame))
        method, mtype, _ = proto.read_message_begin()
        if mtype == TMessageType.EXCEPTION:
            exc = TApplicationException()
            proto.read_struct(exc)
            return exc.message
        result = getattr(idl.Kestrel, f"{method}_result")()
        proto.read_struct(result)
        value = result.success
        if method == "get":
            self.items = [i.data for i in value]  # every item of the last get
            return value[0].data if value else None
        if method == "peek":
            return value.head_item
        if method == "get_version" or (method == "put" and value == 1):
            return "ok"
        return value

    def closed_by_server(self, timeout: float = 5.0) -> bool:
        """True when the server closes within ``timeout`` (replies left unread are kept)."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(1 << 20)
                if not chunk:
                    return True
                self.buf += chunk
        except (TimeoutError, OSError):
            return False

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def _growth_mib(pid: int, before: float, seconds: float = 2.0) -> float:
    """The most the server's resident memory grew over ``before`` during ``seconds``
    (sampled: a buffer freed again still shows)."""
    peak = before
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        peak = max(peak, _rss_mib(pid))
        time.sleep(0.02)
    return peak - before


def _send_in_background(client: Client, payload: Callable[[], bytes], count: int):
    """Send ``count`` requests from a thread (the server may pause reading them)."""
    done = threading.Event()

    def run() -> None:
        try:
            for _ in range(count):
                client.send(payload())
        except OSError:
            pass
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done


@pytest.fixture(scope="module")
def fronts(tmp_path_factory):
    proc = start_fronts(tmp_path_factory.mktemp("core") / "queues", "max_line_length = 1024\n")
    yield proc
    proc.stop()


def _port(proc, kind: str) -> int:
    return {"memcache": proc.port, "text": proc.text_port, "thrift": proc.thrift_port}[kind]


@pytest.fixture(params=FRONT_ENDS)
def kind(request) -> str:
    return request.param


def _client(proc, kind: str) -> Client:
    return Client(kind, _port(proc, kind))


def _store(proc, queue: str, data: bytes) -> None:
    c = _client(proc, "memcache")
    c.send(c.put_request(queue, data))
    assert c.reply() == "ok"
    c.close()


def _take(proc, queue: str) -> object:
    """The queue's head, taken at once (no wait), through memcache."""
    c = _client(proc, "memcache")
    c.send(b"get %s\r\n" % queue.encode())
    got = c.reply()
    c.close()
    return got


def _eventually_take(proc, queue: str, within: float = 2.0) -> object:
    deadline = time.monotonic() + within
    while True:
        got = _take(proc, queue)
        if got is not None or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


# --- input bound: a pipelining client is paused, then served in order ---------------------------


def test_pipelined_puts_behind_a_waiting_get_are_paused_not_buffered(fronts, kind, qname):
    warm = _client(fronts, kind)  # the allocator has seen a big request once
    warm.send(warm.put_request(qname + "_warm", b"w" * BIG))
    assert warm.reply() == "ok"
    warm.close()
    before = _rss_mib(fronts.pid)
    c = _client(fronts, kind)
    c.send(c.wait_request(qname + "_w", 20_000))
    big = b"p" * BIG
    sent = _send_in_background(c, lambda: c.put_request(qname, big), 40)
    grown = _growth_mib(fronts.pid, before)
    assert grown < 48, f"server memory grew {grown:.0f} MiB behind one waiting request"
    assert not sent.is_set(), "40 puts of 4 MiB were all read behind a waiting get"
    _store(fronts, qname + "_w", b"wake")
    assert c.reply() == b"wake"  # the wait is answered first, then every put, in order
    assert [c.reply() for _ in range(40)] == ["ok"] * 40
    assert sent.wait(20)
    c.close()


def test_a_client_that_never_reads_does_not_grow_the_server(fronts, kind, qname):
    _store(fronts, qname, b"h" * MiB)
    before = _rss_mib(fronts.pid)
    c = _client(fronts, kind)
    request = c.peek_request(qname)
    sent = _send_in_background(c, lambda: request, 400)  # 400 MiB of replies, never read
    grown = _growth_mib(fronts.pid, before)
    assert grown < 48, f"server memory grew {grown:.0f} MiB for a client that never reads"
    c.close()
    sent.wait(5)
    other = _client(fronts, kind)
    other.send(other.version_request())
    assert other.reply() == "ok"
    other.close()


def _failed_auth(kind: str) -> bytes:
    if kind == "memcache":
        return b"set auth 0 0 12\r\nalice wrong!\r\n"
    return b"auth alice wrong!\n"


def test_input_before_authentication_is_bounded_to_one_request(tmp_path, kind, qname):
    proc = start_fronts(tmp_path / "queues", f'auth_file = "{tmp_path / "users"}"\n')
    try:
        c = _client(proc, kind)
        if kind != "thrift":  # thrift authenticates by certificate: every call refused at once
            for _ in range(3):  # from the fourth failure on, refusals are delayed
                c.send(_failed_auth(kind))
                assert "fail" in str(c.reply())
            c.send(_failed_auth(kind) * 4)  # delayed 0.25 s, 0.5 s, 1 s, 2 s
        before = _rss_mib(proc.pid)
        big = b"p" * BIG
        sent = _send_in_background(c, lambda: c.put_request(qname, big), 40)
        grown = _growth_mib(proc.pid, before)
        assert grown < 48, f"server memory grew {grown:.0f} MiB before authentication"
        c.close()
        sent.wait(5)
    finally:
        proc.stop()


@pytest.fixture(autouse=True)
def _users(tmp_path):
    (tmp_path / "users").write_text(f"alice:{hash_password('secret', log2_n=4)}\n")


# --- server-initiated closes: owed replies first, held items back -------------------------------


def _too_long(kind: str) -> bytes:
    if kind == "memcache":
        return b"get " + b"x" * 4096 + b"\r\n"
    if kind == "text":
        return b"get " + b"x" * 4096 + b"\n"
    return struct.pack(">i", 1 << 30)  # a frame header announcing 1 GiB, no body follows


def test_an_over_limit_request_is_refused_after_the_replies_owed(fronts, kind):
    c = _client(fronts, kind)
    c.send(c.version_request() + _too_long(kind))
    assert c.reply() == "ok"
    if kind != "thrift":  # thrift has no call to answer: the frame is refused unread
        assert "too long" in str(c.reply())
    assert c.closed_by_server()


def test_an_over_limit_request_gives_back_the_items_held(fronts, kind, qname):
    _store(fronts, qname, b"held")
    c = _client(fronts, kind)
    c.send(c.wait_request(qname, 0, opening=True))
    assert c.reply() == b"held"
    c.send(_too_long(kind) if kind != "thrift" else struct.pack(">i", -5))
    assert c.closed_by_server()
    if kind == "thrift":  # ids handed out survive their client (auto_abort_msec)
        assert _take(fronts, qname) is None
    else:
        assert _eventually_take(fronts, qname) == b"held"


@pytest.mark.parametrize("kind", ["memcache", "text"])  # Kestrel's thrift interface has no quit
def test_quit_sends_the_replies_owed_then_closes(fronts, kind, qname):
    _store(fronts, qname, b"owed")
    c = _client(fronts, kind)
    quit_line = b"quit\r\n" if kind == "memcache" else b"quit\n"
    c.send(c.wait_request(qname, 0) + c.version_request() + quit_line + c.version_request())
    assert c.reply() == b"owed"
    assert c.reply() == "ok"
    assert c.closed_by_server()
    assert c.buf == b"", "a request after quit was answered"


def test_a_graceful_stop_answers_a_wait_before_closing(tmp_path, kind, qname):
    proc = start_fronts(tmp_path / "queues")
    c = _client(proc, kind)
    c.send(c.wait_request(qname, 20_000))
    time.sleep(0.3)
    stopper = threading.Thread(target=proc.stop)
    stopper.start()
    try:
        assert c.reply() is None  # the wait's answer (no item), then the close
        assert c.closed_by_server()
    finally:
        stopper.join(20)
        c.close()


# --- a client that leaves during a wait ----------------------------------------------------------


def test_a_client_leaving_a_wait_takes_nothing(fronts, kind, qname):
    c = _client(fronts, kind)
    c.send(c.wait_request(qname, 20_000, opening=True))
    time.sleep(0.3)
    c.close()
    time.sleep(0.3)
    _store(fronts, qname, b"after")
    assert _take(fronts, qname) == b"after"  # at once: nobody is waiting for it


@pytest.mark.parametrize("leave", ["close", "reset"])
def test_a_client_leaving_a_wait_gives_back_what_it_took(fronts, kind, qname, leave):
    _store(fronts, qname, b"first")
    c = _client(fronts, kind)
    if kind == "thrift":
        # Up to three items: the first is taken, the call waits for more.
        c.send(
            c._call(
                "get", queue_name=qname, max_items=3, timeout_msec=20_000,
                auto_abort_msec=60_000,
            )
        )  # fmt: skip
    else:
        c.send(c.wait_request(qname, 0, opening=True))
        assert c.reply() == b"first"
        c.send(c.wait_request(qname + "_empty", 20_000))
    time.sleep(0.3)
    if leave == "reset":  # RST instead of FIN
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    assert _eventually_take(fronts, qname, within=1.0) == b"first"


# --- the idle timeout ------------------------------------------------------------------------------


def test_the_idle_timeout_closes_a_quiet_client_and_gives_back_its_items(tmp_path, kind, qname):
    proc = start_fronts(tmp_path / "queues", 'client_timeout = "500ms"\n')
    try:
        _store(proc, qname, b"idle")
        c = _client(proc, kind)
        c.send(c.wait_request(qname, 0, opening=kind != "thrift"))
        assert c.reply() == b"idle"
        assert c.closed_by_server(timeout=5.0)
        if kind != "thrift":
            assert _eventually_take(proc, qname) == b"idle"
    finally:
        proc.stop()


# --- TLS underneath: the client's close_notify during a reply -----------------------------------


@pytest.fixture(scope="module")
def tls_fronts(tmp_path_factory):
    require_openssl()
    ca = CertificateAuthority(tmp_path_factory.mktemp("pki"), "ca")
    ca.issue("server")
    config = (
        f'tls_cert_file = "{ca.folder / "server.crt"}"\n'
        f'tls_key_file = "{ca.folder / "server.key"}"\n'
    )
    proc = start_fronts(tmp_path_factory.mktemp("tls") / "queues", config)
    proc.ca = ca  # type: ignore[attr-defined]
    yield proc
    proc.stop()


def _tls_exchange(proc, kind: str, request: Callable[[Client], bytes]) -> Client:
    """Send one request and close_notify at once over TLS; what came back, read to the end."""
    sock = socket.create_connection(("127.0.0.1", _port(proc, kind)), timeout=20)
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = proc.ca.client_context().wrap_bio(incoming, outgoing, server_hostname="localhost")

    def pump() -> None:
        data = outgoing.read()
        if data:
            sock.sendall(data)

    while True:
        try:
            tls.do_handshake()
            break
        except ssl.SSLWantReadError:
            pump()
            incoming.write(sock.recv(65536))
    pump()
    reader = Client.__new__(Client)
    reader.kind, reader.buf, reader.seqid = kind, b"", 0
    tls.write(request(reader))
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.unwrap()  # close_notify: the client has nothing more to say
    pump()
    received = b""
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        incoming.write(data)
        try:
            while True:
                received += tls.read(1 << 20)
        except (ssl.SSLWantReadError, ssl.SSLZeroReturnError):
            pass
    sock.close()
    reader.sock = _Drained()
    reader.buf = received
    return reader


class _Drained:
    """A socket whose every byte was read already."""

    def recv(self, n: int) -> bytes:
        return b""


def test_a_reply_owed_is_sent_whole_after_the_clients_close_notify(tls_fronts, kind, qname):
    item = b"t" * MiB
    c = Client(kind, _port(tls_fronts, kind))
    c.sock = tls_fronts.ca.client_context().wrap_socket(c.sock, server_hostname="localhost")
    c.send(c.put_request(qname, item))
    assert c.reply() == "ok"
    c.close()
    reader = _tls_exchange(tls_fronts, kind, lambda r: r.peek_request(qname))
    assert reader.reply() == item


@pytest.mark.parametrize("auto_abort", [0, 60_000])
def test_a_thrift_get_for_several_items_whose_client_leaves_hands_out_nothing(
    fronts, qname, auto_abort
):
    _store(fronts, qname, b"first")
    c = _client(fronts, "thrift")
    c.send(
        c._call(
            "get", queue_name=qname, max_items=3, timeout_msec=20_000,
            auto_abort_msec=auto_abort,
        )
    )  # fmt: skip
    time.sleep(0.3)
    c.sock.shutdown(socket.SHUT_WR)  # a half-close: the wait ends, no id is handed out
    assert c.reply() is None
    c.close()
    assert _eventually_take(fronts, qname, within=1.0) == b"first"


@pytest.mark.parametrize("auto_abort", [0, 60_000])
def test_a_thrift_get_hands_out_each_item_once_when_its_open_timeout_gives_one_back(
    tmp_path, qname, auto_abort
):
    # The item taken first goes back when its open read times out (300 ms), and the
    # same waiting get may take it again: it is handed out once, or left in the queue.
    proc = start_fronts(tmp_path / "queues", 'open_transaction_timeout = "300ms"\n')
    try:
        _store(proc, qname, b"first")
        c = _client(proc, "thrift")
        c.send(
            c._call(
                "get", queue_name=qname, max_items=3, timeout_msec=2500,
                auto_abort_msec=auto_abort,
            )
        )  # fmt: skip
        c.reply()
        left = _take(proc, qname)
        assert sorted(c.items + ([left] if left is not None else [])) == [b"first"]
        c.close()
    finally:
        proc.stop()
