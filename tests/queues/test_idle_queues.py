"""A queue that does nothing costs nothing: descriptors within a budget derived from the
open-file limit, periodic work only for queues that changed or have deadlines.

Servers here run under an open-file limit set for the child alone (``prlimit``), as a
newcomer's shell would start one (``ulimit -n 1024``).
"""

from __future__ import annotations

import os
import shutil
import time

import pytest
from kestreld_process import Conn, KestreldProcess

pytestmark = pytest.mark.skipif(shutil.which("prlimit") is None, reason="needs prlimit")

TICKS = os.sysconf("SC_CLK_TCK")


class LimitedProcess(KestreldProcess):
    """A server started under an open-file limit (``soft``:``hard``)."""

    def __init__(self, *args, soft: int = 1024, hard: int = 1024, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.soft = soft
        self.hard = hard

    def command(self) -> list[str]:
        return ["prlimit", f"--nofile={self.soft}:{self.hard}", "--", *super().command()]


@pytest.fixture
def limited(tmp_path):
    started: list[KestreldProcess] = []

    def factory(config: str | None = None, **limits) -> LimitedProcess:
        n = len(started)
        proc = LimitedProcess(
            tmp_path / f"queues{n}",
            config,
            config_path=tmp_path / f"kestreld{n}.conf" if config is not None else None,
            **limits,
        )
        started.append(proc)
        return proc.start(timeout=60)

    yield factory
    for proc in started:
        try:
            proc.stop(timeout=60)
        except Exception:
            proc.kill()


def fill(c: Conn, names: list[str], items: int = 1, body: bytes = b"x" * 100) -> None:
    """``items`` sets to each queue, pipelined; every one STORED."""
    for start in range(0, len(names), 200):
        chunk = names[start : start + 200]
        c.send(
            b"".join(b"set %s 0 0 %d\r\n%s\r\n" % (n.encode(), len(body), body) for n in chunk)
            * items
        )
        for _ in range(len(chunk) * items):
            assert c.line() == b"STORED"


def open_descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def errors_logged(proc: KestreldProcess) -> list[str]:
    return [line for line in proc.log_lines if '"level": "error"' in line]


def test_soft_open_file_limit_is_raised_to_the_hard_limit_and_logged(limited):
    srv = limited(soft=512, hard=1024)
    (event,) = srv.events("open_file_limit")
    assert event["soft_was"] == 512
    assert event["soft"] == 1024
    assert event["hard"] == 1024
    assert 0 < event["journals_open_at_most"] < 1024


def test_two_thousand_queues_take_sets_and_gets_under_a_1024_descriptor_limit(limited):
    srv = limited()
    names = [f"q{i}" for i in range(2000)]
    c = Conn(srv.connect())
    fill(c, names, items=2)
    assert open_descriptors(srv.pid) < 1024 - 256  # room left for clients
    clients = [Conn(srv.connect()) for _ in range(20)]  # new connections are answered
    for other in clients:
        assert other.set("q0", "more") == b"STORED"
        other.close()
    for name in names:
        assert c.get(name) == b"x" * 100
    c.close()
    assert errors_logged(srv) == []


def test_two_thousand_queues_come_back_after_a_restart_under_a_1024_limit(limited):
    srv = limited()
    names = [f"q{i}" for i in range(2000)]
    c = Conn(srv.connect())
    fill(c, names, items=2)
    c.close()
    srv.restart()
    c = Conn(srv.connect())
    for name in names:
        assert c.get(name) == b"x" * 100  # from disk (read-behind): read descriptors too
    fill(c, names[:500])  # and the queues still take sets
    for name in names:
        assert c.get(name) == b"x" * 100
    assert open_descriptors(srv.pid) < 1024
    c.close()
    assert errors_logged(srv) == []


def test_a_queue_whose_journal_handle_was_closed_keeps_every_item_across_a_crash(limited):
    srv = limited(hard=1024)
    budget = srv.events("open_file_limit")[0]["journals_open_at_most"]
    c = Conn(srv.connect())
    c.set("first", "before")
    # Enough other queues written after it that its descriptors are closed (evicted).
    fill(c, [f"other{i}" for i in range(budget * 2)])
    c.set("first", "after")  # reopened at its end
    fill(c, [f"again{i}" for i in range(budget * 2)])
    c.send("get first/open\r\n")
    assert c.read_value() == b"before"
    c.send("get first/close/open\r\n")  # confirmed through a reopened progress file
    assert c.read_value() == b"after"
    c.send("get first/close\r\n")
    assert c.read_value() is None
    c.set("first", "last")
    c.close()
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert c.get("first") == b"last"
    assert c.get("first") is None
    assert c.get("other0") == b"x" * 100
    c.close()


def test_connections_past_their_share_of_the_limit_are_refused_with_an_error(limited):
    srv = limited(soft=256, hard=256)
    share = srv.events("open_file_limit")[0]["connections_at_most"]
    held = [Conn(srv.connect()) for _ in range(share)]
    extra = Conn(srv.connect())
    assert extra.line() == b"SERVER_ERROR too many connections"
    assert extra.closed()
    for c in held[-3:]:
        assert c.set("still", "fine") == b"STORED"
    for c in held:
        c.close()


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def cpu_share(pid: int, seconds: float) -> float:
    before = cpu_seconds(pid)
    started = time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(pid) - before) / (time.monotonic() - started)


def test_idle_queues_cost_almost_no_cpu(limited):
    srv = limited(soft=20000, hard=20000)
    c = Conn(srv.connect())
    fill(c, [f"q{i}" for i in range(3000)], items=10)
    # The new queues' first progress files are written (and fsynced) off the loop first.
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        written = [n for n in os.listdir(srv.queue_path) if ".read." in n and "~~" not in n]
        if len(written) == 3000 and cpu_share(srv.pid, 1) < 0.02:
            break
        time.sleep(0.5)
    assert cpu_share(srv.pid, 4) < 0.02  # before: every queue visited every second
    c.close()


def test_an_item_with_an_expiry_among_idle_queues_still_expires_in_the_sweep(limited):
    srv = limited(config="expiration_timer_frequency = 100\n")
    c = Conn(srv.connect())
    fill(c, [f"idle{i}" for i in range(100)])
    assert c.set("soon", "gone", exptime=1) == b"STORED"
    time.sleep(2.5)
    stats = c.stats()
    assert stats["queue_soon_expired_items"] == "1"  # by the sweep, no get needed
    assert stats["queue_soon_items"] == "0"
    assert stats["queue_idle0_items"] == "1"
    c.close()


def test_journals_past_the_budget_close_their_descriptors_and_append_at_their_end(tmp_path):
    from kestreld.journal import codec
    from kestreld.journal.handles import HandleCache
    from kestreld.journal.writer import WriterJournal

    cache = HandleCache(max_journals=4)
    journals = [
        WriterJournal(
            str(tmp_path), f"q{i}", max_journal_size=1 << 20, sync_journal=None, handles=cache
        )
        for i in range(10)
    ]
    for journal in journals:  # no event loop runs: each put is written at once
        journal.open([])
        journal.put(1, b"one")
    assert len(cache) == 4
    assert sum(journal.open_handles() for journal in journals) == 4
    for journal in journals:
        journal.put(2, b"two")  # reopened in append mode
    for journal in journals:
        journal.close()
        (segment,) = journal.segments
        data = open(segment.path, "rb").read()
        puts = [r for r in codec.scan(data, codec.MAGIC_SIZE).records if isinstance(r, codec.Put)]
        assert [(p.id, p.data) for p in puts] == [(1, b"one"), (2, b"two")]
    assert len(cache) == 0
