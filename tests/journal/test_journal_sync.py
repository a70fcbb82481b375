"""When the journal is fsynced, and what a failing fsync does.

- ``sync_journal = "100ms"`` (what ``config/production.conf`` ships): the
  server is run under ``strace`` and its fsyncs are counted: they come at
  most once a period while puts stream in, on a thread of their own (never
  on the event loop, never one per put), the last write is covered by one,
  and an idle server does none.
- A failing fsync is real: the queue folder is on an ext4 file system whose
  block device (a loop device) lives in a small tmpfs that the test fills, a
  thin-provisioned disk run out of space.  Writes still land in the page
  cache; the fsync fails with ENOSPC.  Needs root (mount, losetup).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from kestreld_process import Conn, KestreldProcess
from waiting import wait_until

# --- sync_journal as a period --------------------------------------------------------------

PERIOD = 0.1  # sync_journal = "100ms"
_CALL = re.compile(r"^(\d+) +(\d+\.\d+) (writev|write|fsync|fdatasync)\((\d+)<([^>]*)>")


class _TracedServer(KestreldProcess):
    """kestreld under ``strace``: every fsync with its thread, time and file."""

    def __init__(self, *args, trace: Path, **kw) -> None:
        super().__init__(*args, **kw)
        self.trace = trace

    def command(self) -> list[str]:
        strace = [
            "strace", "-f", "-qq", "--seccomp-bpf", "-ttt", "-y",
            "-e", "trace=fsync,fdatasync,write,writev", "-e", "signal=none", "-o", str(self.trace),
        ]  # fmt: skip
        return strace + super().command()

    def server_pid(self) -> int:
        """The kestreld process (strace's child): its main thread runs the event loop."""
        assert self.proc is not None
        with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
            return int(f.read().split()[0])

    def stop(self, timeout: float = 15.0) -> int:
        """SIGTERM to kestreld itself (strace would only detach), then strace ends with it."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.server_pid(), signal.SIGTERM)
            self.proc.wait(timeout)
        return super().stop(timeout)

    def calls(self, segment_prefix: str, *names: str) -> list[tuple[int, float]]:
        """(thread id, time) of each such call on a journal segment whose path starts so."""
        out = []
        for line in self.trace.read_text().splitlines():
            m = _CALL.match(line)
            if m and m.group(3) in names and m.group(5).startswith(segment_prefix):
                out.append((int(m.group(1)), float(m.group(2))))
        return out

    def fsyncs(self, segment_prefix: str) -> list[tuple[int, float]]:
        return self.calls(segment_prefix, "fsync", "fdatasync")


@pytest.fixture
def traced(tmp_path):
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed")
    srv = _TracedServer(
        tmp_path / "queues",
        'sync_journal = "100ms"\ncheckpoint_interval = "1h"\n',
        trace=tmp_path / "fsyncs.txt",
    )
    try:
        srv.start()
    except RuntimeError as e:
        if "ptrace" in str(e) or "Operation not permitted" in str(e):
            pytest.skip(f"strace cannot trace here: {e}")
        raise
    yield srv
    srv.stop()


def test_periodic_sync_fsyncs_once_a_period_off_the_event_loop(traced):
    srv = traced
    prefix = str(srv.queue_path / "sync.")
    loop_thread = srv.server_pid()
    stop = threading.Event()
    stored: list[float] = []  # when each STORED arrived

    def produce() -> None:
        c = Conn(srv.connect())
        i = 0
        while not stop.is_set():
            assert c.set("sync", f"item{i}") == b"STORED"
            stored.append(time.time())
            i += 1
        c.close()

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_until(lambda: len(srv.fsyncs(prefix)) >= 8, "eight periodic fsyncs")
    finally:
        stop.set()
        producer.join(30)
    last_write = srv.calls(prefix, "write", "writev")[-1][1]  # puts: one writev a tick
    # The last write is covered by an fsync within about a period, then nothing more.
    wait_until(
        lambda: any(t > last_write for _, t in srv.fsyncs(prefix)), "an fsync after the last write"
    )
    time.sleep(5 * PERIOD)  # idle: a periodic sync with nothing to sync would show here
    fsyncs = srv.fsyncs(prefix)
    first_put = stored[0]

    assert [tid for tid, _ in fsyncs if tid == loop_thread] == [], "an fsync on the event loop"
    # One fsync covers the last write; a second follows a period later when that write
    # came in while an fsync was already under way (the server cannot tell whether the
    # running fsync covers it: a loaded run showed two, 103 ms apart).  Idle, no more.
    after = [t for _, t in fsyncs if t > last_write]
    assert 1 <= len(after) <= 2, f"fsyncs go on while idle: {len(after)} after the last write"
    # Once a period at most: for the span the puts took, and never two close together.
    during = [t for _, t in fsyncs if first_put <= t <= last_write]
    span = last_write - first_put
    assert len(during) <= span / PERIOD + 2, f"{len(during)} fsyncs in {span:.2f}s"
    gaps = [b - a for (_, a), (_, b) in zip(fsyncs, fsyncs[1:], strict=False)]
    assert min(gaps) > PERIOD / 2, f"fsyncs {min(gaps) * 1000:.0f} ms apart"
    # Never on the hot path: puts are not each waiting for an fsync.
    assert len(stored) >= 10 * len(fsyncs), f"{len(stored)} puts, {len(fsyncs)} fsyncs"


# --- a failing fsync (sync_journal = 0: STORED only after the fsync) -----------------------------------------------------------------------


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(args), capture_output=True, text=True, timeout=60)


class ThinDisk:
    """ext4 on a loop device whose backing file lives in a small tmpfs.

    ``fill()`` uses up the tmpfs: the ext4 still has room, so writes succeed
    (page cache), but writing them back fails, and so does fsync.  ``free()``
    gives the space back.  ``remount()`` drops the page cache: what is read
    afterwards is what reached the "disk".
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.back = base / "back"
        self.mnt = base / "mnt"
        self.image = self.back / "disk.img"
        self.ballast = self.back / "ballast"
        self.loop = ""
        self.mounted: list[Path] = []

    def create(self) -> None:
        self.back.mkdir()
        self.mnt.mkdir()
        self._must("mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(self.back))
        self.mounted.append(self.back)
        with open(self.image, "wb") as f:
            f.truncate(64 << 20)  # sparse: blocks take tmpfs space only once written
        self._must(
            "mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", "-E",
            "lazy_itable_init=1,nodiscard", str(self.image),
        )  # fmt: skip
        self.loop = self._must("losetup", "-f", "--show", str(self.image)).stdout.strip()
        self.mount()

    def mount(self) -> None:
        self._must("mount", "-o", "errors=continue", self.loop, str(self.mnt))
        self.mounted.append(self.mnt)

    def unmount(self) -> None:
        self._must("umount", str(self.mnt))
        self.mounted.remove(self.mnt)

    def remount(self) -> None:
        self.unmount()
        self.mount()

    def fill(self) -> None:
        with open(self.ballast, "wb") as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 20))
            except OSError:
                pass

    def free(self) -> None:
        self.ballast.unlink()

    def destroy(self) -> None:
        for point in reversed(self.mounted):
            if _run("umount", str(point)).returncode != 0:
                _run("umount", "-l", str(point))
        if self.loop:
            _run("losetup", "-d", self.loop)
        shutil.rmtree(self.base, ignore_errors=True)

    def _must(self, *args: str) -> subprocess.CompletedProcess:
        res = _run(*args)
        if res.returncode != 0:
            pytest.skip(f"cannot build a thin disk here ({' '.join(args[:2])}): {res.stderr}")
        return res


@pytest.fixture
def thin_disk():
    if os.geteuid() != 0:
        pytest.skip("a loop-mounted file system needs root")
    for tool in ("losetup", "mkfs.ext4"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    disk = ThinDisk(Path(tempfile.mkdtemp(prefix="kestreld-thin-")))
    try:
        disk.create()
        yield disk
    finally:
        disk.destroy()


def _item(kind: str, n: int) -> bytes:
    return f"{kind}{n:04d}".encode().ljust(256 * 1024, b".")


def _value(c: Conn, line: bytes) -> bytes:
    """The item of a get whose first reply line is ``line`` (which must be a VALUE)."""
    assert line.startswith(b"VALUE "), line
    value = c.exact(int(line.split()[3]) + 2)[:-2]
    assert c.line() == b"END"
    return value


def _drain_after_crash(srv: KestreldProcess, disk: ThinDisk) -> list[bytes]:
    """kill -9, drop the page cache (an unmount), restart: every item of ``q``, in order."""
    srv.kill()
    disk.remount()
    srv.start()
    c = Conn(srv.connect())
    got = []
    while (v := c.get("q")) is not None:
        got.append(v)
    return got


def _put_until_refused(c: Conn, disk: ThinDisk) -> tuple[list[bytes], bytes]:
    """Three puts stored, the disk filled, then puts until one is refused: (the items
    acknowledged, in order, and the refusal)."""
    # Items of 256 KiB: each needs new blocks, which the full backing store refuses
    # (a small put could land in a block already there, and succeed).
    acked = [_item("before", i) for i in range(3)]
    for item in acked:
        assert c.set("q", item) == b"STORED"
    disk.fill()
    # The backing store may still hold a block or two (its last page): the first
    # refusal comes within a few puts, and it is the fsync that fails.
    for i in range(20):
        reply = c.set("q", _item("refused", i))
        if reply != b"STORED":
            break
        acked.append(_item("refused", i))
    return acked, reply


def _put_until_stored(c: Conn, timeout: float = 30.0) -> bytes:
    """Puts are refused for a moment after a failure: put until one is stored; its item."""
    deadline = time.monotonic() + timeout
    n = 0
    while (reply := c.set("q", _item("after", n))) != b"STORED":
        assert reply.startswith(b"SERVER_ERROR"), reply
        assert time.monotonic() < deadline, f"still refused: {reply!r}"
        time.sleep(0.1)
        n += 1
    return _item("after", n)


def test_failed_fsync_refuses_the_put_and_loses_nothing_acknowledged(thin_disk):
    folder = thin_disk.mnt / "queues"
    srv = KestreldProcess(folder, "sync_journal = 0\n", config_path=thin_disk.base / "k.conf")
    srv.start()
    try:
        c = Conn(srv.connect())
        acked, reply = _put_until_refused(c, thin_disk)
        assert reply == b"SERVER_ERROR journal fsync failed: No space left on device", reply
        wait_until(lambda: srv.events("journal_fsync_failed"), "the failure is logged")
        # Still served (a peek: a get's confirm needs the full disk too, and is refused).
        assert c.get("q/peek") == acked[0], "what was acknowledged is still there"
        assert srv.proc.poll() is None
        thin_disk.free()
        # Refused for a moment after a failure, then stored again.
        acked.append(_put_until_stored(c))
        # kill -9, and the page cache dropped (an unmount: the kernel may drop pages whose
        # writeback failed at any time, and the refused put's were): a restart gives back
        # every item acknowledged and not yet read, in order.  Found by CI: the put stored
        # after the refusal had been appended behind the refused one's lost pages, and the
        # restart cut the segment there.
        got = _drain_after_crash(srv, thin_disk)
        assert [v[:12] for v in got] == [v[:12] for v in acked], "refused puts stay refused"
        assert srv.events("journal_segment_abandoned"), "the next put went to a new segment"
    finally:
        srv.stop()


def test_an_outage_of_failing_fsyncs_keeps_one_segment_for_its_refused_puts(thin_disk):
    """Every retry window of an outage abandons the segment its puts went to; one holding
    no acknowledged put is started again, empty, rather than followed by another file."""
    folder = thin_disk.mnt / "queues"
    srv = KestreldProcess(folder, "sync_journal = 0\n", config_path=thin_disk.base / "k.conf")
    srv.start()
    try:
        c = Conn(srv.connect())
        acked, reply = _put_until_refused(c, thin_disk)
        assert reply.startswith(b"SERVER_ERROR"), reply
        # A client that keeps putting through the outage: one try per retry window (1 s)
        # reaches the disk, and its fsync fails.
        deadline = time.monotonic() + 30
        while len(srv.events("journal_segment_abandoned")) < 4:
            assert time.monotonic() < deadline, "the retry windows did not come"
            reply = c.set("q", _item("outage", 0))
            assert reply.startswith(b"SERVER_ERROR"), reply
            time.sleep(0.05)
        segments = sorted(p.name for p in folder.iterdir() if re.fullmatch(r"q\.\d+", p.name))
        # The segment of the acknowledged puts, and one for the refused ones (before: one
        # more per retry window).
        assert len(segments) == 2, segments
        assert srv.events("journal_segment_restarted"), "the header-only segment was reused"
        thin_disk.free()
        acked.append(_put_until_stored(c))
        got = _drain_after_crash(srv, thin_disk)
        assert [v[:12] for v in got] == [v[:12] for v in acked], "refused puts stay refused"
    finally:
        srv.stop()


def test_a_confirm_refused_by_a_failed_fsync_is_cut_and_later_confirms_stay(thin_disk):
    """A get whose confirm shared a failed fsync is refused and its item delivered again;
    a confirm acknowledged after the failure is durable (not behind the failed one)."""
    folder = thin_disk.mnt / "queues"
    # No compaction during the test: the progress file alone must be right.
    config = 'sync_journal = 0\ncheckpoint_interval = "10min"\n'
    srv = KestreldProcess(folder, config, config_path=thin_disk.base / "k.conf")
    srv.start()
    try:
        c = Conn(srv.connect())
        small = [f"small{i:04d}".encode() for i in range(30)]
        for item in small:
            assert c.set("q", item) == b"STORED"
        remaining = list(small)
        stored_big = []
        thin_disk.fill()
        # A 256 KiB set and a get in one packet: the get arrives with the set's last bytes,
        # so both are written in one tick and synced by one fsync.  Until the disk refuses
        # the set, both succeed; then the get's confirm fails with it.
        for i in range(20):
            big = _item("big", i)
            c.send(f"set q 0 0 {len(big)}\r\n".encode() + big + b"\r\nget q\r\n")
            stored = c.line()
            line = c.line()
            if stored.startswith(b"SERVER_ERROR"):
                assert line.startswith(b"SERVER_ERROR"), "the get's confirm shared the fsync"
                break
            assert stored == b"STORED", stored
            stored_big.append(big)
            assert _value(c, line) == remaining.pop(0)
        else:
            pytest.fail("the full disk never refused a put")
        thin_disk.free()
        deadline = time.monotonic() + 30
        while True:
            c.send("get q\r\n")
            line = c.line()
            if not line.startswith(b"SERVER_ERROR"):
                break
            assert time.monotonic() < deadline, f"still refused: {line!r}"
            time.sleep(0.1)
        assert _value(c, line) == remaining.pop(0), "the refused get's item is delivered again"
        got = _drain_after_crash(srv, thin_disk)
        assert [v[:12] for v in got] == [v[:12] for v in remaining + stored_big]
    finally:
        srv.stop()
