"""Backlog and restart: kestreld's memory with a large queue (loaded on one pipelined
connection, so that queue order is id order), the time from spawn to the first item served
after a graceful restart, and the drain, every id once and in order."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kestreld.bench import load as bench_load
from kestreld.bench.load import Role, RoleResult
from kestreld.bench.report import Table
from kestreld.bench.servers import KestreldServer, memory, rss

MiB = 1024 * 1024
QUEUE = "backlog"


def run_backlog(
    *,
    size: int = 1024 * MiB,
    item_size: int = 1024,
    max_memory: int = 16 * MiB,
    drain_seconds: float = 180.0,
    workdir: str | None = None,
    procs: int = 2,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """The figures (MiB, seconds, items/s) and the check of one run."""
    n = size // item_size
    srv = KestreldServer(f"max_memory_size = {max_memory}\n", workdir=workdir).start()
    out: dict[str, Any] = {"backlog_mib": n * item_size / MiB, "items": n}
    out |= {"item_size": item_size, "max_memory_mib": max_memory / MiB}
    try:
        out["rss_empty_mib"] = rss(srv.pid) / MiB
        log(f"backlog: queueing {n:,} items of {item_size} B ({n * item_size / MiB:,.0f} MiB)")
        producer = Role("producer", "set", 1, n, size=item_size, depth=64, queue=QUEUE)
        loaded = bench_load.run([producer], srv.port, seconds=600, procs=procs)
        res = loaded.roles["producer"]
        if res.errors or res.items < n:
            raise RuntimeError(f"loading stored {res.items:,} of {n:,} ({res.error_samples})")
        out["load_rate"] = res.items / loaded.window()
        out["rss_loading_mib"] = memory(srv.pid)["VmHWM"] / MiB  # the peak since start
        time.sleep(2)  # a checkpoint interval: the steady state with the backlog queued
        out["rss_idle_mib"] = rss(srv.pid) / MiB
        folder = Path(srv.folder)
        out["journal_mib"] = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / MiB
        log(
            f"backlog: loaded at {out['load_rate']:,.0f} sets/s, RSS while loading "
            f"{out['rss_loading_mib']:.1f} MiB, idle {out['rss_idle_mib']:.1f} MiB"
        )
        t = time.monotonic()
        srv.process.stop(timeout=120)
        out["shutdown_s"] = time.monotonic() - t
        out["first_item_s"], out["listening_s"], data = srv.restart(QUEUE)
        loaded_events = srv.process.events("queues_loaded")
        out["queues_loaded_s"] = loaded_events[-1].get("seconds") if loaded_events else None
        out["first_item_id"] = first = int(data[: bench_load.ID_DIGITS])
        out["rss_restart_mib"] = rss(srv.pid) / MiB
        log(
            f"backlog: first item {out['first_item_s']:.3f} s after spawn (id {first}), "
            f"RSS {out['rss_restart_mib']:.1f} MiB"
        )
        drain = Role("drain", "get", 1, n, size=item_size, depth=64, queue=QUEUE)
        drain.stop_on_miss = drain.verify = drain.ordered = True
        drained = bench_load.run([drain], srv.port, seconds=drain_seconds, procs=1)
        d = drained.roles["drain"]
        out["drained"] = d.items
        out["drain_rate"] = d.items / drained.window()
        out["drain_seconds"] = drained.window()
        out["rss_drain_mib"] = memory(srv.pid)["VmHWM"] / MiB  # start-up and drain
        out["check"] = _check(d, first, n)
        stages = ("loading", "idle", "restart", "drain")
        out["rss_max_mib"] = max(out[f"rss_{stage}_mib"] for stage in stages)
        log(
            f"backlog: drained {d.items:,} at {out['drain_rate']:,.0f} gets/s, RSS "
            f"{out['rss_drain_mib']:.1f} MiB at the most, {out['check']}"
        )
    finally:
        srv.stop()
    return out


def _check(d: RoleResult, first: int, n: int) -> str:
    """Every id once, in order: the restart's first item id 0, the drain the rest."""
    assert d.ids is not None
    ids = bytearray(d.ids)
    if 0 <= first < n:
        ids[first] += 1
    complete = d.items == n - 1
    missing, dup = ids.count(0), len(ids) - ids.count(0) - ids.count(1)
    if d.errors:
        return f"FAILED: {d.errors} errors: {d.error_samples}"
    if dup or (complete and missing):
        return f"FAILED: {missing} missing, {dup} duplicated"
    if first != 0:
        return f"FAILED: first item was id {first}, not 0"
    return "exactly once, in order" if complete else "at most once (drain time cap)"


def backlog_table(b: dict[str, Any]) -> Table:
    def mib(k: str) -> str:
        return f"{b[k]:.1f} MiB" if b.get(k) is not None else "-"

    def sec(k: str) -> str:
        return f"{b[k]:.3f} s" if b.get(k) is not None else "-"

    backlog = f"{b['items']:,} items x {b['item_size']} B = {b['backlog_mib']:,.0f} MiB"
    drain = f"{b['drained']:,} items at {b['drain_rate']:,.0f} gets/s in {b['drain_seconds']:.1f} s"
    rows = [
        ("backlog", f"{backlog}, max_memory_size {b['max_memory_mib']:.0f} MiB"),
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
            "RSS after restart / peak of the restarted process (drain included)",
            f"{mib('rss_restart_mib')} / {mib('rss_drain_mib')}",
        ),
        ("drain (1 conn, depth 64)", drain),
        ("check", b["check"]),
    ]
    return Table(("backlog", "figure"), [list(r) for r in rows])
