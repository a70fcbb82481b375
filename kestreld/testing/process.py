"""A real ``kestreld`` process: started on a free loopback port, stopped after.

``KESTRELD_TEST_WORKERS=N`` in the environment starts every server with ``--workers N``
(one given ``workers=`` keeps its own), so any suite can run against a box of workers.

The benchmarks and the crash soak drive servers through it, and the tests'
fixtures use the same class; :class:`Conn` is a raw protocol connection that
reads exact replies.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path


class KestreldProcess:
    """One server process.  ``start()`` returns once it logged ``listening``."""

    def __init__(
        self,
        queue_path: str | os.PathLike,
        config: str | None = None,
        *,
        args: list[str] | None = None,
        config_path: str | os.PathLike | None = None,
        env: dict[str, str] | None = None,
        workers: int | None = None,
    ) -> None:
        self.queue_path = Path(queue_path)
        if workers is None:
            workers = int(os.environ.get("KESTRELD_TEST_WORKERS") or 1)
        #: Worker processes (``--workers``); 1: the server runs alone, as by default.
        self.workers = workers
        self.config_path = Path(config_path) if config_path else None
        if config is not None:
            if self.config_path is None:
                self.config_path = self.queue_path.parent / f"{self.queue_path.name}.conf"
            self.config_path.write_text(config)
        self.args = args or []
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.port = 0
        self.log_lines: list[str] = []
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    # --- life cycle ---------------------------------------------------------------------

    def command(self) -> list[str]:
        cmd = [
            sys.executable,
            "-m",
            "kestreld",
            "--queue-path",
            str(self.queue_path),
            "--port",
            str(self.port or 0),
        ]
        cmd += ["--log-format", "json"]
        if self.workers > 1 and "--workers" not in self.args:
            cmd += ["--workers", str(self.workers)]
        if self.config_path is not None:
            cmd += ["--config", str(self.config_path)]
        return cmd + self.args

    def start(self, timeout: float = 20.0) -> KestreldProcess:
        self._listening.clear()
        if self.proc is not None and self.proc.stderr is not None:
            self.proc.stderr.close()  # the previous run's log pipe
        env = dict(os.environ)
        env.update(self.env or {})
        self.proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
        )
        self._reader = threading.Thread(target=self._read_log, args=(self.proc,), daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(2)
                raise RuntimeError(
                    f"kestreld exited with {self.proc.returncode}:\n"
                    + "\n".join(self.log_lines[-30:])
                )
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("kestreld did not start:\n" + "\n".join(self.log_lines[-30:]))
        return self

    def _read_log(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self.log_lines.append(line)
            if '"listening"' in line:
                try:
                    event = json.loads(line)
                    self.port = int(event["address"].rsplit(":", 1)[1])
                except (ValueError, KeyError):
                    continue
                self._listening.set()

    def events(self, name: str) -> list[dict]:
        """Logged events with this name (JSON log lines)."""
        out = []
        for line in list(self.log_lines):
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == name:
                out.append(event)
        return out

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM and wait: a graceful shutdown.  Returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise
        finally:
            if self._reader is not None:
                self._reader.join(2)

    def kill(self) -> None:
        """kill -9: no chance to flush anything."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
            if self._reader is not None:
                self._reader.join(2)

    def restart(self, *, crash: bool = False) -> KestreldProcess:
        """Stop (or kill -9) and start again on the same folder and port."""
        if crash:
            self.kill()
        else:
            self.stop()
        return self.start()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def worker_pids(self) -> dict[int, int]:
        """With workers: each worker's process id now (from its latest ``worker_ready``)."""
        pids: dict[int, int] = {}
        for event in self.events("worker_ready"):
            pids[int(event["worker"])] = int(event["pid"])
        return pids

    def pids(self) -> list[int]:
        """The box's processes now: this one and, with workers, each worker (what the
        server holds, its memory or its descriptors, is the sum over them)."""
        return [self.pid, *self.worker_pids().values()]

    # --- talking to it --------------------------------------------------------------------

    def connect(self, timeout: float = 10.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def client(self, **kwargs):
        """A pymemcache client for this server."""
        from pymemcache.client.base import Client

        kwargs.setdefault("connect_timeout", 5)
        kwargs.setdefault("timeout", 10)
        return Client(("127.0.0.1", self.port), **kwargs)

    def __enter__(self) -> KestreldProcess:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class Conn:
    """A raw protocol connection: send bytes, read exact replies."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes | str) -> None:
        if isinstance(data, str):
            data = data.encode()
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, _, self.buf = self.buf.partition(b"\r\n")
        return line

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def until_end(self) -> list[bytes]:
        """Lines up to and including END (a 6 MB ``stats`` reply is scanned once, not per line)."""
        data = bytearray(self.buf)
        scanned = 0
        while True:
            if data.startswith(b"END\r\n"):
                at = 0
            else:
                found = data.find(b"\r\nEND\r\n", scanned)
                at = found + 2 if found >= 0 else -1
            if at >= 0:
                self.buf = bytes(data[at + 5 :])
                return bytes(data[: at + 3]).split(b"\r\n")
            scanned = max(len(data) - 6, 0)
            chunk = self.sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("server closed the connection")
            data += chunk

    def get(self, key: str) -> bytes | None:
        """Send a get and read a single-item reply; None for END."""
        self.send(f"get {key}\r\n")
        return self.read_value()

    def read_value(self) -> bytes | None:
        line = self.line()
        if line == b"END":
            return None
        if not line.startswith(b"VALUE "):
            raise AssertionError(f"unexpected reply {line!r}")
        size = int(line.split()[3])
        data = self.exact(size + 2)[:-2]
        assert self.line() == b"END"
        return data

    def set(self, queue: str, data: bytes | str, exptime: int = 0) -> bytes:
        if isinstance(data, str):
            data = data.encode()
        self.send(f"set {queue} 0 {exptime} {len(data)}\r\n".encode() + data + b"\r\n")
        return self.line()

    def stats(self) -> dict[str, str]:
        self.send("stats\r\n")
        out = {}
        for line in self.until_end()[:-1]:
            _, key, value = line.decode().split(" ", 2)
            out[key] = value
        return out

    def closed(self, timeout: float = 2.0) -> bool:
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
