"""The ``stats`` figures as Prometheus metric families (a ``prometheus_client`` collector).

Values come from the same functions as the ``stats`` command
(:func:`global_stats`, :func:`queue_stats`), read when scraped, so the two
always agree.  Each stats key maps to one metric: counters end in ``_total``,
times are in seconds.  Per-queue metrics (``kestreld_queue_*``) carry
``queue="<name>"``; a fanout reader ``q+r`` has its own families
(``kestreld_reader_*``) labelled ``queue="q", reader="r"``, so that
``sum(kestreld_queue_items)`` counts each item once, not once per reader.
A stats key without an entry in the tables below is still exported, as a
gauge named after it, so nothing the ``stats`` command shows is missing here,
except ``uptime`` and ``time``: the process collector's
``process_start_time_seconds`` and the scrape's own timestamp say the same.

A :class:`StatsSnapshot` is taken on the event loop: it reads the queues and
costs what the ``stats`` command costs.  Turning it into metric families and
encoding them can then happen on any thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from kestreld import __version__
from kestreld.state import ServerStatus
from kestreld.stats.counters import alias_stats, global_stats, queue_stats

if TYPE_CHECKING:
    from kestreld.state import ServerState as Server


@dataclass(slots=True, frozen=True)
class MetricSpec:
    """How one stats key is exported."""

    name: str  # without the _total suffix of a counter
    kind: str  # "counter" or "gauge"
    help: str
    scale: float = 1.0  # value multiplier (ms -> s)


_COUNTER, _GAUGE = "counter", "gauge"

#: Server-wide ``stats`` keys left out: they duplicate the process collector's
#: ``process_start_time_seconds`` (uptime) and the scrape timestamp (time).
PROCESS_DUPLICATES = frozenset({"uptime", "time"})

#: Server-wide ``stats`` keys (``version`` becomes ``kestreld_build_info``).
GLOBAL_METRICS: dict[str, MetricSpec] = {
    "curr_items": MetricSpec("kestreld_items", _GAUGE, "Items in all queues, open reads excluded."),
    "total_items": MetricSpec(
        "kestreld_items_added", _COUNTER, "Items added to all queues and readers."
    ),
    "bytes": MetricSpec(
        "kestreld_bytes", _GAUGE, "Bytes of items in all queues, open reads excluded."
    ),
    "reserved_memory_ratio": MetricSpec(
        "kestreld_reserved_memory_ratio",
        _GAUGE,
        "Sum of journaled readers' max_memory_size over physical memory.",
    ),
    "curr_connections": MetricSpec("kestreld_connections", _GAUGE, "Open client connections."),
    "total_connections": MetricSpec(
        "kestreld_connections_accepted", _COUNTER, "Client connections accepted."
    ),
    "cmd_get": MetricSpec(
        "kestreld_cmd_get", _COUNTER, "Fetching gets (not peeks, not close-only or abort-only)."
    ),
    "cmd_set": MetricSpec("kestreld_cmd_set", _COUNTER, "set requests."),
    "cmd_peek": MetricSpec("kestreld_cmd_peek", _COUNTER, "get /peek requests."),
    "get_hits": MetricSpec(
        "kestreld_get_hits", _COUNTER, "Fetches that returned an item (peeks and monitor included)."
    ),
    "get_misses": MetricSpec("kestreld_get_misses", _COUNTER, "Fetches that returned nothing."),
    "bytes_read": MetricSpec("kestreld_bytes_read", _COUNTER, "Bytes received from clients."),
    "bytes_written": MetricSpec("kestreld_bytes_written", _COUNTER, "Bytes sent to clients."),
    "queue_creates": MetricSpec("kestreld_queue_creates", _COUNTER, "Queues created."),
    "queue_deletes": MetricSpec("kestreld_queue_deletes", _COUNTER, "Queues deleted."),
    "queue_expires": MetricSpec(
        "kestreld_queue_expires", _COUNTER, "Queues deleted by max_queue_age."
    ),
    "auth_successes": MetricSpec(
        "kestreld_auth_successes", _COUNTER, "Clients that authenticated (auth_file)."
    ),
    "auth_failures": MetricSpec(
        "kestreld_auth_failures",
        _COUNTER,
        "Failed authentications: unknown user, wrong password, malformed token.",
    ),
    "queue_create_refusals": MetricSpec(
        "kestreld_queue_create_refusals", _COUNTER, "New queue names refused by max_queues."
    ),
    # Busy polling (busy_poll_us; kestreld/loop/busy_poll.py): present unless it is 0.
    "busy_poll_us": MetricSpec(
        "kestreld_busy_poll_limit_seconds",
        _GAUGE,
        "Longest poll for a lone client's next request (busy_poll_us).",
        scale=1e-6,
    ),
    "busy_poll_caught": MetricSpec(
        "kestreld_busy_poll_caught", _COUNTER, "Polls the client's next request arrived in."
    ),
    "busy_poll_ran_out": MetricSpec(
        "kestreld_busy_poll_ran_out", _COUNTER, "Polls that ended without a request."
    ),
    "busy_poll_preferred": MetricSpec(
        "kestreld_busy_poll_preferred",
        _GAUGE,
        "1 while polling costs a lone client's requests less CPU than sleeping (measured).",
    ),
    "busy_poll_gain_ns": MetricSpec(
        "kestreld_busy_poll_gain_seconds",
        _GAUGE,
        "Server CPU a lone client's request costs less when polling (negative: more).",
        scale=1e-9,
    ),
    # How late the event loop serves a timer (kestreld/loop/hold.py).
    "loop_hold_max_us": MetricSpec(
        "kestreld_loop_hold_max_seconds",
        _GAUGE,
        "Longest the event loop was held (busy, not serving I/O) in the last minute.",
        scale=1e-6,
    ),
    "loop_hold_probes": MetricSpec(
        "kestreld_loop_hold_probes", _COUNTER, "Instants the event loop's hold was probed."
    ),
    "loop_hold_over_1ms": MetricSpec(
        "kestreld_loop_hold_over_1ms", _COUNTER, "Probes the event loop was held over 1 ms at."
    ),
    # workers = N (kestreld/workers/): the box's figures, gathered by worker 0.
    "workers": MetricSpec("kestreld_workers", _GAUGE, "Worker processes of the box (workers)."),
    "workers_answering": MetricSpec(
        "kestreld_workers_answering",
        _GAUGE,
        "Workers whose figures are in these totals (fewer: one is restarting or slow).",
    ),
    "worker": MetricSpec("kestreld_worker", _GAUGE, "The worker serving this admin port."),
    "worker_requests_local": MetricSpec(
        "kestreld_worker_requests_local",
        _COUNTER,
        "Requests served by the worker that accepted their connection.",
    ),
    "worker_requests_crossed": MetricSpec(
        "kestreld_worker_requests_crossed",
        _COUNTER,
        "Requests sent on to the worker that owns their queue (one local hop more).",
    ),
}

#: Per-queue ``stats`` keys (``queue_<name>_<key>``), labelled ``queue``.
QUEUE_METRICS: dict[str, MetricSpec] = {
    "items": MetricSpec("kestreld_queue_items", _GAUGE, "Items in the queue, open reads excluded."),
    "bytes": MetricSpec(
        "kestreld_queue_bytes", _GAUGE, "Bytes of items in the queue, open reads excluded."
    ),
    "total_items": MetricSpec("kestreld_queue_items_added", _COUNTER, "Items added to the queue."),
    "logsize": MetricSpec(
        "kestreld_queue_journal_bytes", _GAUGE, "Bytes of the queue's journal segments."
    ),
    "expired_items": MetricSpec(
        "kestreld_queue_expired_items", _COUNTER, "Items discarded by expiry."
    ),
    "mem_items": MetricSpec(
        "kestreld_queue_mem_items", _GAUGE, "Items held in memory (the rest is read-behind)."
    ),
    "mem_bytes": MetricSpec("kestreld_queue_mem_bytes", _GAUGE, "Bytes of items held in memory."),
    "age": MetricSpec(
        "kestreld_queue_age_seconds",
        _GAUGE,
        "How long the last item taken from the queue had waited in it (frozen while "
        "nobody takes: alert on kestreld_queue_oldest_item_age_seconds instead).",
        scale=0.001,
    ),
    "discarded": MetricSpec(
        "kestreld_queue_discarded", _COUNTER, "Items dropped because the queue was full."
    ),
    "waiters": MetricSpec(
        "kestreld_queue_waiters", _GAUGE, "Clients blocked in a get on the queue."
    ),
    "open_transactions": MetricSpec(
        "kestreld_queue_open_transactions", _GAUGE, "Open reads (get /open) not yet closed."
    ),
    "transactions": MetricSpec("kestreld_queue_transactions", _COUNTER, "Reads opened."),
    "canceled_transactions": MetricSpec(
        "kestreld_queue_canceled_transactions", _COUNTER, "Open reads aborted or given back."
    ),
    "total_flushes": MetricSpec("kestreld_queue_flushes", _COUNTER, "flush requests on the queue."),
    "journal_rewrites": MetricSpec(
        "kestreld_queue_journal_rewrites", _COUNTER, "Journal rewrites."
    ),
    "journal_rotations": MetricSpec(
        "kestreld_queue_journal_rotations", _COUNTER, "New journal segments started."
    ),
    "punted_items": MetricSpec(
        "kestreld_queue_punted_items",
        _COUNTER,
        "Aborted items moved to an error queue (punt_error_to_queue, punt_many_errors_to_queue).",
    ),
    "children": MetricSpec("kestreld_queue_children", _GAUGE, "Fanout readers of the queue."),
    "oldest_item_age": MetricSpec(
        "kestreld_queue_oldest_item_age_seconds",
        _GAUGE,
        "How long the oldest item still waiting has waited (0 when empty); "
        "grows while consumers are stopped.",
        scale=0.001,
    ),
}

#: An alias's ``stats`` keys, labelled ``alias``.
ALIAS_METRICS: dict[str, MetricSpec] = {
    "put_items": MetricSpec("kestreld_alias_put_items", _COUNTER, "Items put to the alias."),
    "put_bytes": MetricSpec("kestreld_alias_put_bytes", _COUNTER, "Bytes put to the alias."),
    "children": MetricSpec("kestreld_alias_children", _GAUGE, "Destination queues of the alias."),
}

#: A fanout reader's families: the queue's, renamed, labelled queue and reader.
_QUEUE_PREFIX, _READER_PREFIX = "kestreld_queue_", "kestreld_reader_"
_QUEUE_LABELS, _READER_LABELS = ["queue"], ["queue", "reader"]


def reader_spec(spec: MetricSpec) -> MetricSpec:
    """The family of a per-queue metric for fanout readers (``kestreld_reader_*``)."""
    return MetricSpec(
        _READER_PREFIX + spec.name.removeprefix(_QUEUE_PREFIX),
        spec.kind,
        spec.help.replace("the queue", "the fanout reader"),
        spec.scale,
    )


def _family(spec: MetricSpec, labels: list[str]) -> Metric:
    if spec.kind == _COUNTER:
        return CounterMetricFamily(spec.name, spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


def _number(value: object) -> float:
    return float(value)  # type: ignore[arg-type]  # ints, and the ratio's "0.123" text


@dataclass(slots=True, frozen=True)
class StatsSnapshot:
    """The ``stats`` figures and the status at one moment; safe to read from any thread."""

    server: list[tuple[str, object]]  # global_stats
    queues: list[tuple[str, dict[str, int]]]  # queue_stats
    status: ServerStatus
    #: True/False while the server is in ZooKeeper server sets ([zookeeper]), else None.
    zookeeper_connected: bool | None = None
    aliases: list[tuple[str, dict[str, object]]] = ()  # type: ignore[assignment]  # alias_stats

    @classmethod
    def take(cls, server: Server) -> StatsSnapshot:
        """Read a running server's figures; call on its event loop's thread."""
        return cls(
            global_stats(server.stats, server.queues, server.clients(), __version__)
            + server.busy_poll.stats()
            + server.loop_hold.stats(),
            queue_stats(server.queues),
            server.status,
            server.zookeeper_connected if server.membership is not None else None,
            alias_stats(server.queues),
        )


class StatsCollector(Collector):
    """The metric families of one :class:`StatsSnapshot`: stats figures and status."""

    def __init__(self, snapshot: StatsSnapshot) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.snapshot
        yield InfoMetricFamily(
            "kestreld_build", "The kestreld version.", value={"version": __version__}
        )
        status = GaugeMetricFamily(
            "kestreld_status",
            "1 for the status in force (UP, WRITEAVOID, READONLY, QUIESCENT), else 0.",
            labels=["status"],
        )
        for value in ServerStatus:
            status.add_metric([value.value], 1.0 if snapshot.status is value else 0.0)
        yield status
        if snapshot.zookeeper_connected is not None:
            yield GaugeMetricFamily(
                "kestreld_zookeeper_connected",
                "1 while the ZooKeeper session of the server sets is connected, else 0.",
                value=1.0 if snapshot.zookeeper_connected else 0.0,
            )
        for key, value in snapshot.server:
            if key == "version" or key in PROCESS_DUPLICATES:
                continue
            spec = GLOBAL_METRICS.get(key) or MetricSpec(f"kestreld_{key}", _GAUGE, f"stats {key}")
            family = _family(spec, [])
            family.add_metric([], _number(value) * spec.scale)
            yield family
        families: dict[tuple[bool, str], Metric] = {}  # (is a reader, stats key)
        specs: dict[tuple[bool, str], MetricSpec] = {}
        for name, values in snapshot.queues:
            queue, plus, reader = name.partition("+")
            labels = [queue, reader] if plus else [name]
            for key, value in values.items():
                if key == "children":  # stats names them ("audit,billing"); the gauge counts them
                    value = len(str(value).split(","))
                slot = (bool(plus), key)
                family = families.get(slot)
                if family is None:
                    spec = QUEUE_METRICS.get(key) or MetricSpec(
                        f"{_QUEUE_PREFIX}{key}", _GAUGE, f"stats queue_<name>_{key}"
                    )
                    if plus:
                        spec = reader_spec(spec)
                    family = families[slot] = _family(
                        spec, _READER_LABELS if plus else _QUEUE_LABELS
                    )
                    specs[slot] = spec
                family.add_metric(labels, _number(value) * specs[slot].scale)
        # Declared even with no queues or readers, for dashboards.
        for key, spec in QUEUE_METRICS.items():
            if (False, key) not in families:
                yield _family(spec, _QUEUE_LABELS)
            if (True, key) not in families and key != "children":
                yield _family(reader_spec(spec), _READER_LABELS)
        yield from families.values()
        alias_families = {key: _family(spec, ["alias"]) for key, spec in ALIAS_METRICS.items()}
        for name, alias_values in snapshot.aliases:
            for key, value in alias_values.items():
                if key == "children":  # the destinations, comma-separated: the gauge counts them
                    value = len(str(value).split(","))
                alias_families[key].add_metric([name], _number(value))
        yield from alias_families.values()
