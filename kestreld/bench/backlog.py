"""Backlog and restart: memory with a large queue, time to the first item after a restart,
and the drain rate.

1. Start kestreld with ``max_memory_size`` small (16 MiB) and queue ``size`` bytes
   of items through one pipelined connection (so that queue order is id order),
   sampling RSS all along.
2. Stop it gracefully (SIGTERM) and start it again on the same folder; from the
   moment the process is spawned, a client polls the port and sends
   ``get backlog`` as soon as it connects: the time to that item's reply is the
   restart figure (interpreter start-up, imports and queue loading included).
3. Drain the rest on one pipelined connection (depth 64), checking that every
   id arrives exactly once and in order (id 0 first, to the restart probe).
"""

from __future__ import annotations

import os
import socket
import threading
import time

from kestreld.bench import load as bench_load
from kestreld.bench.load import Role
from kestreld.bench.servers import KestreldServer, RssSampler, memory

MiB = 1024 * 1024
QUEUE = "backlog"


def _folder_bytes(folder: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for f in files:
            try:
                total += os.path.getsize(os.path.join(dirpath, f))
            except OSError:
                pass
    return total


def _first_item(port: int, deadline: float) -> tuple[float, bytes]:
    """Poll the port until it accepts, get one item; (monotonic time of the reply, data)."""
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError("the restarted server never accepted a connection") from None
            time.sleep(0.002)
    with sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(f"get {QUEUE}\r\n".encode())
        buf = b""
        while True:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise RuntimeError(f"connection closed after {buf[:80]!r}")
            buf += chunk
            if buf == b"END\r\n":
                raise RuntimeError("the restarted server answered END: the backlog is gone")
            if buf.startswith(b"VALUE ") and buf.endswith(b"\r\nEND\r\n"):
                header, _, rest = buf.partition(b"\r\n")
                size = int(header.split()[3])
                if len(rest) >= size + 7:
                    return time.monotonic(), rest[:size]


def run_backlog(
    *,
    size: int = 1024 * MiB,
    item_size: int = 1024,
    max_memory: int = 16 * MiB,
    drain_seconds: float = 180.0,
    load_seconds: float = 600.0,
    workdir: str | None = None,
    procs: int = 2,
    log=print,
) -> dict:
    n = size // item_size
    srv = KestreldServer(f"max_memory_size = {max_memory}\n", workdir=workdir)
    sampler = RssSampler()
    sampler.start()
    out: dict = {
        "backlog_mib": n * item_size / MiB,
        "items": n,
        "item_size": item_size,
        "max_memory_mib": max_memory / MiB,
    }
    try:
        srv.start()
        sampler.pid = srv.pid
        out["rss_empty_mib"] = memory(srv.pid)["VmRSS"] / MiB
        log(f"backlog: queueing {n:,} items of {item_size} B ({n * item_size / MiB:,.0f} MiB)")
        producer = Role("producer", "set", 1, n, size=item_size, depth=64, queue=QUEUE)
        loaded = bench_load.run([producer], srv.port, seconds=load_seconds, procs=procs)
        res = loaded.roles["producer"]
        if res.errors or res.items < n:
            raise RuntimeError(f"loading stored {res.items:,} of {n:,} ({res.error_samples})")
        out["load_rate"] = res.items / loaded.window()
        out["rss_loading_mib"] = sampler.take() / MiB
        time.sleep(2)  # a checkpoint interval: the steady state with the backlog queued
        out["rss_idle_mib"] = memory(srv.pid)["VmRSS"] / MiB
        out["journal_mib"] = _folder_bytes(srv.folder) / MiB
        log(
            f"backlog: loaded at {out['load_rate']:,.0f} sets/s, RSS while loading "
            f"{out['rss_loading_mib']:.1f} MiB, idle {out['rss_idle_mib']:.1f} MiB"
        )

        t = time.monotonic()
        srv.process.stop(timeout=120)
        out["shutdown_s"] = time.monotonic() - t
        sampler.pid = 0

        # Restart on the same folder and port; the clock starts before the process exists.
        proc = srv.process
        errors: list[BaseException] = []
        listening_at: list[float] = []

        def start() -> None:
            try:
                proc.start(timeout=120)
                listening_at.append(time.monotonic())
            except BaseException as e:  # reported below
                errors.append(e)

        proc.proc = None  # the old, exited process: wait for the new one below
        t0 = time.monotonic()
        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        while proc.proc is None:
            if errors or time.monotonic() > t0 + 120:
                raise errors[0] if errors else RuntimeError("kestreld did not spawn")
            time.sleep(0.001)
        sampler.pid = proc.proc.pid
        first_at, data = _first_item(proc.port, t0 + 120)
        starter.join(130)
        if errors:
            raise errors[0]
        out["first_item_s"] = first_at - t0
        out["listening_s"] = (listening_at[0] - t0) if listening_at else None
        loaded_events = proc.events("queues_loaded")
        out["queues_loaded_s"] = loaded_events[-1].get("seconds") if loaded_events else None
        out["first_item_id"] = int(data[: bench_load.ID_DIGITS])
        out["rss_restart_mib"] = memory(proc.pid)["VmRSS"] / MiB
        log(
            f"backlog: first item {out['first_item_s']:.3f} s after spawn "
            f"(id {out['first_item_id']}), RSS {out['rss_restart_mib']:.1f} MiB"
        )

        sampler.take()
        drain = Role(
            "drain",
            "get",
            1,
            n,
            size=item_size,
            depth=64,
            queue=QUEUE,
            stop_on_miss=True,
            verify=True,
            ordered=True,
        )
        drained = bench_load.run([drain], proc.port, seconds=drain_seconds, procs=1)
        d = drained.roles["drain"]
        out["drained"] = d.items
        out["drain_rate"] = d.items / drained.window()
        out["drain_seconds"] = drained.window()
        out["rss_drain_mib"] = sampler.take() / MiB
        out["rss_peak_restart_mib"] = memory(proc.pid)["VmHWM"] / MiB
        assert d.ids is not None
        ids = bytearray(d.ids)
        if 0 <= out["first_item_id"] < n:
            ids[out["first_item_id"]] += 1
        complete = d.items == n - 1
        missing, dup = ids.count(0), len(ids) - ids.count(0) - ids.count(1)
        if d.errors:
            out["check"] = f"FAILED: {d.errors} errors: {d.error_samples}"
        elif dup or (complete and missing):
            out["check"] = f"FAILED: {missing} missing, {dup} duplicated"
        elif out["first_item_id"] != 0:
            out["check"] = f"FAILED: first item was id {out['first_item_id']}, not 0"
        else:
            out["check"] = "exactly once, in order" if complete else "at most once (drain time cap)"
        out["rss_max_mib"] = max(
            out["rss_loading_mib"],
            out["rss_idle_mib"],
            out["rss_restart_mib"],
            out["rss_drain_mib"],
            out["rss_peak_restart_mib"],
        )
        log(
            f"backlog: drained {d.items:,} at {out['drain_rate']:,.0f} gets/s, RSS "
            f"{out['rss_drain_mib']:.1f} MiB, {out['check']}"
        )
    finally:
        sampler.stop()
        srv.stop()
    return out


def backlog_lines(b: dict) -> list[tuple[str, str]]:
    def mib(k: str) -> str:
        return f"{b[k]:.1f} MiB" if b.get(k) is not None else "-"

    def sec(k: str) -> str:
        return f"{b[k]:.3f} s" if b.get(k) is not None else "-"

    return [
        (
            "backlog",
            f"{b['items']:,} items x {b['item_size']} B = {b['backlog_mib']:,.0f} MiB, "
            f"max_memory_size {b['max_memory_mib']:.0f} MiB",
        ),
        ("journal on disk", mib("journal_mib")),
        (
            "RSS empty / peak while loading / idle loaded",
            f"{mib('rss_empty_mib')} / {mib('rss_loading_mib')} / {mib('rss_idle_mib')}",
        ),
        ("loading rate (1 conn, depth 64)", f"{b['load_rate']:,.0f} sets/s"),
        ("graceful shutdown", sec("shutdown_s")),
        ("restart: spawn -> listening", sec("listening_s")),
        ("restart: queues_loaded (server's own figure)", sec("queues_loaded_s")),
        ("restart: spawn -> first item served", sec("first_item_s")),
        (
            "RSS after restart / while draining / peak of restarted process",
            f"{mib('rss_restart_mib')} / {mib('rss_drain_mib')} / {mib('rss_peak_restart_mib')}",
        ),
        (
            "drain (1 conn, depth 64)",
            f"{b['drained']:,} items at {b['drain_rate']:,.0f} gets/s in {b['drain_seconds']:.1f} s",
        ),
        ("check", b["check"]),
    ]
