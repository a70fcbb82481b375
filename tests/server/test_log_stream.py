"""The server outlives its log's reader: a closed log pipe drops events, never the server.

Under a supervisor whose log collector died (a closed pipe on stderr), every log write fails
with EPIPE.  The server must still serve, and a SIGTERM must still stop it gracefully: the
``shutdown_requested`` event it logs first is dropped, not raised.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _talk(port: int, request: bytes, until: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while not data.endswith(until):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        return data


def test_a_server_whose_log_pipe_closed_serves_and_stops_on_sigterm(tmp_path):
    port = _free_port()
    read_end, write_end = os.pipe()
    argv = [sys.executable, "-m", "kestreld", "--queue-path", str(tmp_path / "queues")]
    proc = subprocess.Popen(
        [*argv, "--port", str(port), "--log-format", "json"],
        stdout=subprocess.DEVNULL,
        stderr=write_end,
    )
    os.close(write_end)
    try:
        with os.fdopen(read_end, "rb") as log:
            for line in log:  # read until it listens, then the reader goes away
                if b'"listening"' in line:
                    break
        assert _talk(port, b"set q 0 0 2\r\nhi\r\n", b"\r\n") == b"STORED\r\n"
        assert _talk(port, b"get q\r\n", b"END\r\n") == b"VALUE q 0 2\r\nhi\r\nEND\r\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
