"""A lazy file system for power-loss tests: only what was fsynced survives a power cut.

A FUSE pass-through mount over a backing folder.  Every write, create,
truncate, rename, unlink and mkdir reaches the backing folder at once (so the
programs on the mount see a normal file system), but a second, *durable*
image is kept in memory and changes only at a durability boundary:

- ``fsync``/``fdatasync`` of a file makes that file's data durable (not its
  name: a new file whose folder was never fsynced is lost with its data);
- ``fsync`` of a folder makes the folder's current entries durable (creates,
  renames in and out, unlinks), and nothing else.

That is POSIX's minimum, the model of Jepsen's LazyFS, and not ext4's
kindness (no ordered-data mode, no rename-over heuristics).  ``power_cut``
replaces the backing folder with the durable image, exactly what a disk
would show after power loss.  ``crash_at(n)`` arms a cut at the n-th
durability boundary from now: that fsync, and every later one, fails with
``EIO`` and changes nothing durable, so the program never learns that
anything after the cut is safe; the test then kills the program and calls
``power_cut``.

The server runs as its own process (``python lazyfs.py BACKING MOUNT SOCKET``),
so a kestreld under test blocked in a FUSE call can never deadlock the test
that controls it.  Control is one JSON line per request over a Unix socket.
:class:`LazyFS` starts, drives and stops it.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

# libfuse3 even where libfuse2 is installed too (mfusepy would take "fuse" first).
os.environ.setdefault("FUSE_LIBRARY_NAME", "fuse3")

#: Unit of a partial write-back: a disk sector (a page being written back when the
#: power fails can land partly, sector by sector).
SECTOR = 512

#: Why the power-loss tests cannot run here; None when they can.
_unavailable: str | None | bool = False


def unavailable_reason() -> str | None:
    """Why no lazy file system can be mounted on this machine (None: it can)."""
    global _unavailable
    if _unavailable is not False:
        return _unavailable  # type: ignore[return-value]
    reason = None
    if not os.path.exists("/dev/fuse"):
        reason = "no /dev/fuse on this machine (FUSE unavailable)"
    elif not os.access("/dev/fuse", os.R_OK | os.W_OK):
        reason = "/dev/fuse is not readable and writable by this user"
    elif os.geteuid() != 0 and shutil.which("fusermount3") is None:
        reason = "not root and no fusermount3 (Debian package fuse3) to mount FUSE"
    else:
        try:
            import mfusepy  # noqa: F401
        except ImportError as e:
            reason = f"mfusepy (test extra) or libfuse3 (Debian package libfuse3-3) missing: {e}"
        except OSError as e:
            reason = f"libfuse3 cannot be loaded (Debian package libfuse3-3): {e}"
    _unavailable = reason
    return reason


# --- the FUSE server (runs in its own process) ------------------------------------------


class Node:
    """One file or folder; ``durable*`` is what survives a power cut."""

    __slots__ = ("is_dir", "durable", "dirty_from", "entries", "durable_entries")

    def __init__(self, is_dir: bool, durable: bytes = b"") -> None:
        self.is_dir = is_dir
        self.durable = bytearray(durable)  # files: the durable contents
        self.dirty_from: int | None = None  # files: lowest offset changed since the last fsync
        self.entries: dict[str, Node] = {}  # folders: the current names
        self.durable_entries: dict[str, Node] = {}  # folders: the names a power cut keeps

    def touch(self, offset: int) -> None:
        self.dirty_from = offset if self.dirty_from is None else min(self.dirty_from, offset)


def _server_main(backing: str, mount: str, control: str) -> None:
    import logging

    import mfusepy

    # Failed operations are logged (to lazyfs.log next to the mount) with their errno.
    logging.basicConfig(level=logging.DEBUG if os.environ.get("LAZYFS_DEBUG") else logging.WARNING)

    class LazyOps(mfusepy.Operations):
        use_ns = True

        def __init__(self) -> None:
            self.root = Node(True)
            self.mutex = threading.RLock()
            self.handles: dict[int, tuple[int, Node]] = {}
            self.next_fh = 1
            self.boundaries = 0  # since the last crash_at / power_cut
            self.total_boundaries = 0
            self.crash_at: int | None = None
            self.failing_folder_fsyncs = 0  # the next N folder fsyncs fail (EIO), nothing else
            self.cut = False
            self.power_cuts = 0
            self._adopt(backing, self.root)

        # bookkeeping ---------------------------------------------------------------

        def _adopt(self, real: str, node: Node) -> None:
            """Whatever is in the backing folder at mount time counts as durable."""
            for name in os.listdir(real):
                full = os.path.join(real, name)
                st = os.lstat(full)
                if stat.S_ISDIR(st.st_mode):
                    child = Node(True)
                    self._adopt(full, child)
                else:
                    with open(full, "rb") as f:
                        child = Node(False, f.read())
                node.entries[name] = child
            node.durable_entries = dict(node.entries)

        def _real(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        def _lookup(self, path: str) -> Node:
            node = self.root
            for part in path.strip("/").split("/"):
                if part:
                    node = node.entries[part]
            return node

        def _parent(self, path: str) -> tuple[Node, str]:
            head, _, name = path.rstrip("/").rpartition("/")
            return self._lookup(head or "/"), name

        def _boundary(self) -> None:
            """One durability boundary; raises EIO once the armed cut is reached."""
            if self.cut:
                raise mfusepy.FuseOSError(errno.EIO)
            self.boundaries += 1
            self.total_boundaries += 1
            if self.crash_at is not None and self.boundaries >= self.crash_at:
                self.cut = True
                raise mfusepy.FuseOSError(errno.EIO)

        # control ---------------------------------------------------------------------

        def control(self, req: dict) -> dict:
            with self.mutex:
                op = req.get("op")
                if op == "crash_at":
                    self.crash_at = int(req["n"])
                    self.boundaries = 0
                    self.cut = False
                elif op == "fail_folder_fsyncs":
                    self.failing_folder_fsyncs = int(req["n"])
                elif op == "power_cut":
                    self._power_cut(float(req.get("writeback", 0.0)), req.get("seed"))
                elif op == "sync_all":
                    self._sync_all(self.root, "/")
                elif op != "status":
                    return {"error": f"unknown op {op!r}"}
                return {
                    "boundaries": self.boundaries,
                    "total_boundaries": self.total_boundaries,
                    "cut": self.cut,
                    "crash_at": self.crash_at,
                    "failing_folder_fsyncs": self.failing_folder_fsyncs,
                    "power_cuts": self.power_cuts,
                }

        def _sync_all(self, node: Node, path: str) -> None:
            for name, child in node.entries.items():
                full = os.path.join(path, name)
                if child.is_dir:
                    self._sync_all(child, full)
                else:
                    with open(self._real(full), "rb") as f:
                        child.durable = bytearray(f.read())
                    child.dirty_from = None
            node.durable_entries = dict(node.entries)

        def _power_cut(self, writeback: float, seed) -> None:
            if writeback > 0:
                self._write_back(self.root, backing, random.Random(seed), writeback)
            for fd, _node in self.handles.values():
                try:
                    os.close(fd)
                except OSError:
                    pass
            self.handles.clear()
            for name in os.listdir(backing):
                full = os.path.join(backing, name)
                if os.path.isdir(full) and not os.path.islink(full):
                    shutil.rmtree(full)
                else:
                    os.unlink(full)
            self._restore(self.root, backing)
            self.power_cuts += 1
            self.crash_at = None
            self.cut = False
            self.boundaries = 0

        def _write_back(self, node: Node, real: str, rng: random.Random, share: float) -> None:
            """Before the cut, some unsynced sectors happened to reach the disk.

            Each 512-byte sector changed since the file's last fsync reaches the disk
            with probability ``share``, in no order: a later sector can land
            while an earlier one does not (a hole of zeros where the file grew).
            """
            for name, child in node.entries.items():
                full = os.path.join(real, name)
                if child.is_dir:
                    self._write_back(child, full, rng, share)
                    continue
                if child.dirty_from is None:
                    continue
                with open(full, "rb") as f:
                    current = f.read()
                for start in range(child.dirty_from // SECTOR * SECTOR, len(current), SECTOR):
                    if rng.random() < share:
                        sector = current[start : start + SECTOR]
                        if len(child.durable) < start:
                            child.durable.extend(bytes(start - len(child.durable)))
                        child.durable[start : start + len(sector)] = sector

        def _restore(self, node: Node, real: str) -> None:
            node.entries = dict(node.durable_entries)
            for name, child in node.entries.items():
                full = os.path.join(real, name)
                if child.is_dir:
                    os.mkdir(full)
                    self._restore(child, full)
                else:
                    with open(full, "wb") as f:
                        f.write(child.durable)
                    child.dirty_from = None

        # file system -------------------------------------------------------------------

        def getattr(self, path, fh=None):
            if fh is not None and fh in self.handles:
                st = os.fstat(self.handles[fh][0])
            else:
                try:
                    st = os.lstat(self._real(path))
                except FileNotFoundError:
                    raise mfusepy.FuseOSError(errno.ENOENT) from None
            keys = ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size")
            out = {k: getattr(st, k) for k in keys}
            for k in ("st_atime", "st_mtime", "st_ctime"):
                out[k] = getattr(st, k + "_ns")
            return out

        def readdir(self, path, fh):
            with self.mutex:
                return [".", ".."] + list(self._lookup(path).entries)

        def access(self, path, amode):
            return 0

        def statfs(self, path):
            sv = os.statvfs(backing)
            keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree")
            keys += ("f_files", "f_flag", "f_frsize", "f_namemax")
            return {k: getattr(sv, k) for k in keys}

        def mkdir(self, path, mode):
            with self.mutex:
                parent, name = self._parent(path)
                os.mkdir(self._real(path), mode)
                parent.entries[name] = Node(True)

        def rmdir(self, path):
            with self.mutex:
                parent, name = self._parent(path)
                os.rmdir(self._real(path))
                parent.entries.pop(name, None)

        def unlink(self, path):
            with self.mutex:
                parent, name = self._parent(path)
                os.unlink(self._real(path))
                parent.entries.pop(name, None)

        def rename(self, old, new, flags=0):
            if flags:
                raise mfusepy.FuseOSError(errno.EINVAL)
            with self.mutex:
                op, oname = self._parent(old)
                np, nname = self._parent(new)
                os.rename(self._real(old), self._real(new))
                np.entries[nname] = op.entries.pop(oname)

        def link(self, target, source):
            """A hard link: one node under two names (after a power cut: two copies)."""
            with self.mutex:
                node = self._lookup(source)
                parent, name = self._parent(target)
                os.link(self._real(source), self._real(target))
                parent.entries[name] = node

        def chmod(self, path, mode):
            os.chmod(self._real(path), mode)

        def chown(self, path, uid, gid):
            os.chown(self._real(path), uid, gid)

        def utimens(self, path, times=None):
            if times is None:
                os.utime(self._real(path))
            else:
                os.utime(self._real(path), ns=times)

        def truncate(self, path, length, fh=None):
            with self.mutex:
                node = self._lookup(path)
                os.truncate(self._real(path), length)
                node.touch(length)

        def _handle(self, fd: int, node: Node) -> int:
            fh = self.next_fh
            self.next_fh += 1
            self.handles[fh] = (fd, node)
            return fh

        def create(self, path, mode, flags=os.O_RDWR):
            with self.mutex:
                parent, name = self._parent(path)
                real = self._real(path)
                existed = os.path.exists(real)
                # Read-write whatever was asked: fsync reads back what it makes durable.
                flags = (flags & ~(os.O_APPEND | os.O_ACCMODE)) | os.O_CREAT | os.O_RDWR
                fd = os.open(real, flags, mode)
                node = parent.entries.get(name) if existed else None
                if node is None:
                    node = parent.entries[name] = Node(False)
                    node.touch(0)
                elif flags & os.O_TRUNC:
                    node.touch(0)
                return self._handle(fd, node)

        def open(self, path, flags):
            with self.mutex:
                node = self._lookup(path)
                flags &= ~(os.O_APPEND | os.O_CREAT | os.O_ACCMODE)
                fd = os.open(self._real(path), flags | os.O_RDWR)
                if flags & os.O_TRUNC:
                    node.touch(0)
                return self._handle(fd, node)

        def read(self, path, size, offset, fh):
            fd, _ = self.handles[fh]
            return os.pread(fd, size, offset)

        def write(self, path, data, offset, fh):
            with self.mutex:
                fd, node = self.handles[fh]
                n = os.pwrite(fd, data, offset)
                node.touch(offset)
                return n

        def flush(self, path, fh):
            return 0

        def release(self, path, fh):
            with self.mutex:
                entry = self.handles.pop(fh, None)
                if entry is not None:
                    os.close(entry[0])
            return 0

        def fsync(self, path, datasync, fh):
            with self.mutex:
                self._boundary()
                entry = self.handles.get(fh)
                if entry is None:
                    raise mfusepy.FuseOSError(errno.EBADF)
                fd, node = entry
                if node.dirty_from is not None:
                    size = os.fstat(fd).st_size
                    start = min(node.dirty_from, size, len(node.durable))
                    node.durable[start:] = os.pread(fd, size - start, start)
                    node.dirty_from = None
                return 0

        def opendir(self, path):
            return 0

        def releasedir(self, path, fh):
            return 0

        def fsyncdir(self, path, datasync, fh):
            with self.mutex:
                if self.failing_folder_fsyncs > 0:
                    self.failing_folder_fsyncs -= 1
                    raise mfusepy.FuseOSError(errno.EIO)  # a failed fsync makes nothing durable
                self._boundary()
                node = self._lookup(path)
                node.durable_entries = dict(node.entries)
                return 0

    ops = LazyOps()
    _serve_control(control, ops)
    mfusepy.FUSE(
        ops,
        mount,
        foreground=True,
        fsname="lazyfs",
        # No kernel caching: after a power cut the kernel must not remember
        # names, sizes or pages the durable image no longer has.
        direct_io=True,
        hard_remove=True,
        entry_timeout=0,
        attr_timeout=0,
        negative_timeout=0,
        ac_attr_timeout=0,
    )


def _serve_control(path: str, ops) -> None:
    if os.path.exists(path):
        os.unlink(path)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(8)

    def handle(conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            for line in f:
                try:
                    reply = ops.control(json.loads(line))
                except Exception as e:  # reported to the test, which fails on it
                    reply = {"error": f"{type(e).__name__}: {e}"}
                f.write(json.dumps(reply).encode() + b"\n")
                f.flush()

    def accept() -> None:
        while True:
            conn, _ = srv.accept()
            threading.Thread(target=handle, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()


# --- the test side ----------------------------------------------------------------------


class LazyFS:
    """A mounted lazy file system: ``mount`` is where programs under test write."""

    def __init__(self, base: str | os.PathLike) -> None:
        base = Path(base)
        self.backing = base / "backing"
        self.mount = base / "mnt"
        self.control_path = str(base / "control.sock")
        self.proc: subprocess.Popen | None = None
        self.log_path = base / "lazyfs.log"
        self._sock: socket.socket | None = None
        self._file = None

    def start(self, timeout: float = 15.0) -> LazyFS:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, __file__, str(self.backing), str(self.mount), self.control_path],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not os.path.ismount(self.mount):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"lazyfs did not mount:\n{self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    def _request(self, **req) -> dict:
        if self._sock is None:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self._sock.connect(self.control_path)
            self._file = self._sock.makefile("rwb")
        assert self._file is not None
        self._file.write(json.dumps(req).encode() + b"\n")
        self._file.flush()
        reply = json.loads(self._file.readline())
        if "error" in reply:
            raise RuntimeError(f"lazyfs: {reply['error']}")
        return reply

    def power_cut(self, writeback: float = 0.0, seed: int | None = None) -> dict:
        """Drop everything not durable (kill the programs using the mount first).

        ``writeback`` > 0: each unsynced 512-byte sector of file data reached the disk
        anyway with that probability, in no order (names stay POSIX-minimal).
        """
        return self._request(op="power_cut", writeback=writeback, seed=seed)

    def crash_at(self, n: int) -> dict:
        """Cut at the n-th durability boundary from now (that fsync fails with EIO)."""
        return self._request(op="crash_at", n=n)

    def fail_folder_fsyncs(self, n: int) -> dict:
        """The next ``n`` fsyncs of a folder fail with EIO (file fsyncs go on working)."""
        return self._request(op="fail_folder_fsyncs", n=n)

    def sync_all(self) -> dict:
        """Make everything durable (set-up state that was on disk before the test)."""
        return self._request(op="sync_all")

    def status(self) -> dict:
        """``boundaries`` since the last arm/cut, ``cut``, ``power_cuts``, ..."""
        return self._request(op="status")

    def stop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        if self.proc is None:
            return
        if os.path.ismount(self.mount):
            cmd = ["umount", "-l", str(self.mount)]
            if os.geteuid() != 0:
                cmd = ["fusermount3", "-u", "-z", str(self.mount)]
            subprocess.run(cmd, check=False, capture_output=True)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self) -> LazyFS:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    _server_main(*sys.argv[1:4])
