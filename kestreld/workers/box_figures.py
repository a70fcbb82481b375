"""The admin port's figures for the box: every worker's, gathered by worker 0 and merged.

Worker 0 serves the admin port (``/metrics``, ``/stats.json``, the live page).  Every
other worker keeps its own figures as a lone server does (the ``stats`` counts, its
latency histograms: :class:`~kestreld.admin.http.AdminServer` without a listener) and
answers the channel's ``figures`` verb with them, as one JSON document
(:func:`worker_figures`).  Worker 0 asks every other worker over its own connection to
each channel, waits at most :data:`ANSWER_TIMEOUT`, and merges what came
(:func:`merge_figures`) into one :class:`~kestreld.admin.ostrich.AdminSnapshot`, which
every endpoint renders as it renders a lone server's:

- the server's counts are summed over the workers (:data:`SUMMED`; each worker counts
  its clients only, never the workers' channels), lines that describe one process
  (``uptime``, ``version``, the busy poll's limit) are worker 0's, and the status is
  worker 0's (it is the box's);
- a queue's figures and histograms come from its owner, the only worker that has them;
  an alias's counters are summed (every worker has the alias; its sets run on worker 0);
- the server-wide latency histograms are merged, bucket by bucket;
- ``workers`` and ``workers_answering`` say whether every worker answered (one that is
  restarting is missing from the totals until it serves again).

A worker's process figures (memory, CPU, descriptors) are not summed: ``/metrics``
labels them per worker (:class:`WorkerProcesses`), read from ``/proc`` by worker 0.

Cost: a worker builds its document on its loop, as it builds its ``stats`` reply; a
histogram travels as its non-zero buckets only, and one that counted nothing since the
previous gathering is the previous one, shared, not a new copy (the 5-second samples of
the window keep a minute of them).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
from collections.abc import Iterator
from itertools import compress
from typing import Any

import structlog
from prometheus_client import ProcessCollector
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from kestreld.admin.ostrich import AdminSnapshot, queue_limits
from kestreld.frontends.memcache.replies import server_error
from kestreld.state import ServerStatus
from kestreld.stats.collector import StatsSnapshot
from kestreld.stats.latency import FINE_BUCKETS, LatencyHistogram, LatencyHistograms
from kestreld.workers.box_stats import SUMMED as STATS_SUMMED
from kestreld.workers.channel import channel_path
from kestreld.workers.upstream import ONE, Upstream

log = structlog.get_logger("kestreld.workers")

#: Seconds worker 0 waits for the other workers' figures; one that has not answered by
#: then (restarting, or its loop busy) is left out and ``workers_answering`` says so.
ANSWER_TIMEOUT = 2.0

#: Server-wide figures that are counts: the box's is the sum over the workers.
SUMMED = STATS_SUMMED | {"busy_poll_caught", "busy_poll_ran_out", "reserved_memory_ratio"}

_REQUEST = b"figures\r\n"
_INDEXES = range(len(FINE_BUCKETS) + 1)
_HEAD = b"VALUE figures 0 "


# --- a worker's figures ---------------------------------------------------------------------


def _histogram(h: LatencyHistogram) -> list[Any]:
    """count, sum, min, max, then (bucket, count) pairs of the non-zero buckets."""
    out: list[Any] = [h.count, h.total, h.low, h.high]
    if h.count:
        counts = h.counts
        for i in compress(_INDEXES, counts):  # the scan of ~120 buckets runs in C
            out.append(i)
            out.append(counts[i])
    return out


def _unhistogram(raw: list[Any], previous: LatencyHistogram | None) -> LatencyHistogram:
    if previous is not None and previous.count == raw[0]:
        return previous  # nothing counted since: shared, as LatencyHistograms.snapshot does
    h = LatencyHistogram(FINE_BUCKETS)
    h.count, h.total, h.low, h.high = raw[0], raw[1], raw[2], raw[3]
    counts = h.counts
    for j in range(4, len(raw), 2):
        counts[raw[j]] = raw[j + 1]
    return h


def worker_figures(server: Any, latency: LatencyHistograms) -> dict[str, Any]:
    """This worker's figures as one JSON-ready document (on its loop)."""
    stats = StatsSnapshot.take(server)
    alive = {name for name, _ in stats.queues} | {name for name, _ in stats.aliases}
    latency.forget(alive)  # worker 0's sampler does this for its own; here, each gathering
    # Most queues have the same keys: sent once, and each queue's values alone (for 5,000
    # queues 0.87 MB instead of 2.1 MB, measured).
    keys = list(stats.queues[0][1]) if stats.queues else []
    # A worker's own ``stats`` lines too (the box's ``stats`` shows them, so /metrics does):
    # requests served where they landed, and sent on to their owner.
    router = server.router
    routed = [line for line in router.stats() if line[0] != "worker"] if router else []
    return {
        "pid": os.getpid(),
        "server": stats.server + routed,
        "status": stats.status.value,
        "zookeeper_connected": stats.zookeeper_connected,
        "queue_keys": keys,
        "queues": [
            [name, list(values.values()) if list(values) == keys else values]
            for name, values in stats.queues
        ],
        "aliases": stats.aliases,
        "limits": queue_limits(server.queues),
        "requests": {kind: _histogram(h) for kind, h in latency.requests.items()},
        "fsync": _histogram(latency.fsync),
        "by_queue": {
            kind: {name: _histogram(h) for name, h in by_name.items()}
            for kind, by_name in latency.queues.items()
        },
        "put_bytes": latency.put_bytes,
    }


def cmd_figures(conn: Any, args: list[bytes]) -> None:
    """The channel's ``figures``: this worker's figures, one ``VALUE`` block of JSON."""
    admin = conn.server.metrics
    if admin is None:
        conn.out.append(server_error("no admin port (metrics_port) configured"))
        return
    # Tens of thousands of small lists and dicts, none in a cycle: allocations that would
    # start collections walking every queue's objects, so the cyclic collector waits, as
    # for a stats reply (StatLinesCache.render, where they were half the CPU, profiled).
    paused = gc.isenabled()
    gc.disable()
    try:
        body = json.dumps(worker_figures(conn.server, admin.latency), separators=(",", ":"))
    finally:
        if paused:
            gc.enable()
    data = body.encode()
    conn.out.append(b"%s%d\r\n%s\r\nEND\r\n" % (_HEAD, len(data), data))


# --- the box's ------------------------------------------------------------------------------


def _add(a: object, b: object) -> object:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    try:  # the memory ratio is text ("0.123")
        return f"{float(a) + float(b):.3f}"  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return a


def merge_figures(
    figures: list[dict[str, Any] | None], previous: LatencyHistograms | None = None
) -> AdminSnapshot:
    """The box's snapshot from the workers' figures (None: a worker that did not answer),
    worker 0's first.  ``previous``: the last merged histograms, shared where unchanged."""
    answered = [f for f in figures if f is not None]
    values: dict[str, object] = {}
    for doc in answered:
        for key, value in doc["server"]:
            if key not in values:
                values[key] = value
            elif key in SUMMED:
                values[key] = _add(values[key], value)
    server = list(values.items())
    server.append(("worker", 0))  # the admin port's (a stats reply's: the client's)
    server.append(("workers", len(figures)))
    server.append(("workers_answering", len(answered)))
    queues = sorted(
        (
            (name, dict(zip(doc["queue_keys"], values, strict=True)))
            if isinstance(values, list)
            else (name, values)
            for doc in answered
            for name, values in doc["queues"]
        ),
        key=lambda entry: entry[0],
    )
    aliases: dict[str, dict[str, object]] = {}
    for doc in answered:
        for name, alias in doc["aliases"]:
            mine = aliases.get(name)
            if mine is None:
                aliases[name] = dict(alias)
            else:
                for key in ("put_items", "put_bytes"):
                    mine[key] = _add(mine.get(key, 0), alias.get(key, 0))
    first = answered[0] if answered else {}
    stats = StatsSnapshot(
        server,
        queues,
        ServerStatus(first.get("status", ServerStatus.UP.value)),
        first.get("zookeeper_connected"),
        sorted(aliases.items()),
    )
    limits: dict[str, tuple[int | None, int | None]] = {}
    for doc in answered:
        limits.update({name: (pair[0], pair[1]) for name, pair in doc["limits"].items()})
    return AdminSnapshot(stats, _merge_latency(answered, previous), limits)


def _merge_latency(
    answered: list[dict[str, Any]], previous: LatencyHistograms | None
) -> LatencyHistograms:
    box = LatencyHistograms()
    for doc in answered:
        for kind, raw in doc["requests"].items():
            box.requests[kind].merge(_unhistogram(raw, None))
        box.fsync.merge(_unhistogram(doc["fsync"], None))
        for kind, by_name in doc["by_queue"].items():
            before = previous.queues[kind] if previous is not None else {}
            merged = box.queues[kind]
            for name, raw in by_name.items():
                h = _unhistogram(raw, before.get(name))
                if name in merged:  # a queue's histograms are its owner's: not twice
                    merged[name] = merged[name].copy()
                    merged[name].merge(h)
                else:
                    merged[name] = h
        for name, nbytes in doc["put_bytes"].items():
            box.put_bytes[name] = box.put_bytes.get(name, 0) + nbytes
    box.delivered = box.queues["delivery"]
    return box


class BoxFigures:
    """Worker 0's connections to the other workers' channels, for the admin port: the
    figures it shows, and the changes it makes (``/reload``, ``/quiesce``, ``/shutdown``)
    for the whole box."""

    def __init__(self, index: int, count: int, folder: str) -> None:
        self.index = index
        self.count = count
        self.folder = folder
        self.upstreams: dict[int, Upstream] = {}
        #: Each worker's process id, as it last said (for its process figures).
        self.pids: dict[int, int] = {index: os.getpid()}
        self.previous: LatencyHistograms | None = None
        #: Each worker's last ask, answered or not.
        self.asked: dict[int, asyncio.Future[bytes | None]] = {}

    async def gather(self, server: Any, latency: LatencyHistograms) -> AdminSnapshot:
        """The box's figures: this worker's, and every other's that answers in time."""
        loop = asyncio.get_running_loop()
        waiting: dict[int, asyncio.Future[bytes | None]] = {}
        for index in range(self.count):
            if index == self.index:
                continue
            asked = self.asked.get(index)
            if asked is not None and not asked.done():
                # Still answering an earlier ask (a slow or stopped loop): that answer is
                # awaited again, not a second one queued behind it.
                waiting[index] = asked
                continue
            future: asyncio.Future[bytes | None] = loop.create_future()
            waiting[index] = self.asked[index] = future
            upstream = self._upstream(loop, index)
            if upstream is None:
                future.set_result(None)
                continue
            upstream.request(_REQUEST, ONE, lambda raw, f=future: f.done() or f.set_result(raw))
        figures: list[dict[str, Any] | None] = [None] * self.count
        if waiting:
            # Not cancelled at the timeout: the next gathering awaits what is still due.
            await asyncio.wait(waiting.values(), timeout=ANSWER_TIMEOUT)
        paused = gc.isenabled()
        gc.disable()  # as in cmd_figures: many small objects, no cycle
        try:
            figures[self.index] = worker_figures(server, latency)
            for index, future in waiting.items():
                raw = future.result() if future.done() else None
                figures[index] = self._decode(index, raw)
            # Worker 0's first: the lines that describe one process are its.
            mine = figures[self.index]
            ordered = [mine] + [f for i, f in enumerate(figures) if i != self.index]
            snapshot = merge_figures(ordered, self.previous)
        finally:
            if paused:
                gc.enable()
        self.previous = snapshot.latency
        return snapshot

    # --- the admin port's changes, for the box ----------------------------------------------

    def reload_others(self) -> None:
        """``/reload``: every other worker reloads too (this one did, and answers)."""
        self._tell_others(b"reload\r\n")

    def quiesce_others(self) -> None:
        """``/quiesce``: every other worker refuses fetches too until the box stops."""
        self._tell_others(b"status quiescent\r\n")

    def stop_box(self, reason: str) -> None:
        """``/shutdown``, ``/quiesce``: the supervisor stops every worker gracefully."""
        log.info("shutdown_requested", reason=reason)
        os.kill(os.getppid(), signal.SIGTERM)

    def _tell_others(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        for index in range(self.count):
            if index != self.index:
                upstream = self._upstream(loop, index)
                if upstream is not None:
                    upstream.request(request, ONE, _ignored)

    def _decode(self, index: int, raw: bytes | None) -> dict[str, Any] | None:
        if raw is None or not raw.startswith(_HEAD):
            if raw is not None:
                log.warning("worker_figures_refused", worker=index, reply=raw[:200].decode())
            self.pids.pop(index, None)
            return None
        start = raw.index(b"\r\n") + 2
        doc = json.loads(raw[start : raw.rindex(b"\r\nEND\r\n")])
        self.pids[index] = doc["pid"]
        return doc  # type: ignore[no-any-return]

    def _upstream(self, loop: asyncio.AbstractEventLoop, index: int) -> Upstream | None:
        upstream = self.upstreams.get(index)
        if upstream is not None and not upstream.lost:
            return upstream
        upstream = Upstream(index, channel_path(self.folder, index))
        try:
            upstream.open(loop)
        except OSError:
            self.upstreams.pop(index, None)
            return None  # restarting: its channel is not there yet
        self.upstreams[index] = upstream
        return upstream

    def close(self) -> None:
        for upstream in self.upstreams.values():
            upstream.close()
        self.upstreams.clear()


def _ignored(raw: bytes | None) -> None:
    """A change's answer: the worker logs its own outcome (config_reloaded, ...)."""


class WorkerProcesses(Collector):
    """The process figures (``process_*``) of every worker, labelled ``worker``: a sum
    would count pages the workers share since the fork twice, and a descriptor limit is
    each process's own, so they are shown per worker (``sum()`` them in a query)."""

    def __init__(self, pids: dict[int, int]) -> None:
        self.pids = dict(pids)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for index, pid in sorted(self.pids.items()):
            collector = ProcessCollector(pid=lambda p=pid: p, registry=None)
            for family in collector.collect():
                mine = families.get(family.name)
                if mine is None:
                    mine = families[family.name] = Metric(
                        family.name, family.documentation, family.type
                    )
                for sample in family.samples:
                    labels = dict(sample.labels, worker=str(index))
                    mine.add_sample(sample.name, labels, sample.value)
        yield from families.values()
