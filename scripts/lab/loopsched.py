"""What the event loop's thread does during a long loop iteration of the fairness flood.

    python scripts/lab/loopsched.py [--seconds 3] [--record 2] [--pin] [--config '...']
                                    [--keep PERF.DATA] [--holds FILE]

Runs scripts/lab/fairness.py's three clients (8 MiB flood, 64 B sets, ``version`` probe)
against a fresh server, and for ``--record`` seconds in the middle of the flood records the
kernel's scheduler and system-call events of the whole machine (``perf record -a`` of
``sched:sched_switch``, ``sched:sched_wakeup``, ``raw_syscalls:*``; needs root).  Then it
cuts the loop thread's time into iterations (from one return of ``epoll_wait`` to the next
call of it: what a request arriving meanwhile waits for) and splits each iteration into:

- ``cpu``: on a CPU (its own work, its system calls' work);
- ``runq``: runnable without a CPU (preempted, or woken and not yet running): the
  machine's, which the server's probe (kestreld/loop/hold.py) subtracts;
- ``sleep``: asleep (until woken), by the system call it slept in (``futex``: the
  interpreter lock), which the probe counts.

For iterations whose ``cpu + sleep`` (what the probe counts) exceeds 1 ms it prints a cause
(reading >= 1 MiB in one iteration; waiting for the lock while another server thread that
needed a CPU held it or was to take it; one slow system call), the split, the system calls
over 0.2 ms, who woke each futex sleep and how long that thread itself waited for a CPU
meanwhile.  ``--pin``: the server on CPU 0, the clients and perf on CPU 1.  perf's start
and stop stall the machine: the first and last 0.1 s are left out.

``--holds FILE``: the probe's own holds over 2 ms, side by side with the trace (perf on
CLOCK_MONOTONIC).  Needs a probe patched to log them (not in the product): in
``HoldProbe._held``, before the subtraction, ``os.write(fd, b"%.6f %.6f %.6f\\n" % (now,
longest, waited - self._waited))`` when ``longest > 0.002``, ``fd`` opened from the
environment's ``LAB_HOLD_LOG``, which this script sets.

Also prints the loop thread's involuntary context switches during the recording and the
server's own ``loop_hold_max_us`` / share over 1 ms at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fairness import _loop_holds, flood, probe, small  # noqa: E402

from kestreld.testing.process import KestreldProcess  # noqa: E402

EPOLL = {232, 281, 441}  # epoll_wait, epoll_pwait, epoll_pwait2 (x86_64)
NAMES = {
    0: "read", 1: "write", 3: "close", 7: "poll", 9: "mmap", 11: "munmap", 17: "pread64",
    18: "pwrite64", 19: "readv", 20: "writev", 44: "sendto", 45: "recvfrom", 202: "futex",
    232: "epoll_wait", 233: "epoll_ctl", 257: "openat", 281: "epoll_pwait", 74: "fsync",
    75: "fdatasync", 5: "fstat", 8: "lseek", 28: "madvise", 441: "epoll_pwait2",
}  # fmt: skip
LINE = re.compile(r"^\s*(?P<comm>.+?)\s+(?P<tid>\d+)\s+\[(?P<cpu>\d+)\]\s+(?P<t>[\d.]+):\s+"
                  r"(?P<event>[\w:]+):\s*(?P<rest>.*)$")  # fmt: skip


def _name(nr: int) -> str:
    return NAMES.get(nr, str(nr))


@dataclass(slots=True)
class Iteration:
    start: float
    end: float = 0.0
    cpu: float = 0.0
    runq: float = 0.0
    sleep: Counter = field(default_factory=Counter)  # syscall -> seconds asleep in it
    calls: list = field(default_factory=list)  # (syscall, seconds) over 0.2 ms
    wakers: list = field(default_factory=list)  # (waker comm, its runq during the sleep)
    syscalls: Counter = field(default_factory=Counter)  # name -> calls
    read: int = 0  # bytes the loop's read calls returned
    timeouts: int = 0  # futex calls that returned ETIMEDOUT (the lock's 5 ms interval)

    @property
    def counted(self) -> float:
        return self.cpu + sum(self.sleep.values())


def _ctxt(pid: int, tid: int) -> tuple[int, int]:
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    get = dict(line.split(":\t") for line in status.splitlines() if ":\t" in line)
    return int(get["voluntary_ctxt_switches"]), int(get["nonvoluntary_ctxt_switches"])


def analyse(script: str, loop_tid: int, server_tids: set[int]) -> list[Iteration]:
    """The loop thread's iterations, from ``perf script`` text."""
    iterations: list[Iteration] = []
    cur: Iteration | None = None
    on_cpu_since: float | None = None  # loop thread on a CPU since
    off_since = 0.0
    off_state = ""
    in_call: int | None = None
    call_at = 0.0
    # every server thread: runnable-without-CPU intervals (for the GIL holder's preemption)
    off_r: dict[int, float] = {}
    runq_spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    last_waker: tuple[str, int] | None = None
    woken_at: float | None = None
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        t = float(m["t"])
        event, rest, tid = m["event"], m["rest"], int(m["tid"])
        if event == "sched:sched_switch":
            prev = int(re.search(r"prev_pid=(\d+)", rest)[1])
            state = re.search(r"prev_state=(\S+)", rest)[1]
            nxt = int(re.search(r"next_pid=(\d+)", rest)[1])
            if prev in server_tids and state.startswith("R"):
                off_r[prev] = t
            if nxt in server_tids and nxt in off_r:
                runq_spans[nxt].append((off_r.pop(nxt), t))
            if prev == loop_tid:
                if cur is not None and on_cpu_since is not None:
                    cur.cpu += t - on_cpu_since
                on_cpu_since = None
                off_since, off_state = t, state
            if nxt == loop_tid:
                if cur is not None:
                    if off_state.startswith("R"):
                        cur.runq += t - off_since
                    else:
                        # asleep until woken, then runnable until it got a CPU
                        woke = woken_at if woken_at is not None else t
                        call = _name(in_call) if in_call is not None else "?"
                        cur.sleep[call] += woke - off_since
                        cur.runq += t - woke
                        if last_waker is not None and call == "futex":
                            cur.wakers.append((last_waker, off_since, woke))
                last_waker = woken_at = None
                on_cpu_since = t
        elif event == "sched:sched_wakeup":
            woken = int(re.search(r" pid=(\d+)", " " + rest)[1])
            if woken in server_tids and woken != loop_tid:
                off_r.setdefault(woken, t)  # runnable from now until switched in
            if woken == loop_tid:
                who = "server" if tid in server_tids else m["comm"].strip()
                last_waker = (f"{who}:{tid}", tid)
                woken_at = t
        elif tid == loop_tid and event == "raw_syscalls:sys_enter":
            nr = int(re.search(r"NR (\d+)", rest)[1])
            in_call, call_at = nr, t
            if nr in EPOLL and cur is not None:
                if on_cpu_since is not None:
                    cur.cpu += t - on_cpu_since
                    on_cpu_since = t
                cur.end = t
                iterations.append(cur)
                cur = None
        elif tid == loop_tid and event == "raw_syscalls:sys_exit":
            nr = int(re.search(r"NR (\d+)", rest)[1])
            if nr in EPOLL:
                cur = Iteration(start=t)
                on_cpu_since = t
            if nr == 202 and cur is not None and rest.rstrip().endswith("= -110"):
                cur.timeouts += 1
            if cur is not None and nr not in EPOLL:
                cur.syscalls[_name(nr)] += 1
                if nr == 0 and not rest.rstrip().endswith("= -11"):
                    cur.read += max(0, int(rest.rsplit("=", 1)[1]))
            if nr not in EPOLL and cur is not None and t - call_at > 0.0002:
                cur.calls.append((_name(nr), t - call_at))
            in_call = None
    # perf's start and stop stall the machine (tracepoints switched on and off): leave out
    # the first and last 0.1 s
    times = [float(m["t"]) for m in map(LINE.match, (script[:4000].splitlines()[1:2]
             + script[-4000:].splitlines()[-1:])) if m]  # fmt: skip
    if len(times) == 2:
        iterations = [i for i in iterations if times[0] + 0.1 < i.start and i.end < times[1] - 0.1]
    # the waker's own wait for a CPU while the loop slept on the lock
    for it in iterations:
        resolved = []
        for (comm, waker), a, b in it.wakers:

            def waited(tid: int, a: float = a, b: float = b) -> float:
                return sum(max(0.0, min(b, y) - max(a, x)) for x, y in runq_spans.get(tid, ()))

            if waker not in server_tids:
                # woken by a timer (the lock's 5 ms wait ran out): the holder is the server
                # thread that waited longest for a CPU meanwhile, if any did
                waker = max(server_tids - {loop_tid}, key=waited, default=waker)
                comm = f"timeout, holder? server:{waker}"
            resolved.append((comm, b - a, waited(waker)))
        it.wakers = resolved
    return iterations


def _kind(it: Iteration) -> str:
    """The main reason an iteration counted over 1 ms."""
    slept = sum(it.sleep.values())
    if slept > it.cpu:
        if it.sleep["futex"] >= slept / 2:
            waited = sum(w for _, _, w in it.wakers)
            if waited <= slept / 2:
                return "lock wait"
            if any(c.startswith("timeout") for c, _, _ in it.wakers):
                return "lock holder preempted (waiting for a CPU)"
            return "lock hand-off, taker waiting for a CPU"
        return "sleep in " + it.sleep.most_common(1)[0][0]
    if it.read >= 1 << 20:
        return "reading >= 1 MiB in one iteration"
    if any(t > it.cpu / 2 for _, t in it.calls):
        return "one slow system call"
    return "other cpu"


def report(iterations: list[Iteration], seconds: float) -> None:
    long = [it for it in iterations if it.counted > 0.001]
    total = sum(it.end - it.start for it in iterations)
    print(f"iterations {len(iterations):,} in {seconds:.1f} s, loop busy {total / seconds:.0%}; "
          f"counted (cpu + sleep) over 1 ms: {len(long)}")  # fmt: skip
    agg = Counter()
    for it in long:
        agg["cpu"] += it.cpu
        agg["runq"] += it.runq
        for k, v in it.sleep.items():
            agg["sleep " + k] += v
    whole = sum(agg.values()) or 1
    print(
        "  over-1-ms iterations, time by kind: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms ({v / whole:.0%})" for k, v in agg.most_common())
    )
    allsleep = Counter()
    for it in iterations:
        for k, v in it.sleep.items():
            allsleep[k] += v
    print("  all iterations: cpu {:.0f} ms, runq {:.0f} ms, sleep {}".format(
        sum(i.cpu for i in iterations) * 1e3, sum(i.runq for i in iterations) * 1e3,
        ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in allsleep.most_common())))  # fmt: skip
    kinds = Counter(_kind(it) for it in long)
    worst: dict[str, float] = {}
    for it in long:
        worst[_kind(it)] = max(worst.get(_kind(it), 0.0), it.counted)
    print("  over-1-ms iterations by cause (count, longest counted): "
          + ", ".join(f"{k} {n} ({worst[k] * 1e3:.1f} ms)" for k, n in kinds.most_common()))  # fmt: skip
    for it in sorted(long, key=lambda i: -i.counted)[:25]:
        sleeps = " ".join(f"{k}={v * 1e3:.2f}" for k, v in it.sleep.most_common())
        calls = " ".join(f"{k}={v * 1e3:.2f}" for k, v in sorted(it.calls, key=lambda c: -c[1])[:5])
        wakers = " ".join(f"{c}(slept {s * 1e3:.2f}, its runq {w * 1e3:.2f})"
                          for c, s, w in sorted(it.wakers, key=lambda x: -x[1])[:3])  # fmt: skip
        print(
            f"  {it.start:.4f} wall {(it.end - it.start) * 1e3:6.2f} counted "
            f"{it.counted * 1e3:5.2f}: cpu {it.cpu * 1e3:5.2f} runq {it.runq * 1e3:5.2f} "
            f"sleep[{sleeps}] long calls[{calls}] futex wakers[{wakers}] "
            f"read {it.read / 1024:.0f} KiB, calls {dict(it.syscalls.most_common(4))}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--record", type=float, default=2.0)
    parser.add_argument("--config", default="")
    parser.add_argument("--pin", action="store_true")
    parser.add_argument("--keep", help="keep perf's data file here")
    parser.add_argument("--holds", help="a file where a patched probe logged its holds over "
                        "2 ms (LAB_HOLD_LOG: 'read-at raw-lateness runq-wait', monotonic)")  # fmt: skip
    args = parser.parse_args()
    if args.pin:
        os.sched_setaffinity(0, {1})
    with tempfile.TemporaryDirectory(prefix="kestreld-loopsched-") as tmp:
        if args.holds:
            os.environ["LAB_HOLD_LOG"] = args.holds
        server = KestreldProcess(Path(tmp) / "queues", args.config)
        server.start()
        try:
            pid = server.proc.pid
            if args.pin:
                subprocess.run(["taskset", "-a", "-p", "-c", "0", str(pid)], check=True,
                               stdout=subprocess.DEVNULL)  # fmt: skip
            counter = multiprocessing.Value("q", 0)
            out: multiprocessing.Queue = multiprocessing.Queue()
            probed: multiprocessing.Queue = multiprocessing.Queue()
            start_at = time.monotonic() + 1.0
            stop_at = start_at + args.seconds
            procs = [
                multiprocessing.Process(target=flood, args=(server.port, "db_bench",
                                        8 << 20, False, stop_at, counter)),
                multiprocessing.Process(target=small, args=(server.port, "db_bench", 64,
                                        start_at, stop_at, out)),
                multiprocessing.Process(target=probe, args=(server.port, start_at, stop_at,
                                        probed)),
            ]  # fmt: skip
            for p in procs:
                p.start()
            time.sleep(max(0.0, start_at - time.monotonic() + (args.seconds - args.record) / 2))
            tids = {int(t) for t in os.listdir(f"/proc/{pid}/task")}
            data = args.keep or str(Path(tmp) / "perf.data")
            before = _ctxt(pid, pid)
            subprocess.run(
                ["perf", "record", "-q", "-a", "-k", "CLOCK_MONOTONIC", "-o", data, "-e", "sched:sched_switch",
                 "-e", "sched:sched_wakeup", "-e", "raw_syscalls:sys_enter",
                 "-e", "raw_syscalls:sys_exit", "--", "sleep", str(args.record)],
                check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            after = _ctxt(pid, pid)
            tids |= {int(t) for t in os.listdir(f"/proc/{pid}/task")}  # pools start lazily
            spy = Path(sys.executable).with_name("py-spy")
            dump = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                                  text=True).stdout  # fmt: skip
            latencies = out.get()
            worst = probed.get()
            for p in procs:
                p.join()
            held = _loop_holds(server.port)
        finally:
            server.stop()
        text = subprocess.run(
            ["perf", "script", "-i", data, "-F", "comm,tid,cpu,time,event,trace"],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
    threads = re.findall(r'^Thread (\S+) \((\w+)\): "([^"]+)"', dump, re.M)
    print("threads (py-spy dump):", ", ".join(" ".join(t) for t in threads), f"loop {pid}")
    print(f"small sets/s {len(latencies) / args.seconds:,.0f}, version probe worst "
          f"{worst * 1e3:.2f} ms, {held}")  # fmt: skip
    print(f"loop thread context switches while recording: voluntary {after[0] - before[0]:,}, "
          f"involuntary {after[1] - before[1]:,}")  # fmt: skip
    iterations = analyse(text, pid, tids)
    report(iterations, args.record - 0.2)
    if args.holds:
        first, last = iterations[0].start, iterations[-1].end
        for line in Path(args.holds).read_text().splitlines():
            at, raw, runq = map(float, line.split())
            if not first <= at - raw and at <= last:
                continue
            seen = [i for i in iterations if i.end > at - raw and i.start < at]
            cpu = sum(i.cpu for i in seen)
            sleep = sum(sum(i.sleep.values()) for i in seen)
            print(f"  probe hold at {at:.4f}: raw {raw * 1e3:.2f} ms, its runq {runq * 1e3:.2f}, "
                  f"counted {(raw - runq) * 1e3:.2f}; trace: {len(seen)} iterations, "
                  f"cpu {cpu * 1e3:.2f} sleep {sleep * 1e3:.2f} runq "
                  f"{sum(i.runq for i in seen) * 1e3:.2f}, gaps "
                  f"{(raw - sum(i.end - i.start for i in seen)) * 1e3:.2f}, causes "
                  f"{sorted({_kind(i) for i in seen if i.counted > 0.001})}")  # fmt: skip


if __name__ == "__main__":
    main()
