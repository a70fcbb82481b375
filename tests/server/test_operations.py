"""Running kestreld in production: server status, connection limits, ``kestreld ping``, SIGTERM.

Status and limits are server-wide, so every test here gets its own server.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kestreld_process import Conn, KestreldProcess
from waiting import wait_until


def status(c: Conn) -> bytes:
    c.send("status\r\n")
    return c.line()


def set_status(c: Conn, word: str) -> None:
    c.send(f"status {word}\r\n")
    assert c.line() == b"END"


def ping(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "ping", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- server status ------------------------------------------------------------------------


def test_a_new_server_is_up(make_server):
    c = Conn(make_server().connect())
    assert status(c) == b"UP"


def test_readonly_refuses_every_write_and_keeps_the_connection(make_server):
    c = Conn(make_server().connect())
    assert c.set("jobs", "before") == b"STORED"
    set_status(c, "readonly")
    assert status(c) == b"READONLY"
    assert c.set("jobs", "refused") == b"SERVER_ERROR server is READONLY"
    for request in (
        "delete jobs",
        "flush jobs",
        "flush_all",
        "flush_expired jobs",
        "flush_all_expired",
    ):
        c.send(request + "\r\n")
        assert c.line() == b"SERVER_ERROR server is READONLY", request
    c.send("version\r\n")
    assert c.line().startswith(b"VERSION ")
    assert c.stats()["queue_jobs_items"] == "1"


def test_readonly_still_serves_reads(make_server):
    c = Conn(make_server().connect())
    for item in ("a", "b", "c", "d"):
        assert c.set("jobs", item) == b"STORED"
    set_status(c, "readonly")
    assert c.get("jobs/peek") == b"a"
    assert c.get("jobs") == b"a"
    assert c.get("jobs/open") == b"b"
    assert c.get("jobs/close/open") == b"c"
    assert c.get("jobs/close") is None
    c.send("monitor jobs 0 1\r\n")
    assert c.read_value() == b"d"
    assert c.line() == b"END"


def test_quiescent_refuses_reads_and_writes(make_server):
    c = Conn(make_server().connect())
    assert c.set("jobs", "kept") == b"STORED"
    set_status(c, "quiescent")
    assert status(c) == b"QUIESCENT"
    for request in (
        "get jobs",
        "get jobs/peek",
        "get jobs/open",
        "get jobs/t=100",
        "gets jobs",
        "monitor jobs 1",
    ):
        c.send(request + "\r\n")
        assert c.line().startswith(b"SERVER_ERROR "), request
    assert c.set("jobs", "refused").startswith(b"SERVER_ERROR ")
    c.send("flush_all\r\n")
    assert c.line().startswith(b"SERVER_ERROR ")
    set_status(c, "up")
    assert c.get("jobs") == b"kept"


def test_quiescent_refuses_without_creating_the_queue(make_server):
    c = Conn(make_server().connect())
    set_status(c, "quiescent")
    c.send("get never_created\r\n")
    assert c.line().startswith(b"SERVER_ERROR ")
    assert "queue_never_created_items" not in c.stats()


def test_close_abort_and_confirm_still_work_while_quiescent(make_server):
    c = Conn(make_server().connect())
    for item in ("a", "b", "c", "d"):
        assert c.set("jobs", item) == b"STORED"
    assert [c.get("jobs/open") for _ in range(3)] == [b"a", b"b", b"c"]
    set_status(c, "quiescent")
    assert c.get("jobs/close") is None  # confirms a
    assert c.get("jobs/abort") is None  # b back to the head
    c.send("confirm jobs 1\r\n")  # confirms c
    assert c.line() == b"END"
    set_status(c, "up")
    assert [c.get("jobs"), c.get("jobs"), c.get("jobs")] == [b"b", b"d", None]


def test_close_open_while_quiescent_confirms_the_last_item_then_refuses_the_next(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    for item in ("a", "b"):
        assert c.set("jobs", item) == b"STORED"
    assert c.get("jobs/open") == b"a"
    set_status(c, "quiescent")
    # A reliable reader's loop during a drain: its last item must not come back.
    c.send("get jobs/close/open\r\n")
    assert c.line().startswith(b"SERVER_ERROR ")
    c.close()
    c = Conn(proc.connect())
    set_status(c, "up")
    assert c.get("jobs") == b"b"
    assert c.get("jobs") is None


def test_unknown_status_is_client_error_and_changes_nothing(make_server):
    c = Conn(make_server().connect())
    c.send("status sleepy\r\n")
    assert c.line().startswith(b"CLIENT_ERROR ")
    assert status(c) == b"UP"


def test_status_words_are_case_insensitive(make_server):
    c = Conn(make_server().connect())
    set_status(c, "ReadOnly")
    assert status(c) == b"READONLY"


def test_status_survives_restart(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    set_status(c, "readonly")
    c.close()
    proc.restart()
    c = Conn(proc.connect())
    assert status(c) == b"READONLY"
    assert c.set("jobs", "x").startswith(b"SERVER_ERROR ")
    set_status(c, "quiescent")
    c.close()
    proc.restart(crash=True)  # a status change is on disk at once, not at shutdown
    c = Conn(proc.connect())
    assert status(c) == b"QUIESCENT"
    set_status(c, "up")
    c.close()
    proc.restart()
    c = Conn(proc.connect())
    assert status(c) == b"UP"
    assert proc.events("listening")[-1]["status"] == "UP"


def test_status_is_kept_in_the_queue_folder(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    set_status(c, "quiescent")
    assert (Path(proc.queue_path) / ".kestreld-status").read_text().strip() == "QUIESCENT"


def test_drain_before_maintenance(make_server):
    """readonly -> consumers empty the queues -> quiescent -> stop; back up after."""
    proc = make_server()
    producer, consumer = Conn(proc.connect()), Conn(proc.connect())
    for i in range(20):
        assert producer.set("orders", f"o{i}") == b"STORED"
    set_status(producer, "readonly")
    assert producer.set("orders", "late").startswith(b"SERVER_ERROR ")
    drained = []
    while (item := consumer.get("orders/t=100")) is not None:
        drained.append(item)
    assert drained == [f"o{i}".encode() for i in range(20)]
    assert producer.stats()["curr_items"] == "0"
    set_status(producer, "quiescent")
    producer.close()
    consumer.close()
    assert proc.stop() == 0
    proc.start()
    c = Conn(proc.connect())
    assert status(c) == b"QUIESCENT"  # maintenance done: an operator brings it back
    set_status(c, "up")
    assert c.set("orders", "again") == b"STORED"


# --- limits -------------------------------------------------------------------------------


def open_accepted(proc: KestreldProcess) -> Conn:
    c = Conn(proc.connect())
    c.send("version\r\n")
    line = c.line()
    assert line.startswith(b"VERSION "), line
    return c


def test_connections_beyond_max_connections_are_refused_and_closed(make_server):
    proc = make_server("max_connections = 3\n")
    kept = [open_accepted(proc) for _ in range(3)]
    extra = Conn(proc.connect())
    assert extra.line() == b"SERVER_ERROR too many connections"
    assert extra.closed()
    assert kept[0].stats()["curr_connections"] == "3"


def test_a_closed_connection_frees_its_slot(make_server):
    proc = make_server("max_connections = 2\n")
    first, second = open_accepted(proc), open_accepted(proc)
    first.close()
    deadline = time.monotonic() + 5
    while True:
        c = Conn(proc.connect())
        c.send("version\r\n")
        line = c.line()
        if line.startswith(b"VERSION "):
            break
        assert line == b"SERVER_ERROR too many connections"
        assert time.monotonic() < deadline, "the slot was never freed"
        time.sleep(0.05)
    assert second.stats()["curr_connections"] == "2"


def test_idle_connection_is_closed_after_client_timeout(make_server):
    proc = make_server('client_timeout = "1s"\n')
    c = open_accepted(proc)
    started = time.monotonic()
    assert c.closed(timeout=5)
    assert time.monotonic() - started >= 0.9
    wait_until(lambda: proc.events("idle_connection_closed"), "idle_connection_closed logged")


def test_a_connection_that_keeps_sending_is_not_idle(make_server):
    proc = make_server('client_timeout = "2s"\n')
    c = open_accepted(proc)
    for _ in range(6):
        time.sleep(0.5)
        c.send("version\r\n")
        assert c.line().startswith(b"VERSION ")


def test_a_blocking_get_in_progress_is_not_idle(make_server):
    proc = make_server('client_timeout = "1s"\n')
    c = open_accepted(proc)
    assert c.get("nothing/t=2500") is None
    c.send("version\r\n")
    assert c.line().startswith(b"VERSION ")


def test_idle_time_counts_from_the_end_of_a_blocking_get(make_server):
    proc = make_server('client_timeout = "3s"\n')
    c = open_accepted(proc)
    assert c.get("nothing/t=3500") is None
    time.sleep(1.5)  # idle 1.5 s < 3 s since the reply: still open
    c.send("version\r\n")
    assert c.line().startswith(b"VERSION ")


def test_client_timeout_0_never_closes_idle_connections(make_server):
    proc = make_server('client_timeout = "0s"\n')
    c = open_accepted(proc)
    assert not c.closed(timeout=1.5)


def test_max_line_length_from_the_config_is_enforced(make_server):
    proc = make_server("max_line_length = 128\n")
    c = Conn(proc.connect())
    c.send(b"get " + b"q" * 120 + b"\r\n")  # 126 bytes with its terminator: a legal queue name
    assert c.line() == b"END"
    c.send(b"get " + b"q" * 200 + b"\r\n")
    assert c.line() == b"CLIENT_ERROR line too long"
    assert c.closed()


def test_max_item_size_from_the_config_is_enforced_per_queue(make_server):
    proc = make_server('max_item_size = "1KiB"\n[queues.big]\nmax_item_size = "4KiB"\n')
    c = Conn(proc.connect())
    assert c.set("small", b"x" * 1025) == b"NOT_STORED"
    assert c.set("small", b"x" * 1024) == b"STORED"
    assert c.set("big", b"y" * 4096) == b"STORED"
    assert c.set("big", b"y" * 4097) == b"NOT_STORED"
    assert c.get("small") == b"x" * 1024
    assert c.get("big") == b"y" * 4096


# --- kestreld ping ------------------------------------------------------------------------


def test_ping_prints_the_version_and_the_status_and_exits_0(make_server):
    proc = make_server()
    result = ping("--port", str(proc.port))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [proc.events("listening")[0]["version"], "status: UP"]


def test_ping_answers_while_quiescent(make_server):
    proc = make_server()
    c = Conn(proc.connect())
    set_status(c, "quiescent")  # draining is healthy: the container must not be restarted
    assert ping("--port", str(proc.port)).returncode == 0


def test_ping_fails_when_nothing_listens():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        result = ping("--port", str(port))
    assert result.returncode == 1
    assert "cannot reach" in result.stderr


def test_ping_fails_when_the_server_does_not_answer_in_time():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()  # accepts into the backlog, never replies
        started = time.monotonic()
        result = ping("--port", str(s.getsockname()[1]), "--timeout", "0.5")
    assert result.returncode == 1
    assert "no reply" in result.stderr
    assert time.monotonic() - started < 10


def test_ping_fails_when_the_reply_is_not_a_version():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()

        def answer() -> None:
            peer, _ = s.accept()
            with peer:
                peer.recv(100)
                peer.sendall(b"ERROR\r\n")

        t = threading.Thread(target=answer)
        t.start()
        result = ping("--port", str(s.getsockname()[1]))
        t.join(10)
    assert result.returncode == 1
    assert "not a version" in result.stderr


def test_ping_takes_address_and_port_from_a_config_file(make_server, tmp_path):
    proc = make_server()
    config = tmp_path / "ping.conf"
    config.write_text(f'listen_address = "0.0.0.0"\nport = {proc.port}\n')
    result = ping("--config", str(config))
    assert result.returncode == 0, result.stderr
    config.write_text(f'listen_address = "127.0.0.1"\nport = {proc.port}\n')
    assert ping("--config", str(config), "--port", "1").returncode == 1  # --port wins


def test_ping_honours_the_servers_own_flags_given_with_its_config(make_server, tmp_path):
    # The config names a port nothing listens on; the server runs with --port over it.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        unused = s.getsockname()[1]
    proc = make_server(f'listen_address = "0.0.0.0"\nport = {unused}\n')
    config = str(proc.config_path)
    assert ping("--config", config, "--timeout", "2").returncode == 1  # the config alone
    result = ping("--config", config, "--port", str(proc.port))
    assert result.returncode == 0, result.stderr
    # the server's whole command line after "kestreld" works as ping's arguments
    server_flags = proc.command()[3:]
    assert "--queue-path" in server_flags and "--log-format" in server_flags
    server_flags[server_flags.index("--port") + 1] = str(proc.port)
    result = ping(*server_flags, "--listen", "0.0.0.0")  # a wildcard means this machine
    assert result.returncode == 0, result.stderr
    result = ping("--config", config, "--listen", "127.0.0.1", "--port", str(proc.port))
    assert result.returncode == 0, result.stderr


# --- graceful shutdown --------------------------------------------------------------------


class Producer(threading.Thread):
    """Sets items ``<id>-<n>`` one at a time until the server goes away."""

    def __init__(self, proc: KestreldProcess, number: int) -> None:
        super().__init__(daemon=True)
        self.conn = Conn(proc.connect())
        self.number = number
        self.sent: list[str] = []
        self.acked: list[str] = []

    def run(self) -> None:
        for n in range(100_000):
            item = f"p{self.number}-{n}"
            self.sent.append(item)
            try:
                if self.conn.set("load", item) != b"STORED":
                    return
            except OSError:
                return
            self.acked.append(item)


class Consumer(threading.Thread):
    """The reliable-read loop ``get load/close/open`` until the server goes away."""

    def __init__(self, proc: KestreldProcess) -> None:
        super().__init__(daemon=True)
        self.conn = Conn(proc.connect())
        self.received: list[str] = []
        self.confirmed: list[str] = []  # closed, and the close was answered
        self.error: str | None = None  # anything but the server closing the connection

    def run(self) -> None:
        open_item = None
        for _ in range(100_000):
            try:
                item = self.conn.get("load/close/open/t=50")
            except OSError:
                return  # the server went away: the end of the run
            except AssertionError as e:  # an unexpected reply is a failure, not an end
                self.error = str(e)
                return
            if open_item is not None:
                self.confirmed.append(open_item)
            open_item = item.decode() if item is not None else None
            if open_item is not None:
                self.received.append(open_item)


@pytest.mark.parametrize(
    "config", ["", "sync_journal = 0\n"], ids=["sync_never", "sync_every_write"]
)
def test_sigterm_under_load_loses_no_acknowledged_item(make_server, config):
    proc = make_server(config)
    producers = [Producer(proc, i) for i in range(3)]
    consumers = [Consumer(proc) for _ in range(2)]
    for t in producers + consumers:
        t.start()
    wait_until(
        lambda: sum(len(p.acked) for p in producers) > 200 and all(c.confirmed for c in consumers),
        "producers and consumers under way",
    )
    started = time.monotonic()
    assert proc.stop() == 0
    shutdown_seconds = time.monotonic() - started
    for t in producers + consumers:
        t.join(15)
    assert shutdown_seconds < 5, f"graceful shutdown took {shutdown_seconds:.1f}s"
    proc.start()
    c = Conn(proc.connect())
    drained = []
    for _ in range(1_000_000):
        item = c.get("load")
        if item is None:
            break
        drained.append(item.decode())
    acked = {i for p in producers for i in p.acked}
    sent = {i for p in producers for i in p.sent}
    received = {i for c in consumers for i in c.received}
    confirmed = {i for c in consumers for i in c.confirmed}
    assert len(acked) > 100, "no load"
    assert [c.error for c in consumers] == [None, None]
    assert all(c.confirmed for c in consumers), "a consumer confirmed nothing: nothing was tested"
    assert not acked - received - set(drained), "acknowledged items lost"
    assert len(drained) == len(set(drained)), "items duplicated"
    assert not confirmed & set(drained), "confirmed items came back"
    assert set(drained) <= sent
