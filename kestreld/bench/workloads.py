"""The workloads: what each means for kestreld, memcached and Darner (:func:`plan`), and one
measured run against a fresh server (:func:`measure`)."""

from __future__ import annotations

import dataclasses
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kestreld.bench import load as bench_load
from kestreld.bench.load import Role
from kestreld.bench.servers import (
    MachineSample,
    cpu_seconds,
    pin,
    start_server,
    tree_cpu_seconds,
    tree_rss,
)
from kestreld.testing.process import Conn

WORKLOADS = ("put-many", "get-drain", "flood", "leaky-reader", "fanout", "many-clients")
MiB = 1024 * 1024


@dataclass(slots=True)
class Spec:
    workload: str
    size: int = 1024
    connections: int = 10  # put-many, get-drain: connections; flood, leaky, many-clients: consumers
    producers: int = 1  # flood, leaky-reader, fanout, many-clients
    depth: int = 1  # requests in flight per connection (pipelining)
    items: int = 100_000  # upper bound on the work
    seconds: float = 5.0  # upper bound on the time
    reliable: bool = False  # flood, get-drain: get q/close/open instead of plain get
    readers: int = 3  # fanout
    sync_journal: int | None = None
    wait_ms: int = 100  # consumers' get /t=
    abort_rate: float = 0.02  # leaky-reader
    drop_rate: float = 0.01  # leaky-reader
    rate: float = 0.0  # many-clients: producer items/s (0 = unthrottled)
    procs: int = 2  # load generator processes (at least one per role)
    # kestreld servers, each its own port and folder; connections spread over them
    instances: int = 1
    # put-many, get-drain: > 1: connection i uses queue bench<i mod queues> (and with
    # instances, the instance that queue hashes to)
    queues: int = 1
    workers: int = 1  # kestreld's workers (one port, one folder)
    handoff: bool = True  # workers > 1: worker_handoff (false: every foreign request forwarded)
    # put-many: > 1: connection i alternates its sets over queues i .. i + spread - 1 (mod
    # queues), so a connection uses queues of several workers
    spread: int = 1

    @property
    def key(self) -> str:
        """A short stable name for the row, e.g. ``set-1k-c100-d1``."""
        size = f"{self.size // 1024}k" if self.size % 1024 == 0 else f"{self.size}b"
        name = {
            "put-many": "set",
            "get-drain": "reliable-get" if self.reliable else "get",
            "flood": "reliable" if self.reliable else "flood",
        }.get(self.workload, self.workload)
        if self.sync_journal is not None:
            name += f"-sync{self.sync_journal}"
        conns = f"c{self.connections}"
        if self.workload in ("flood", "leaky-reader", "many-clients"):
            conns = f"p{self.producers}{conns}"
        elif self.workload == "fanout":
            conns = f"p{self.producers}r{self.readers}"
        many = f"-q{self.queues}" if self.queues > 1 else ""
        many += f"-i{self.instances}" if self.instances > 1 else ""
        many += f"-w{self.workers}" if self.workers > 1 else ""
        many += f"-s{self.spread}" if self.spread > 1 else ""
        many += "-nohandoff" if not self.handoff else ""
        return f"{name}-{size}-{conns}-d{self.depth}{many}"

    def describe(self) -> str:
        text = self._describe()
        text += f", {self.queues} queues" if self.queues > 1 else ""
        text += f" ({self.spread} a connection)" if self.spread > 1 else ""
        text += f", {self.instances} instances" if self.instances > 1 else ""
        text += f", workers = {self.workers}" if self.workers > 1 else ""
        return text + (", no hand-off" if not self.handoff else "")

    def _describe(self) -> str:
        size = f"{self.size // 1024} KiB" if self.size % 1024 == 0 else f"{self.size} B"
        depth = f", depth {self.depth}" if self.depth > 1 else ""
        if self.workload == "put-many":
            sync = f", sync_journal={self.sync_journal}" if self.sync_journal is not None else ""
            return f"set {size}, {self.connections} conn{depth}{sync}"
        if self.workload == "get-drain":
            get = "reliable get (get q/close/open)" if self.reliable else "get"
            return f"{get} {size}, {self.connections} conn{depth}"
        if self.workload == "flood":
            loop = "open/close loop" if self.reliable else "set+get"
            return f"{loop} {size}, {self.producers}+{self.connections} conn{depth}"
        if self.workload == "leaky-reader":
            return (
                f"leaky open/close {size}, {self.producers}+{self.connections} conn, "
                f"abort {self.abort_rate:.0%} drop {self.drop_rate:.0%}"
            )
        if self.workload == "fanout":
            return f"fanout x{self.readers} {size}, {self.producers}+{self.readers} conn{depth}"
        return f"many-clients {size}, {self.connections} waiting + {self.producers} producer"


@dataclass(slots=True)
class Plan:
    """What to run against one server for a spec."""

    roles: list[Role]
    unit: str  # what one counted operation is: set, get, item
    primary: str  # the role whose items are counted and whose latency is shown
    config: str = ""
    prefill: list[Role] = field(default_factory=list)
    commands: list[bytes] = field(default_factory=list)  # sent (and answered) before the run
    producer: str = ""  # the role (or prefill role) whose STORED ids are the items to deliver
    complete: list[str] = field(default_factory=list)  # roles that must get each one exactly once
    note: str = ""


#: What Darner runs: the queue workloads it shares with kestreld (it has no fanout queues, and its
#: ``/sync`` is per request where ``sync_journal`` is per queue, so those rows are kestreld's only).
DARNER_WORKLOADS = ("put-many", "get-drain", "flood")


def plan(spec: Spec, server: str) -> Plan | None:
    """The roles for ``server`` ("kestreld", "memcached" or "darner"); None when there is no
    analog.  Darner speaks Kestrel's protocol, so its roles are kestreld's, without the config."""
    if server == "darner":
        if spec.workload not in DARNER_WORKLOADS or spec.sync_journal is not None:
            return None
        p = plan(spec, "kestreld")
        return dataclasses.replace(p, config="") if p is not None else None
    mc = server == "memcached"
    n, size, depth = spec.items, spec.size, spec.depth
    queues = spec.queues
    if queues > 1 and (mc or spec.workload not in ("put-many", "get-drain")):
        return None  # many queues: a queue server's set and get only
    if spec.spread > 1 and (spec.workload != "put-many" or spec.instances > 1):
        return None  # a connection over several queues: one server's set only
    config = f"sync_journal = {spec.sync_journal}\n" if spec.sync_journal is not None else ""
    if not spec.handoff and not mc:
        config += "worker_handoff = false\n"
    if spec.workload == "put-many":
        producer = Role("producer", "set", spec.connections, n, size=size, depth=depth)
        producer.distinct_keys, producer.queues, producer.spread = mc, queues, spec.spread
        note = "memcached: no fsync" if mc and spec.sync_journal is not None else ""
        return Plan([producer], "set", "producer", config=config, note=note)
    if spec.workload == "get-drain":
        # Many queues: a prefill connection per queue, so queue i holds the ids that
        # consumer i (of as many) asks for.
        prefill = Role("prefill", "set", queues if queues > 1 else 4, n, size=size,
                       depth=64, distinct_keys=mc, verify=not mc, queues=queues)  # fmt: skip
        # A reliable drain: each request confirms the item before and opens the next, so one
        # request per item, as a plain get (memcached's analog is its get).
        reliable = spec.reliable and not mc
        kind = "reliable" if reliable else "get"
        consumer = Role("consumer", kind, spec.connections, n, size=size, depth=depth)
        consumer.distinct_keys, consumer.verify, consumer.queues = mc, not mc, queues
        consumer.shared_stop, consumer.stop_on_miss = reliable, True
        return Plan(
            [consumer],
            "get",
            "consumer",
            config=config,
            prefill=[prefill],
            producer="" if mc else "prefill",
            complete=[] if mc else ["consumer"],
            note="memcached: plain get" if mc and spec.reliable else "",
        )
    if spec.workload in ("flood", "fanout") and mc:
        reads = spec.readers if spec.workload == "fanout" else 1
        conns = spec.producers + (spec.readers if spec.workload == "fanout" else spec.connections)
        pair = Role("pair", "pair", conns, n, size=size, depth=depth, reads=reads)
        return Plan([pair], "item", "pair", note=f"memcached: set k + {reads} get k per item")
    if mc:
        return None  # leaky-reader and many-clients are about queue semantics
    if spec.workload in ("flood", "leaky-reader", "many-clients"):
        flood, leaky = spec.workload == "flood", spec.workload == "leaky-reader"
        rate = spec.rate if spec.workload == "many-clients" else 0.0
        producer = Role("producer", "set", spec.producers, n, size=size, rate=rate, verify=True)
        consumer = Role(
            "consumer",
            "reliable" if leaky or spec.reliable and flood else "get",
            spec.connections,
            n,
            size=size,
            depth=depth if flood else 1,
            wait_ms=spec.wait_ms if flood or leaky else max(spec.wait_ms, 1000),
            shared_stop=True,
            verify=True,
            abort_rate=spec.abort_rate if leaky else 0.0,
            drop_rate=spec.drop_rate if leaky else 0.0,
        )
        roles = [producer, consumer]
        return Plan(roles, "item", "consumer", config, producer="producer", complete=["consumer"])
    if spec.workload == "fanout":
        config += "[queues.fan]\nfanout_only = true\n"
        producer = Role("producer", "set", spec.producers, n, size=size, queue="fan", verify=True)
        reader = dict(size=size, depth=depth, wait_ms=spec.wait_ms, shared_stop=True, verify=True)
        numbers = range(1, spec.readers + 1)
        readers = [Role(f"reader-{i}", "get", 1, n, queue=f"fan+r{i}", **reader) for i in numbers]
        commands = [f"get fan+r{i}\r\n".encode() for i in numbers]  # creates the readers
        names = [r.name for r in readers]
        return Plan([producer, *readers], "item", "producer", config, commands=commands,
                    producer="producer", complete=names)  # fmt: skip
    raise ValueError(f"unknown workload {spec.workload}")


# --- one measured run ----------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    key: str
    description: str
    server: str
    unit: str
    units: int  # counted operations (the plan's unit)
    requests: int  # replies received, all roles
    seconds: float  # from the start to the last counted reply
    rate: float  # units per second
    p50_ms: float
    p99_ms: float
    max_ms: float
    server_cpu: float  # seconds
    server_us: float  # server CPU microseconds per unit
    server_cores: float  # server CPU / wall time
    rss_mib: float  # at the end of the run
    client_cpu: float
    client_us: float
    client_cores: float
    others_cores: float  # CPU used by everything else on the machine meanwhile
    loadavg: str
    check: str  # exactly-once verdict
    errors: int
    error_samples: list[str]
    note: str = ""
    runs: int = 1  # > 1: every figure is the median of this many runs
    server_us_range: tuple[float, float] = (0.0, 0.0)  # over the runs
    p99_range: tuple[float, float] = (0.0, 0.0)
    instances: int = 1  # server processes; server_cpu, server_cores and RSS are their sums
    workers: int = 1  # kestreld's workers (CPU and RSS: the supervisor's and theirs)
    queues: int = 1
    requests_local: int = 0  # workers > 1: requests served where they landed
    requests_crossed: int = 0  # and sent on to the worker owning their queue
    supervisor_cpu: float = 0.0  # workers > 1: the supervisor's own part of server_cpu
    handoffs: int = 0  # workers > 1: connections moved to their queue's owner
    handoff: bool = True  # workers > 1: worker_handoff
    spread: int = 1  # put-many: queues a connection alternates over

    @property
    def crossed(self) -> float:
        """The share of the requests that crossed to another worker."""
        total = self.requests_local + self.requests_crossed
        return self.requests_crossed / total if total else 0.0


def median_rows(rows: list[Row]) -> list[Row]:
    """One row per (workload, server): each number the median of its runs, checks all kept."""
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.key, r.server), []).append(r)
    out = []
    for runs in groups.values():
        merged = dataclasses.replace(runs[0])
        for f in dataclasses.fields(Row):
            values = [getattr(r, f.name) for r in runs]
            if f.type in ("float", "int") and not f.name.endswith("range"):
                setattr(merged, f.name, statistics.median(values))
        checks = sorted({r.check for r in runs})
        merged.check = checks[0] if len(checks) == 1 else "; ".join(checks)
        merged.errors = sum(r.errors for r in runs)
        merged.error_samples = [s for r in runs for s in r.error_samples][:5]
        merged.loadavg = " | ".join(r.loadavg for r in runs)
        merged.runs = len(runs)
        merged.server_us_range = (min(r.server_us for r in runs), max(r.server_us for r in runs))
        merged.p99_range = (min(r.p99_ms for r in runs), max(r.p99_ms for r in runs))
        out.append(merged)
    return out


def measure(
    spec: Spec,
    server: str,
    *,
    workdir: str | None = None,
    darner: str | None = None,
    server_cpus: frozenset[int] | None = None,
    client_cpus: frozenset[int] | None = None,
    profiler_factory: Callable[[int], Any] | None = None,
) -> Row | None:
    """Run ``spec`` against a fresh ``server``; None when it has no analog of the workload.
    ``darner`` is the Darner binary, for ``server="darner"``.  ``server_cpus`` and
    ``client_cpus`` pin the server's threads and the load generator's processes (the
    measured run's; a prefill runs where the scheduler puts it).  ``profiler_factory(pid)``
    makes something to ``start()`` as the measured run starts and ``stop()`` after."""
    p = plan(spec, server)
    if p is None:
        return None
    count = spec.instances if server == "kestreld" else 1
    workers = spec.workers if server == "kestreld" else None
    servers = []
    meter = None
    try:
        for _ in range(count):
            servers.append(
                start_server(server, p.config, workdir=workdir, darner=darner, workers=workers)
            )
        ports = [srv.port for srv in servers]
        target = ports[0] if count == 1 else ports
        for srv in servers:
            pin(srv.pid, server_cpus)
            with socket.create_connection(("127.0.0.1", srv.port), timeout=30) as sock:
                conn = Conn(sock)
                for command in p.commands:  # set-up requests, each answered before the next
                    conn.send(command)
                    conn.line()
        prefilled = None
        if p.prefill:
            prefilled = bench_load.run(p.prefill, target, seconds=600, procs=spec.procs)
            if bad := sum(r.errors for r in prefilled.roles.values()):
                raise RuntimeError(f"prefill failed: {bad} errors")
        meter = Meter([srv.pid for srv in servers], profiler_factory)
        routed_before = routed_requests(ports[0]) if spec.workers > 1 else (0, 0, 0)
        result = bench_load.run(
            p.roles,
            target,
            seconds=spec.seconds,
            procs=spec.procs,
            on_start=meter.start,
            cpus=client_cpus,
        )
        meter.stop()
        routed = routed_requests(ports[0]) if spec.workers > 1 else (0, 0, 0)
        local, crossed, handoffs = (a - b for a, b in zip(routed, routed_before, strict=True))
        rss_end = sum(tree_rss(srv.pid) for srv in servers)
        check = _check(p, result, prefilled, target)
    finally:
        if meter is not None and meter.profiler is not None:
            meter.profiler.stop()  # again, when the run failed
        for srv in servers:
            srv.stop()
    primary = result.roles[p.primary]
    window = result.window(p.primary)
    units = primary.items
    p50, p99, pmax = primary.percentiles(0.5, 0.99, 1.0)
    client_cpu = sum(r.cpu for r in result.roles.values())
    m = meter

    per_unit = 1e6 / units if units else 0.0  # microseconds per unit

    return Row(
        key=spec.key,
        description=spec.describe(),
        server=server,
        unit=p.unit,
        units=units,
        requests=sum(r.requests for r in result.roles.values()),
        seconds=window,
        rate=units / window,
        p50_ms=p50 * 1000,
        p99_ms=p99 * 1000,
        max_ms=pmax * 1000,
        server_cpu=m.cpu,
        server_us=m.cpu * per_unit,
        server_cores=m.cpu / m.span,
        rss_mib=rss_end / MiB,
        client_cpu=client_cpu,
        client_us=client_cpu * per_unit,
        client_cores=client_cpu / m.span,
        others_cores=max(0.0, m.busy_cores - (m.cpu + client_cpu) / m.span),
        loadavg=m.loadavg,
        check=check,
        errors=sum(r.errors for r in result.roles.values()),
        error_samples=[s for r in result.roles.values() for s in r.error_samples][:5],
        note=p.note,
        instances=count,
        workers=spec.workers,
        queues=spec.queues,
        requests_local=local,
        requests_crossed=crossed,
        supervisor_cpu=m.own_cpu if spec.workers > 1 else 0.0,
        handoffs=handoffs,
        handoff=spec.handoff,
        spread=spec.spread,
    )


def routed_requests(port: int) -> tuple[int, int, int]:
    """A box of workers' requests so far: (served where they landed, crossed to the owner),
    and the connections handed to an owner."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        stats = Conn(sock).stats()
    return (
        int(stats["worker_requests_local"]),
        int(stats["worker_requests_crossed"]),
        int(stats.get("handoffs", 0)),
    )


class Meter:
    """The servers' CPU (summed over the processes, each with its workers) and the
    machine's, from ``start()`` to ``stop()``; with a profiler of the first server running
    meanwhile."""

    def __init__(self, pids: list[int], profiler_factory: Callable[[int], Any] | None) -> None:
        self.pids = pids
        self.profiler = profiler_factory(pids[0]) if profiler_factory else None

    def _sample(self) -> tuple[float, float, MachineSample, float]:
        cpu = sum(tree_cpu_seconds(pid) for pid in self.pids)
        own = sum(cpu_seconds(pid) for pid in self.pids)  # a box's supervisor: its own share
        return cpu, own, MachineSample.now(), time.perf_counter()

    def start(self) -> None:
        self.before = self._sample()
        if self.profiler is not None:
            self.profiler.start()

    def stop(self) -> None:
        if self.profiler is not None:
            self.profiler.stop()
        (cpu, own, machine, t), (cpu0, own0, machine0, t0) = self._sample(), self.before
        self.cpu, self.span, self.loadavg = cpu - cpu0, t - t0, machine.loadavg
        self.own_cpu = own - own0
        self.busy_cores = machine.busy_cores_since(machine0)


def _check(
    p: Plan,
    result: bench_load.LoadResult,
    prefilled: bench_load.LoadResult | None,
    port: int | list[int],
) -> str:
    """Did every STORED item reach each consumer role exactly once?

    Items a time-bounded run left in the queue are drained (not measured) and
    counted as delivered late; an item neither delivered nor left is lost.
    """
    if not p.complete:
        return "-"
    source = prefilled if prefilled is not None and p.producer in prefilled.roles else result
    produced = source.roles[p.producer].ids
    assert produced is not None
    verdicts = []
    for name in p.complete:
        role = result.roles[name]
        got = role.ids
        assert got is not None
        left = 0
        if got != produced:
            queues = role.role.queues  # many: a connection per queue, to the queue's server
            drain = Role("drain", "get", queues, len(produced), size=role.role.size, depth=64)
            drain.queue, drain.stop_on_miss, drain.verify = role.role.queue, True, True
            drain.queues = queues
            every = [port] if isinstance(port, int) or queues > 1 else port  # every instance
            for each in every:
                rest = bench_load.run([drain], each, seconds=300, procs=1).roles["drain"]
                left += rest.items
                assert rest.ids is not None
                got = bench_load.add_counts(got, rest.ids)
        if got == produced:
            verdicts.append("exactly once" + (f" ({left} drained after)" if left else ""))
            continue
        pairs = list(zip(produced, got, strict=True))
        lost = sum(1 for a, b in pairs if a and not b)
        dup = sum(1 for a, b in pairs if b > max(a, 1))
        extra = sum(1 for a, b in pairs if b and not a)
        verdicts.append(f"{name}: FAILED lost={lost} duplicated={dup} never-stored={extra}")
    if all(v.startswith("exactly once") for v in verdicts):
        return verdicts[0] if len(verdicts) == 1 else f"exactly once x{len(verdicts)}"
    return "; ".join(verdicts)
