"""``stats`` and ``dump_stats`` replies parsed into dicts."""

from __future__ import annotations

from dataclasses import dataclass, field

StatValue = int | float | str


@dataclass(slots=True)
class ServerStats:
    """The counters of one server.

    ``values`` holds the server-wide keys of ``stats`` (``uptime``,
    ``curr_items``, ``version`` ...), numbers as ``int`` or ``float``.
    ``queues`` maps every queue and fanout reader (``q+r``) to its counters
    (``items``, ``bytes``, ``open_transactions`` ...), taken from
    ``dump_stats``, which names queues unambiguously (``queue_<name>_<key>``
    does not: ``a_total`` + ``items`` and ``a`` + ``total_items`` look alike).
    """

    server: str
    values: dict[str, StatValue] = field(default_factory=dict)
    queues: dict[str, dict[str, int]] = field(default_factory=dict)

    def queue(self, name: str) -> dict[str, int]:
        """The counters of ``name``; empty when this server does not have the queue."""
        return self.queues.get(name, {})


def parse_value(text: str) -> StatValue:
    """``"12"`` -> 12, ``"0.125"`` -> 0.125, anything else stays text."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_dump_stats(lines: list[bytes]) -> dict[str, dict[str, int]]:
    """``queue 'q' {`` / ``  key=value`` / ``}`` blocks (``END`` excluded) -> {queue: {key: value}}."""
    queues: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for raw in lines:
        line = raw.decode("utf-8", "replace").strip()
        if line.startswith("queue '") and line.endswith("' {"):
            current = queues.setdefault(line[7:-3], {})
        elif line == "}":
            current = None
        elif current is not None and "=" in line:
            key, _, value = line.partition("=")
            parsed = parse_value(value)
            current[key] = parsed if isinstance(parsed, int) else 0
    return queues


def parse_stats(server: str, stat_lines: list[bytes], dump_lines: list[bytes]) -> ServerStats:
    """A :class:`ServerStats` from a ``stats`` reply and a ``dump_stats`` reply (``END`` excluded)."""
    queues = parse_dump_stats(dump_lines)
    per_queue = {f"queue_{name}_{key}" for name, keys in queues.items() for key in keys}
    values: dict[str, StatValue] = {}
    for raw in stat_lines:
        parts = raw.decode("utf-8", "replace").split(" ", 2)
        if len(parts) < 2 or parts[0] != "STAT" or parts[1] in per_queue:
            continue
        values[parts[1]] = parse_value(parts[2] if len(parts) > 2 else "")
    return ServerStats(server, values, queues)
