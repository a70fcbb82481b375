"""What idle queues cost: the many-queues table of docs/operations.md.

    .venv/bin/python scripts/lab/idle_queues.py [N ...] [--nofile LIMIT]   # default: 1000 10000

For each N, on its own server: N queues get 10 items of 100 B each, then the
server idles.  Printed: resident memory, open descriptors, CPU while idle (from
/proc/PID/stat over 5 s), one ``stats`` (time and size), a graceful stop
(SIGTERM to exit) and a restart to the first item served.  ``--nofile`` starts
the server under that open-file limit (soft and hard, with prlimit).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

from kestreld.testing.process import Conn, KestreldProcess

TICKS = os.sysconf("SC_CLK_TCK")


class LimitedProcess(KestreldProcess):
    """A server started under an open-file limit (soft = hard = ``nofile``)."""

    def __init__(self, *args, nofile: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.nofile = nofile

    def command(self) -> list[str]:
        cmd = super().command()
        if self.nofile is None:
            return cmd
        return ["prlimit", f"--nofile={self.nofile}:{self.nofile}", "--", *cmd]


def fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss_mib(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_seconds(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


def fill(c: Conn, n: int) -> None:
    body = "x" * 100
    batch = 200
    for start in range(0, n, batch):
        names = range(start, min(n, start + batch))
        c.send("".join(f"set q{i} 0 0 100\r\n{body}\r\n" * 10 for i in names))
        for _ in range(len(names) * 10):
            line = c.line()
            assert line == b"STORED", line


def stats_reply(c: Conn) -> tuple[float, int]:
    """(ms, bytes) of one ``stats`` reply, read whole (not line by line: megabytes)."""
    started = time.perf_counter()
    c.send("stats\r\n")
    data = bytearray()
    while not data.endswith(b"\r\nEND\r\n"):
        chunk = c.sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError("server closed the connection")
        data += chunk
    return (time.perf_counter() - started) * 1000, len(data)


def settle(srv: KestreldProcess, n: int) -> None:
    """Wait for the new queues' first progress files (written and fsynced off the loop)."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        names = os.listdir(srv.queue_path)
        if sum(1 for name in names if ".read." in name and "~~" not in name) >= n:
            break
        time.sleep(0.5)
    time.sleep(2)


def measure(n: int, nofile: int | None) -> dict[str, str]:
    folder = tempfile.mkdtemp(prefix="kestreld-idle-")
    try:
        srv = LimitedProcess(os.path.join(folder, "q"), nofile=nofile).start(timeout=120)
        c = Conn(srv.connect(timeout=60))
        fill(c, n)
        pid = srv.pid
        settle(srv, n)
        before = cpu_seconds(pid)
        t0 = time.monotonic()
        time.sleep(5)
        idle = (cpu_seconds(pid) - before) / (time.monotonic() - t0) * 100
        stats_ms, size = min(stats_reply(c) for _ in range(3))
        row = {
            "queues": f"{n:,}",
            "RSS": f"{rss_mib(pid):.0f} MiB",
            "open descriptors": f"{fds(pid):,}",
            "CPU while idle": f"{idle:.1f} %",
            "stats": f"{stats_ms:.0f} ms ({size / 1e6:.1f} MB)",
        }
        c.close()
        t0 = time.perf_counter()
        srv.stop(timeout=60)
        row["graceful stop"] = f"{time.perf_counter() - t0:.2f} s"
        t0 = time.perf_counter()
        srv.start(timeout=120)
        c = Conn(srv.connect(timeout=60))
        assert c.get(f"q{n - 1}") == b"x" * 100
        row["restart to first item"] = f"{time.perf_counter() - t0:.2f} s"
        errors = [e for e in srv.events("checkpoint_failed")] + [
            line for line in srv.log_lines if '"level": "error"' in line
        ]
        row["errors logged"] = str(len(errors))
        c.close()
        srv.stop(timeout=60)
        return row
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str]) -> int:
    nofile = None
    if "--nofile" in argv:
        i = argv.index("--nofile")
        nofile = int(argv[i + 1])
        del argv[i : i + 2]
    sizes = [int(a) for a in argv] or [1000, 10000]
    rows = [measure(n, nofile) for n in sizes]
    keys = list(rows[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(row[k] for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
