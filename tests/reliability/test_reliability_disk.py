"""Disk faults under a running server: a full disk, a read-only folder, a deleted
segment, permission errors.  The server never crashes, says clearly what failed,
loses nothing it acknowledged and recovers by itself once the fault is gone.

The faults are real, not mocked: a full disk is a small tmpfs mounted by the
test and filled with a ballast file; a read-only folder is a read-only bind
mount laid over the running server's folder (both need root; skipped
otherwise).  Permission errors need a server that is not root: it runs as
``nobody`` through ``setpriv``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from kestreld_process import Conn, KestreldProcess
from waiting import wait_checkpoint, wait_until

from kestreld.journal import codec

ITEM = 4096


def _mount(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=30)


@pytest.fixture
def tmpfs():
    """Mounts a small tmpfs; yields a function (size) -> mount point.  Unmounted after."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []
    base = Path(tempfile.mkdtemp(prefix="kestreld-tmpfs-"))

    def mount(size: str = "2m") -> Path:
        point = base / f"fs{len(mounted)}"
        point.mkdir()
        res = _mount(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(point)])
        if res.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
        mounted.append(point)
        return point

    yield mount
    # Servers are stopped by their own fixtures first (they were created later).
    for point in mounted:
        if _mount(["umount", str(point)]).returncode != 0:
            _mount(["umount", "-l", str(point)])
    shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def servers():
    """Servers started by a test, stopped (or killed) at its end, before tmpfs unmounts."""
    started: list[KestreldProcess] = []
    yield started
    for srv in started:
        try:
            srv.stop()
        except Exception:
            srv.kill()


def _start(servers, folder: Path, config: str, **kw) -> KestreldProcess:
    srv = KestreldProcess(folder, config, config_path=folder.parent / f"{folder.name}.conf", **kw)
    servers.append(srv)
    return srv.start()


def _item(i: int) -> bytes:
    return f"{i:08d}".encode() + b"." * (ITEM - 8)


def _fill_until_refused(
    c: Conn, queue: str, start: int = 0, limit: int = 2000
) -> tuple[list[int], bytes]:
    """Sets until one is refused; (acknowledged numbers, the refusal)."""
    acked = []
    for i in range(start, start + limit):
        reply = c.set(queue, _item(i))
        if reply != b"STORED":
            return acked, reply
        acked.append(i)
    raise AssertionError(f"{limit} sets of {ITEM} bytes all stored on a small disk")


def _wait_stored(c: Conn, queue: str, i: int, seconds: float = 10.0) -> float:
    """Retry a set until STORED; returns how long it took."""
    started = time.monotonic()
    while True:
        reply = c.set(queue, _item(i))
        if reply == b"STORED":
            return time.monotonic() - started
        assert reply.startswith(b"SERVER_ERROR"), reply
        assert time.monotonic() - started < seconds, f"still refused after {seconds}s: {reply!r}"
        time.sleep(0.1)


def _numbers(values: list[bytes]) -> list[int]:
    return [int(v[:8]) for v in values]


def _get_or_refused(c: Conn, key: str) -> bytes | None:
    """A get's item, None for END, or the SERVER_ERROR line of a confirm that could not be made durable."""
    c.send(f"get {key}\r\n")
    line = c.line()
    if line.startswith(b"SERVER_ERROR"):
        return line
    if line == b"END":
        return None
    assert line.startswith(b"VALUE "), line
    data = c.exact(int(line.split()[3]) + 2)[:-2]
    assert c.line() == b"END"
    return data


def _drain(c: Conn, queue: str) -> list[bytes]:
    out = []
    while (v := c.get(queue)) is not None:
        out.append(v)
    return out


def _segment_paths(folder: Path, queue: str) -> list[Path]:
    names = [
        n for n in os.listdir(folder) if n.startswith(queue + ".") and n[len(queue) + 1 :].isdigit()
    ]
    return [folder / n for n in sorted(names, key=lambda n: int(n.split(".")[1]))]


# --- a full disk ---------------------------------------------------------------------------


def _full_disk_server(
    tmpfs, servers, checkpoint_interval: str = "100ms"
) -> tuple[KestreldProcess, Path, Path]:
    point = tmpfs("2m")
    folder = point / "queues"
    srv = _start(
        servers, folder, f'sync_journal = 0\ncheckpoint_interval = "{checkpoint_interval}"\n'
    )
    ballast = point / "ballast"
    free = shutil.disk_usage(point).free
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(0, free - 160 * 1024))  # leave room for ~35 items
    return srv, folder, ballast


def test_full_disk_set_gets_server_error_and_nothing_acknowledged_is_lost(tmpfs, servers):
    srv, folder, ballast = _full_disk_server(tmpfs, servers)
    c = Conn(srv.connect())
    acked, refusal = _fill_until_refused(c, "full")
    assert refusal.startswith(b"SERVER_ERROR"), refusal
    assert b"No space left" in refusal or b"retrying" in refusal, refusal
    assert len(acked) > 5
    assert c.set("full", _item(99999)).startswith(b"SERVER_ERROR"), "refused while the disk is full"
    assert srv.proc.poll() is None
    srv.stop()
    ballast.unlink()
    srv.start()
    c = Conn(srv.connect())
    assert _numbers(_drain(c, "full")) == acked
    for path in _segment_paths(folder, "full"):
        assert codec.decode_file(path.read_bytes()).problem is None, "no torn record left behind"


def test_full_disk_confirms_get_server_error_and_stay_open_while_peeks_and_stats_work(
    tmpfs, servers
):
    # No rewrite before the disk fills: the progress file must be created by the first confirm.
    srv, _, ballast = _full_disk_server(tmpfs, servers, "1h")
    c = Conn(srv.connect())
    acked, _ = _fill_until_refused(c, "reads")
    refused = _get_or_refused(c, "reads")
    assert refused.startswith(b"SERVER_ERROR") and b"No space left" in refused, refused
    assert c.get("reads/open")[:8] == b"%08d" % acked[0], "the refused plain get gave it back"
    c.send("get reads/close\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR") and b"No space left" in reply, reply
    assert c.stats()["queue_reads_open_transactions"] == "1", "the read stays open"
    c.send("get reads/close/open\r\n")
    reply = c.line()
    assert reply.startswith(b"SERVER_ERROR"), reply
    assert c.stats()["queue_reads_open_transactions"] == "1", "nothing new opened either"
    other = Conn(srv.connect())
    assert other.get("reads/peek")[:8] == b"%08d" % acked[1]
    assert int(c.stats()["queue_reads_items"]) == len(acked) - 1
    ballast.unlink()
    c.send("get reads/close\r\n")
    assert c.line() == b"END", "the same read is confirmed once there is space"
    assert _numbers([c.get("reads") for _ in range(2)]) == acked[1:3]
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert _numbers(_drain(c, "reads")) == acked[3:], "acknowledged confirms stay confirmed"


def test_full_disk_recovers_by_itself_when_space_returns(tmpfs, servers):
    srv, _, ballast = _full_disk_server(tmpfs, servers)
    c = Conn(srv.connect())
    acked, _ = _fill_until_refused(c, "heal")
    ballast.unlink()
    took = _wait_stored(c, "heal", 5000)
    assert took < 5.0
    for i in range(5001, 5021):
        assert c.set("heal", _item(i)) == b"STORED"
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert _numbers(_drain(c, "heal")) == acked + [5000] + list(range(5001, 5021))
    wait_until(lambda: srv.events("journal_write_failed"), "the failure was logged")


def test_full_disk_confirms_refused_then_durable_once_space_returns(tmpfs, servers):
    srv, _, ballast = _full_disk_server(tmpfs, servers, "1h")
    c = Conn(srv.connect())
    acked, _ = _fill_until_refused(c, "cp")
    # Fill the last bytes too, so neither an append nor a rewrite can be written.
    with open(ballast, "ab") as f:
        try:
            f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    replies = [_get_or_refused(c, "cp") for _ in range(5)]
    assert all(r.startswith(b"SERVER_ERROR") for r in replies), replies
    wait_until(
        lambda: srv.events("progress_write_failed"), "a confirm that cannot be written is reported"
    )
    ballast.unlink()
    taken = _numbers([c.get("cp") for _ in range(10)])
    srv.restart(crash=True)  # no rewrite ran: the appended confirms alone must hold
    c = Conn(srv.connect())
    assert taken == acked[:10]
    assert _numbers(_drain(c, "cp")) == acked[10:], "confirmed items did not come back"


def test_item_refused_with_server_error_is_never_delivered(tmpfs, servers):
    srv, _, ballast = _full_disk_server(tmpfs, servers)
    c = Conn(srv.connect())
    acked, _ = _fill_until_refused(c, "phantom")
    refused = acked[-1] + 1
    ballast.unlink()
    assert refused not in _numbers(_drain(c, "phantom"))


# --- a read-only folder --------------------------------------------------------------------


def test_read_only_folder_refuses_new_files_serves_reads_and_recovers(tmp_path, servers):
    """The folder turns read-only (a read-only bind mount over it) under a running server."""
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")
    folder = tmp_path / "queues"
    srv = _start(
        servers,
        folder,
        'sync_journal = 0\nmax_journal_size = "16KiB"\ncheckpoint_interval = "100ms"\n',
    )
    c = Conn(srv.connect())
    for i in range(3):
        assert c.set("ro", _item(i)) == b"STORED"
    assert _mount(["mount", "--bind", str(folder), str(folder)]).returncode == 0
    try:
        assert _mount(["mount", "-o", "remount,bind,ro", str(folder)]).returncode == 0
        replies = [c.set("ro", _item(i)) for i in range(3, 13)]
        refused = [r for r in replies if r != b"STORED"]
        assert refused and all(b"Read-only file system" in r for r in refused), replies
        acked = [0, 1, 2] + [
            i for i, r in zip(range(3, 13), replies, strict=True) if r == b"STORED"
        ]
        reply = c.set("newqueue", _item(0))
        assert reply.startswith(b"SERVER_ERROR") and b"Read-only file system" in reply, reply
        # A get confirms: delivered if its append still works, else refused and kept.
        got = [_get_or_refused(c, "ro") for _ in range(2)]
        delivered = [g for g in got if not g.startswith(b"SERVER_ERROR")]
        assert all(b"Read-only file system" in g for g in got if g not in delivered), got
        assert _numbers(delivered) == acked[: len(delivered)]
        assert c.stats()["curr_connections"] == "1"
        wait_until(lambda: srv.events("checkpoint_failed"), "the failed checkpoint is reported")
        assert srv.proc.poll() is None
    finally:
        assert _mount(["umount", str(folder)]).returncode == 0
    _wait_stored(c, "ro", 100)
    assert c.set("newqueue", _item(1)) == b"STORED"
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert _numbers(_drain(c, "ro")) == acked[len(delivered) :] + [100]
    assert _numbers(_drain(c, "newqueue")) == [1]


def test_start_on_read_only_folder_fails_with_a_clear_message(tmpfs, servers):
    point = tmpfs("1m")
    folder = point / "queues"
    folder.mkdir()
    assert _mount(["mount", "-o", "remount,ro", str(point)]).returncode == 0
    srv = KestreldProcess(folder, "", config_path=point.parent / "ro.conf")
    with pytest.raises(RuntimeError) as e:
        srv.start()
    assert "Read-only file system" in str(e.value)
    assert "Traceback" not in str(e.value)


# --- a segment deleted under a running server ----------------------------------------------


def test_deleted_segment_with_unread_items_is_skipped_with_a_warning(make_server):
    srv = make_server('max_journal_size = "4KiB"\nmax_memory_size = "2KiB"\n')
    c = Conn(srv.connect())
    items = [f"{i:0300d}".encode() for i in range(40)]
    for item in items:
        assert c.set("gone", item) == b"STORED"
    paths = _segment_paths(srv.queue_path, "gone")
    assert len(paths) >= 3
    lost = {p.data for p in codec.decode_file(paths[1].read_bytes()).records}
    paths[1].unlink()
    got = _drain(c, "gone")
    assert got == [i for i in items if i not in lost], (
        "everything but the deleted segment, in order"
    )
    wait_until(  # the log is read by a thread: the line may trail the drain
        lambda: any(e.get("path") == str(paths[1]) for e in srv.events("journal_damage_skipped")),
        "the skipped segment was logged",
    )
    assert c.set("gone", "after") == b"STORED" and c.get("gone") == b"after"
    assert not srv.events("command_failed")


def test_deleted_current_segment_does_not_stop_the_server(make_server):
    srv = make_server("sync_journal = 0\n")
    c = Conn(srv.connect())
    c.set("cur", "a")
    for path in _segment_paths(srv.queue_path, "cur"):
        path.unlink()
    assert c.set("cur", "b") == b"STORED"
    assert [c.get("cur"), c.get("cur"), c.get("cur")] == [b"a", b"b", None]
    srv.restart()
    c = Conn(srv.connect())
    assert c.set("cur", "c") == b"STORED" and c.get("cur") == b"c"


def test_deleted_checkpoint_is_written_again(make_server):
    srv = make_server('checkpoint_interval = "50ms"\n')
    c = Conn(srv.connect())
    for i in range(5):
        c.set("cpdel", str(i))
    c.get("cpdel")
    wait_checkpoint(srv.queue_path, "cpdel", 1)
    (srv.queue_path / "cpdel.read.").unlink()
    c.get("cpdel")
    wait_checkpoint(srv.queue_path, "cpdel", 2)  # the file is there again
    srv.restart(crash=True)
    assert _drain(Conn(srv.connect()), "cpdel") == [b"2", b"3", b"4"]


# --- permission errors (server runs as nobody) -------------------------------------------------


class _NobodyServer(KestreldProcess):
    def command(self) -> list[str]:
        return [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ] + super().command()


@pytest.fixture
def nobody_dir():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("running the server as another user needs root and setpriv")
    base = Path(tempfile.mkdtemp(prefix="kestreld-nobody-"))
    base.chmod(0o755)
    folder = base / "queues"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    yield folder
    shutil.rmtree(base, ignore_errors=True)


def _start_nobody(servers, folder: Path, config: str) -> KestreldProcess:
    conf = folder.parent / "nobody.conf"
    srv = _NobodyServer(folder, config, config_path=conf)
    conf.chmod(0o644)
    servers.append(srv)
    return srv.start()


def test_unwritable_folder_refuses_new_queues_and_checkpoints_clearly(nobody_dir, servers):
    srv = _start_nobody(servers, nobody_dir, 'sync_journal = 0\ncheckpoint_interval = "100ms"\n')
    c = Conn(srv.connect())
    for i in range(5):
        assert c.set("perm", str(i)) == b"STORED"
    assert c.get("perm") == b"0"  # its progress file exists: appends need no new file
    nobody_dir.chmod(0o555)
    try:
        reply = c.set("brandnew", "x")
        assert reply.startswith(b"SERVER_ERROR") and b"Permission denied" in reply, reply
        assert c.set("perm", "5") == b"STORED", "the open segment is still writable"
        assert c.get("perm") == b"1"
        failed = wait_until(lambda: srv.events("checkpoint_failed"), "checkpoint_failed logged")
        assert failed and "Permission denied" in failed[0]["error"]
    finally:
        nobody_dir.chmod(0o755)
    assert _wait_stored(c, "brandnew", 0) < 5
    wait_checkpoint(nobody_dir, "perm", 1)
    srv.restart(crash=True)
    c = Conn(srv.connect())
    assert _drain(c, "perm") == [b"2", b"3", b"4", b"5"]


def test_unwritable_folder_refuses_a_queues_first_get_clearly_and_keeps_the_item(
    nobody_dir, servers
):
    """A reader that consumed nothing has no progress file yet: its first get creates it."""
    srv = _start_nobody(servers, nobody_dir, "")
    c = Conn(srv.connect())
    assert c.set("fresh", "x") == b"STORED"
    nobody_dir.chmod(0o555)
    try:
        c.send("get fresh\r\n")
        reply = c.line()
        assert reply.startswith(b"SERVER_ERROR") and b"Permission denied" in reply, reply
    finally:
        nobody_dir.chmod(0o755)
    assert c.get("fresh") == b"x"


def test_unreadable_checkpoint_at_start_up_redelivers_instead_of_failing(nobody_dir, servers):
    srv = _start_nobody(servers, nobody_dir, "")
    c = Conn(srv.connect())
    for i in range(3):
        c.set("cpperm", str(i))
    c.get("cpperm")
    srv.stop()
    (nobody_dir / "cpperm.read.").chmod(0o000)
    srv.start()
    assert any("cpperm.read." in e["problem"] for e in srv.events("journal_repaired"))
    assert _drain(Conn(srv.connect()), "cpperm") == [b"0", b"1", b"2"]


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_unreadable_segment_at_start_up_refuses_naming_the_file(nobody_dir, servers, which):
    """Starting without a segment's items would lose them: refuse, and say which file."""
    srv = _start_nobody(servers, nobody_dir, 'max_journal_size = "4KiB"\n')
    c = Conn(srv.connect())
    for i in range(40):
        c.set("segperm", f"{i:0300d}")
    srv.stop()
    paths = _segment_paths(nobody_dir, "segperm")
    victim = paths[0] if which == "oldest" else paths[-1]
    victim.chmod(0o000)
    with pytest.raises(RuntimeError):
        srv.start()
    assert not any("Traceback" in line for line in srv.log_lines), "a message, not a crash"
    failed = srv.events("startup_failed")
    assert (
        failed and victim.name in failed[-1]["error"] and "Permission denied" in failed[-1]["error"]
    )
    victim.chmod(0o644)
    srv.start()
    got = _drain(Conn(srv.connect()), "segperm")
    assert got == [f"{i:0300d}".encode() for i in range(40)]


def test_pipelined_sets_caught_by_a_failing_rotation_are_refused_not_acknowledged(tmpfs, servers):
    """A rotation writes out the buffered puts first; if that write fails, none is STORED."""
    point = tmpfs("1m")
    folder = point / "queues"
    srv = _start(servers, folder, 'sync_journal = 0\nmax_journal_size = "64KiB"\n')
    ballast = point / "ballast"
    with open(ballast, "wb") as f:
        f.write(b"\0" * max(0, shutil.disk_usage(point).free - 48 * 1024))
    c = Conn(srv.connect())
    item = b"r" * 1000
    acked = []
    for burst in range(12):  # pipelined bursts: many puts buffered in one tick
        c.send(
            b"".join(
                b"set rotfail 0 0 1004\r\n%04d%s\r\n" % (burst * 40 + i, item) for i in range(40)
            )
        )
        for i in range(40):
            if c.line() == b"STORED":
                acked.append(burst * 40 + i)
    assert len(acked) < 480, "the disk filled up"
    ballast.unlink()
    srv.restart()
    got = [int(v[:4]) for v in _drain(Conn(srv.connect()), "rotfail")]
    assert set(acked) <= set(got), f"acknowledged but lost: {sorted(set(acked) - set(got))[:10]}"


def test_failing_checkpoint_writes_leave_no_temporaries_behind(tmpfs, servers):
    srv, folder, ballast = _full_disk_server(tmpfs, servers)
    c = Conn(srv.connect())
    acked, _ = _fill_until_refused(c, "tmpleft")
    with open(ballast, "ab") as f:
        try:
            f.write(b"\0" * (1 << 20))
        except OSError:
            pass
    for _ in range(5):
        _get_or_refused(c, "tmpleft")  # refused (disk full): the rewrite is retried
    wait_until(lambda: srv.events("checkpoint_failed"), "the failing rewrite is reported")
    leftovers = [n for n in os.listdir(folder) if "~~" in n]
    assert leftovers == [], f"temporaries of failed checkpoints pile up: {leftovers}"
