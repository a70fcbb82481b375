"""``kestreld move SRC DST``: each item exactly once, against real servers, killed mid-move too."""

from __future__ import annotations

import collections
import os
import pty
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from kestreld_process import Conn, KestreldProcess

pytestmark = pytest.mark.timeout(180)


def move(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kestreld", "move", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def start_move(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "kestreld", "move", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def fill(proc: KestreldProcess, queue: str, items: list[str]) -> None:
    """Pipelined sets: one write per thousand items."""
    c = Conn(proc.connect())
    for start in range(0, len(items), 1000):
        batch = items[start : start + 1000]
        c.send(b"".join(f"set {queue} 0 0 {len(i)}\r\n{i}\r\n".encode() for i in batch))
        for _ in batch:
            assert c.line() == b"STORED"
    c.close()


def drain(proc: KestreldProcess, queue: str) -> list[str]:
    c = Conn(proc.connect())
    out = []
    while (data := c.get(queue)) is not None:
        out.append(data.decode())
    c.close()
    return out


def figure(proc: KestreldProcess, queue: str, key: str) -> int:
    c = Conn(proc.connect())
    try:
        return int(c.stats().get(f"queue_{queue}_{key}", 0))
    finally:
        c.close()


def wait_until(condition, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_every_item_is_moved_once_in_order_and_nothing_stays_open(make_server):
    proc = make_server()
    items = [f"dead{i}" for i in range(300)]
    fill(proc, "dead_letters", items)
    result = move("dead_letters", "jobs", "--port", str(proc.port))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"moved 300 items from 127.0.0.1:{proc.port}/dead_letters")
    assert result.stderr == ""  # no progress line when stderr is not a terminal
    assert drain(proc, "jobs") == items
    assert figure(proc, "dead_letters", "items") == 0
    assert figure(proc, "dead_letters", "open_transactions") == 0


def test_limit_moves_only_that_many_and_the_rest_stays(make_server):
    proc = make_server()
    fill(proc, "src", [f"i{i}" for i in range(10)])
    result = move("src", "dst", "--port", str(proc.port), "--limit", "4")
    assert result.returncode == 0, result.stderr
    assert "moved 4 items" in result.stdout
    assert drain(proc, "dst") == ["i0", "i1", "i2", "i3"]
    assert drain(proc, "src") == [f"i{i}" for i in range(4, 10)]


def test_between_servers_and_from_a_fanout_reader(make_server):
    old, new = make_server(), make_server()
    c = Conn(old.connect())
    assert c.get("events+archive") is None
    c.close()
    fill(old, "events", [f"e{i}" for i in range(50)])
    result = move(f"127.0.0.1:{old.port}/events+archive", f"127.0.0.1:{new.port}/events")
    assert result.returncode == 0, result.stderr
    assert drain(new, "events") == [f"e{i}" for i in range(50)]
    assert figure(old, "events+archive", "items") == 0
    assert figure(old, "events", "items") == 50  # the queue's own reader is untouched


def test_a_move_killed_again_and_again_loses_nothing_and_duplicates_at_most_the_item_in_flight(
    make_server,
):
    src_server, dst_server = make_server(), make_server()
    items = [f"m{i:05d}" for i in range(20_000)]
    fill(src_server, "backlog", items)
    src = f"127.0.0.1:{src_server.port}/backlog"
    dst = f"127.0.0.1:{dst_server.port}/backlog"
    kills = 0
    for round_ in range(3):
        runner = start_move(src, dst)
        target = figure(dst_server, "backlog", "items") + 500
        wait_until(
            lambda t=target, r=runner: (
                figure(dst_server, "backlog", "items") >= t or r.poll() is not None
            )
        )
        if runner.poll() is None:
            runner.kill()  # SIGKILL: no chance to close anything
            kills += 1
        runner.wait(30)
        # the source server takes the open item back when the connection drops
        wait_until(lambda: figure(src_server, "backlog", "open_transactions") == 0)
        moved = figure(dst_server, "backlog", "items")
        left = figure(src_server, "backlog", "items")
        assert len(items) <= moved + left <= len(items) + kills, round_
    assert kills >= 1, "the move finished before it could be killed"
    result = move(src, dst)  # finish the job
    assert result.returncode == 0, result.stderr
    moved_items = drain(dst_server, "backlog")
    counts = collections.Counter(moved_items)
    assert set(counts) == set(items)  # nothing lost
    duplicated = [item for item, n in counts.items() if n > 1]
    assert len(duplicated) <= kills and all(counts[i] == 2 for i in duplicated)
    assert figure(src_server, "backlog", "items") == 0


def test_sigterm_stops_after_the_item_in_flight_without_a_duplicate(make_server):
    proc = make_server()
    items = [f"t{i:05d}" for i in range(20_000)]
    fill(proc, "src", items)
    runner = start_move("src", "dst", "--port", str(proc.port))
    wait_until(lambda: figure(proc, "dst", "items") >= 300 or runner.poll() is not None)
    runner.send_signal(signal.SIGTERM)
    out, err = runner.communicate(timeout=30)
    assert runner.returncode == 0, err
    assert "stopped by signal" in out or "moved 20000 items" in out
    moved = drain(proc, "dst")
    assert moved + drain(proc, "src") == items  # in order, each exactly once


def test_a_destination_that_refuses_stops_the_move_and_the_item_goes_back(make_server):
    proc = make_server("[queues.small]\nmax_items = 3\n")
    fill(proc, "src", [f"s{i}" for i in range(5)])
    result = move("src", "small", "--port", str(proc.port))
    assert result.returncode == 1
    assert "refused" in result.stderr
    assert drain(proc, "small") == ["s0", "s1", "s2"]
    wait_until(lambda: figure(proc, "src", "open_transactions") == 0)
    assert drain(proc, "src") == ["s3", "s4"]  # the refused item is back at the head


def test_an_unreachable_source_exits_1_and_bad_arguments_2(make_server):
    proc = make_server()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
        result = move(f"127.0.0.1:{dead}/q", "q", "--port", str(proc.port), "--timeout", "2")
    assert result.returncode == 1 and f"127.0.0.1:{dead}" in result.stderr
    assert move("q", "q", "--port", str(proc.port)).returncode == 2  # the same queue
    assert move("q", "q+reader", "--port", str(proc.port)).returncode == 2  # puts go to queues
    result = move("q+reader", "q", "--port", str(proc.port))
    assert result.returncode == 2 and "without end" in result.stderr  # it would feed itself
    result = move("bad.name", "q", "--port", str(proc.port))
    assert result.returncode == 2 and "illegal queue name" in result.stderr
    assert move("q", "r", "--limit", "-1").returncode == 2


def test_an_empty_source_waits_for_an_item_with_wait(make_server):
    proc = make_server()
    runner = start_move("later", "dst", "--port", str(proc.port), "--wait", "5")
    time.sleep(0.5)
    fill(proc, "later", ["late"])
    out, err = runner.communicate(timeout=30)
    assert runner.returncode == 0, err
    assert "moved 1 items" in out
    assert drain(proc, "dst") == ["late"]


class MinimalKestrel(threading.Thread):
    """The least a Kestrel-compatible source must speak: ``set``, ``get q``, ``get q/open``
    and ``get q/close``; anything else is ``ERROR``.  An open read goes back to the
    head of its queue when its connection drops, as in Kestrel 2.  It records every
    command, so the test sees what ``kestreld move`` asked of it."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.queues: dict[str, collections.deque[bytes]] = collections.defaultdict(
            collections.deque
        )
        self.commands: list[str] = []
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]

    def run(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(sock,), daemon=True).start()

    def serve(self, sock: socket.socket) -> None:
        f = sock.makefile("rb")
        holding: tuple[str, bytes] | None = None
        try:
            while line := f.readline():
                words = line.decode().split()
                with self.lock:
                    self.commands.append(" ".join(words[:2]))
                reply = b"ERROR\r\n"
                if words[:1] == ["set"] and len(words) == 5:
                    data = f.read(int(words[4]) + 2)[:-2]
                    with self.lock:
                        self.queues[words[1]].append(data)
                    reply = b"STORED\r\n"
                elif words[:1] == ["get"] and len(words) == 2:
                    queue, *options = words[1].split("/")
                    if set(options) <= {"open", "close"}:
                        if "close" in options:
                            holding = None
                        reply = b"END\r\n"
                        if "open" in options and holding is not None:
                            reply = b"ERROR\r\n"  # one open read per connection
                        elif options != ["close"]:  # a close alone fetches nothing
                            with self.lock:
                                q = self.queues[queue]
                                data = q.popleft() if q else None
                            if data is not None:
                                if "open" in options:
                                    holding = (queue, data)
                                reply = b"VALUE %s 0 %d\r\n%s\r\nEND\r\n" % (
                                    words[1].encode(),
                                    len(data),
                                    data,
                                )
                sock.sendall(reply)
        finally:
            if holding is not None:  # the connection dropped with a read open: give it back
                with self.lock:
                    self.queues[holding[0]].appendleft(holding[1])
            sock.close()

    def close(self) -> None:
        self.listener.close()


def test_the_source_may_be_any_server_speaking_only_get_open_close_and_set(make_server):
    source = MinimalKestrel()
    source.start()
    try:
        source.queues["legacy"].extend(f"old{i}".encode() for i in range(25))
        target = make_server()
        result = move(f"127.0.0.1:{source.port}/legacy", f"127.0.0.1:{target.port}/legacy")
        assert result.returncode == 0, result.stderr
        assert drain(target, "legacy") == [f"old{i}" for i in range(25)]
        assert not source.queues["legacy"]
        asked = set(source.commands)
        assert asked == {"get legacy/open", "get legacy/close"}  # nothing else was needed
    finally:
        source.close()


def test_a_terminal_sees_progress(make_server):
    proc = make_server()
    fill(proc, "src", [f"p{i}" for i in range(3000)])
    controller, terminal = pty.openpty()
    runner = subprocess.Popen(
        [sys.executable, "-m", "kestreld", "move", "src", "dst", "--port", str(proc.port)],
        stdout=subprocess.PIPE,
        stderr=terminal,
        text=True,
    )
    os.close(terminal)
    out, _ = runner.communicate(timeout=120)
    shown = b""
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the terminal's other end is closed
            break
        if not chunk:
            break
        shown += chunk
    os.close(controller)
    assert runner.returncode == 0
    assert "moved 3000 items" in out
    progress = [line.strip() for line in shown.decode().split("\r") if line.strip()]
    assert progress[-1].startswith("127.0.0.1:") and "moved 3000 items" in progress[-1]
