"""Server-wide counters and the text of ``stats`` and ``dump_stats``."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from kestreld.queues.collection import QueueCollection
from kestreld.queues.reader import Reader
from kestreld.session.traffic import COUNTERS as TRAFFIC_COUNTERS
from kestreld.session.traffic import Traffic
from kestreld.stats.queue_lines import QUEUE_STAT_KEYS, StatLinesCache


@dataclass(slots=True)
class ServerStats:
    started: float = field(default_factory=time.time)
    total_connections: int = 0
    #: cmd_get, cmd_set, cmd_peek, get_hits, get_misses, bytes_read, bytes_written (below).
    traffic: Traffic = field(default_factory=Traffic)
    # security: authentications of clients (auth_file), queues refused by max_queues
    auth_successes: int = 0
    auth_failures: int = 0
    queue_create_refusals: int = 0


def _traffic_counter(name: str) -> property:
    """``stats.<name>`` reads and writes ``stats.traffic.<name>``."""

    def get(stats: ServerStats) -> int:
        return getattr(stats.traffic, name)  # type: ignore[no-any-return]

    def set_(stats: ServerStats, value: int) -> None:
        setattr(stats.traffic, name, value)

    return property(get, set_, doc=f"``{name}``, counted in :class:`Traffic`.")


for _name in TRAFFIC_COUNTERS:
    setattr(ServerStats, _name, _traffic_counter(_name))


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


_MEMORY = _physical_memory()


def _with_oldest_item_age(reader: Reader, now_ms: int) -> dict[str, int]:
    """The reader's stats and ``oldest_item_age``: ms the head item has waited (0 when empty).

    Unlike ``age`` (how long the last item *taken* had waited), it keeps
    growing while nobody consumes: the figure to alert on.
    """
    added = reader.oldest_add_time()  # first: it may load the head from disk (mem_items)
    values = reader.stats()
    values["oldest_item_age"] = max(0, now_ms - added) if added is not None else 0
    return values


def queue_stats(queues: QueueCollection) -> list[tuple[str, dict[str, int]]]:
    """(name, stats) for every queue and fanout reader, sorted by name."""
    now_ms = int(time.time() * 1000)
    out = []
    for qname in sorted(queues.queues):
        if qname in queues.aliases:
            continue  # masked by an alias: the alias's stats carry the name
        queue = queues.queues[qname]
        default = queue.readers.get("")
        if default is not None:
            values = _with_oldest_item_age(default, now_ms)
        else:
            values = dict.fromkeys(QUEUE_STAT_KEYS, 0)
            values["logsize"] = queue.journal.total_size if queue.journal else 0
            values["total_items"] = queue.last_id
        children = queue.children()
        if children:
            # Kestrel's form: the readers' names, comma-separated ("audit,billing").
            values["children"] = ",".join(sorted(r.name for r in children))  # type: ignore[assignment]
        out.append((qname, values))
        for reader in sorted(children, key=lambda r: r.name):
            out.append((reader.full_name, _with_oldest_item_age(reader, now_ms)))
    return out


def alias_stats(queues: QueueCollection) -> list[tuple[str, dict[str, object]]]:
    """(name, stats) for every alias, sorted: Kestrel's put_items, put_bytes and children."""
    return [(name, queues.aliases[name].stats()) for name in sorted(queues.aliases)]


def queue_totals(queues: QueueCollection) -> tuple[int, int, int, int]:
    """``(curr_items, total_items, bytes, reserved memory)`` over every reader, in one pass
    (a ``stats`` sums them while it renders the queues' lines: StatLinesCache.render)."""
    items = total_items = nbytes = reserved = 0
    for queue in queues.queues.values():
        journaled = queue.journal is not None
        for r in queue.reader_list:
            items += r.items
            total_items += r.total_items
            nbytes += r.bytes
            if journaled:
                reserved += r.config.max_memory_size
    return items, total_items, nbytes, reserved


def global_stats(
    stats: ServerStats,
    queues: QueueCollection,
    connections: int,
    version: str,
    totals: tuple[int, int, int, int] | None = None,
) -> list[tuple[str, object]]:
    """The server's keys; ``totals``: :func:`queue_totals`, when already summed."""
    now = time.time()
    items, total_items, nbytes, reserved = totals if totals is not None else queue_totals(queues)
    ratio = (reserved / _MEMORY) if _MEMORY else 0.0
    return [
        ("uptime", int(now - stats.started)),
        ("time", int(now)),
        ("version", version),
        ("curr_items", items),
        ("total_items", total_items),
        ("bytes", nbytes),
        ("reserved_memory_ratio", f"{ratio:.3f}"),
        ("curr_connections", connections),
        ("total_connections", stats.total_connections),
        ("cmd_get", stats.cmd_get),
        ("cmd_set", stats.cmd_set),
        ("cmd_peek", stats.cmd_peek),
        ("get_hits", stats.get_hits),
        ("get_misses", stats.get_misses),
        ("bytes_read", stats.bytes_read),
        ("bytes_written", stats.bytes_written),
        ("queue_creates", queues.queue_creates),
        ("queue_deletes", queues.queue_deletes),
        ("queue_expires", queues.queue_expires),
        ("auth_successes", stats.auth_successes),
        ("auth_failures", stats.auth_failures),
        ("queue_create_refusals", stats.queue_create_refusals),
    ]


def render_stats(
    stats: ServerStats,
    queues: QueueCollection,
    connections: int,
    version: str,
    extra: list[tuple[str, object]] | tuple = (),
    cache: StatLinesCache | None = None,
) -> bytes:
    """The ``stats`` reply; ``extra`` are further server keys (status, zookeeper_connected).

    ``cache``: the server's, kept between calls (a new one each call costs a full render).
    """
    out: list[bytes] = [b""]  # the server's lines, made once the queues' pass summed them
    totals = (cache if cache is not None else StatLinesCache()).render(queues, out)
    server = global_stats(stats, queues, connections, version, totals)
    out[0] = "".join([f"STAT {k} {v}\r\n" for k, v in [*server, *extra]]).encode()
    out.append(
        "".join(
            [
                f"STAT queue_{name}_{k} {v}\r\n"
                for name, alias_values in alias_stats(queues)
                for k, v in alias_values.items()
            ]
        ).encode()
    )
    out.append(b"END\r\n")
    # Bytes throughout, joined once: one copy of a reply of megabytes.
    return b"".join(out)


def render_dump_stats(queues: QueueCollection, names: list[str]) -> bytes:
    lines = []
    every: list[tuple[str, dict]] = [*queue_stats(queues), *alias_stats(queues)]
    for name, values in sorted(every, key=lambda entry: entry[0]):
        if names and name not in names:
            continue
        lines.append(f"queue '{name}' {{")
        lines.extend(f"  {k}={v}" for k, v in values.items())
        lines.append("}")
    lines.append("END\r\n")
    return "\r\n".join(lines).encode()
