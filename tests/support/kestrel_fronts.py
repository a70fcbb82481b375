"""Clients of Kestrel's text and thrift front ends, and a server with both on.

The thrift client is thriftpy2's, generated from the project's own IDL
(framed transport, binary protocol): what a Kestrel thrift client sends.
"""

from __future__ import annotations

import socket
from pathlib import Path

import thriftpy2
from kestreld_process import KestreldProcess
from ports import free_port
from thriftpy2.protocol import TBinaryProtocolFactory
from thriftpy2.rpc import make_client
from thriftpy2.transport import TFramedTransportFactory

IDL = Path(__file__).resolve().parents[2] / "kestreld" / "frontends" / "thrift" / "kestrel.thrift"
#: The IDL as a client sees it (a module of its own, not the server's).
kestrel = thriftpy2.load(str(IDL), module_name="kestrel_client_thrift")


def start_fronts(queue_path, config: str | None = None, **kwargs) -> KestreldProcess:
    """A kestreld with memcache, text and thrift on free loopback ports
    (``proc.text_port``, ``proc.thrift_port``; restarts keep them)."""
    port, text_port, thrift_port = free_port(), free_port(), free_port()
    proc = KestreldProcess(
        queue_path,
        config,
        # After the harness's own "--port 0", which with another front end on means off.
        args=[
            "--port",
            str(port),
            "--text-port",
            str(text_port),
            "--thrift-port",
            str(thrift_port),
        ],
        **kwargs,
    )
    proc.text_port = text_port  # type: ignore[attr-defined]
    proc.thrift_port = thrift_port  # type: ignore[attr-defined]
    return proc.start()


def thrift_client(port: int, timeout: float = 20.0):
    """A thriftpy2 client of the Kestrel service (framed, binary); ``.close()`` it."""
    return make_client(
        kestrel.Kestrel,
        "127.0.0.1",
        port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=int(timeout * 1000),
    )


class TextConn:
    """A raw text-protocol connection: send lines, read ``\\n``-ended replies."""

    def __init__(self, port: int, timeout: float = 20.0) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buf = b""

    def send(self, data: bytes | str) -> None:
        self.sock.sendall(data.encode() if isinstance(data, str) else data)

    def line(self) -> bytes:
        while b"\n" not in self.buf:
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line

    def ask(self, request: bytes | str) -> bytes:
        """Send one request line (``\\n`` added) and read its one-line reply."""
        self.send((request.encode() if isinstance(request, str) else request) + b"\n")
        return self.line()

    def put(self, queue: str, *items: bytes | str) -> bytes:
        body = b"".join((i.encode() if isinstance(i, str) else i) + b"\n" for i in items)
        self.send(f"put {queue}:\n".encode() + body + b"\n")
        return self.line()

    def closed(self, timeout: float = 5.0) -> bool:
        """True when the server closes the connection within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    return True
                self.buf += chunk
        except (TimeoutError, OSError):
            return False

    def close(self) -> None:
        self.sock.close()
