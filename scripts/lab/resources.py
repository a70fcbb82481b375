"""The bounded-resource figures of docs/operations.md.

    .venv/bin/python scripts/lab/resources.py [fds] [waiters] [flush]   # default: all three

Three runs, each on its own server: descriptors while a lagging fanout reader
walks through 1,000 segments; RSS over 96,000 timed-out polls behind one long
waiter; RSS and the progress file after a ``flush`` of 300,000 items in
read-behind with one read open.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

from kestreld.testing.process import Conn, KestreldProcess


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])


def pipeline(c, lines, expect, n, per=500):
    for i in range(0, n, per):
        k = min(per, n - i)
        c.send(lines * k)
        for _ in range(k):
            line = c.line()
            assert line == expect, line


def main(argv: list[str] | None = None) -> int:
    which = (sys.argv[1:] if argv is None else argv) or ["fds", "waiters", "flush"]
    d = tempfile.mkdtemp()
    if "fds" in which:
        srv = KestreldProcess(
            os.path.join(d, "a"),
            'max_journal_size = "4KiB"\nmax_memory_size = "16KiB"\n[queues."q+slow"]\n',
        ).start()
        c = Conn(srv.connect())
        body = "x" * 1000
        pipeline(c, f"set q 0 0 1000\r\n{body}\r\n", b"STORED", 3000)
        while c.get("q") is not None:
            pass  # the default reader keeps up
        segs = len(
            [n for n in os.listdir(srv.queue_path) if n.startswith("q.") and ".read" not in n]
        )
        base = fds(srv.pid)
        peak = base
        n = 0
        while c.get("q+slow") is not None:
            n += 1
            peak = max(peak, fds(srv.pid))
        print(
            f"fds: {segs} segments behind a lagging q+slow, {n} items read: descriptors {base} before, peak {peak} while reading"
        )
        srv.stop()
    if "waiters" in which:
        srv = KestreldProcess(os.path.join(d, "b"), "").start()
        w = Conn(srv.connect())
        w.send("get tw/t=600000\r\n")
        c = Conn(srv.connect())
        pipeline(c, "get tw/t=1\r\n", b"END", 2000)
        before = rss(srv.pid)
        t = time.time()
        pipeline(c, "get tw/t=1\r\n", b"END", 96000)
        print(
            f"waiters: 96000 timed-out polls behind one long waiter: RSS {before} -> {rss(srv.pid)} KiB ({time.time() - t:.0f} s)"
        )
        srv.stop()
    if "flush" in which:
        srv = KestreldProcess(
            os.path.join(d, "c"), 'max_memory_size = "1MiB"\ncheckpoint_interval = "1s"\n'
        ).start()
        c = Conn(srv.connect())
        c2 = Conn(srv.connect())
        pipeline(c, "set f 0 0 16\r\n0123456789abcdef\r\n", b"STORED", 300000)
        assert c2.get("f/open") is not None
        before = rss(srv.pid)
        c.send("flush f\r\n")
        assert c.line() == b"END"
        time.sleep(2.5)  # two checkpoint intervals: the progress file rewritten
        size = os.path.getsize(os.path.join(srv.queue_path, "f.read."))
        print(
            f"flush: 300000 items in read-behind, one read open: RSS {before} -> {rss(srv.pid)} KiB after flush; progress file {size} bytes"
        )
        srv.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
