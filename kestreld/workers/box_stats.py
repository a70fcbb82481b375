"""One ``stats`` (and ``dump_stats``, ``dump_config``) for the box, from every worker's.

Counters are summed over the workers; a queue's lines come from its owner (no other
worker has them); an alias exists in every worker, and its counters are summed too.
Lines that describe one process (``uptime``, ``version``, ``status``, ...) are the first
answering worker's.  A worker's connection counts are its clients' already (its channel
connections are the workers' own: :meth:`Server.clients`).
"""

from __future__ import annotations

#: Server lines that are counts: the box's is the sum.
SUMMED = frozenset(
    {
        "curr_items",
        "total_items",
        "bytes",
        "curr_connections",
        "total_connections",
        "cmd_get",
        "cmd_set",
        "cmd_peek",
        "get_hits",
        "get_misses",
        "bytes_read",
        "bytes_written",
        "queue_creates",
        "queue_deletes",
        "queue_expires",
        "auth_successes",
        "auth_failures",
        "queue_create_refusals",
        "worker_requests_local",
        "worker_requests_crossed",
        "handoffs",
        "handoffs_received",
        "loop_hold_probes",
        "loop_hold_over_1ms",
    }
)
#: Server lines that are each worker's longest: the box's is the longest of them.
LONGEST = frozenset({"loop_hold_max_us"})
#: Lines of one worker, left out of the box's: its channel connections (open, ever).
CHANNEL_OPEN = "worker_channel_connections"
CHANNEL_TOTAL = "worker_channel_connections_total"
_PER_WORKER = frozenset({"worker", CHANNEL_OPEN, CHANNEL_TOTAL})


def _stat_lines(raw: bytes) -> list[tuple[str, str]]:
    out = []
    for line in raw.decode("utf-8", "replace").split("\r\n"):
        if line.startswith("STAT "):
            _, key, value = (line.split(" ", 2) + [""])[:3]
            out.append((key, value))
    return out


def merge_stats(replies: list[bytes | None], serving: int) -> bytes:
    """The box's ``stats`` reply from the workers' (None: a worker that did not answer);
    ``serving``: the worker of the connection that asked (its ``worker`` line)."""
    answered = [_stat_lines(r) for r in replies if r is not None]
    if not answered:
        return b"SERVER_ERROR no worker answered\r\n"
    order: list[str] = []
    values: dict[str, str] = {}
    for lines in answered:
        for key, value in lines:
            if key in _PER_WORKER:
                continue
            if key not in values:
                order.append(key)
                values[key] = value
            elif key in SUMMED or key.startswith("queue_"):
                values[key] = _add(values[key], value)
            elif key in LONGEST:
                values[key] = str(max(int(values[key]), int(value)))
    lines = [f"STAT {key} {values[key]}" for key in order]
    lines.append(f"STAT worker {serving}")
    lines.append(f"STAT workers {len(replies)}")
    lines.append(f"STAT workers_answering {len(answered)}")
    lines.append("END\r\n")
    return "\r\n".join(lines).encode()


def _add(a: str, b: str) -> str:
    if a.lstrip("-").isdigit() and b.lstrip("-").isdigit():
        return str(int(a) + int(b))
    return a  # not a count (a name, a ratio): the first worker's


def merge_dump(replies: list[bytes | None]) -> bytes:
    """``dump_stats`` / ``dump_config``: every worker's blocks, each once, sorted by name."""
    blocks: dict[str, str] = {}
    for raw in replies:
        if raw is None:
            continue
        text = raw.decode("utf-8", "replace")
        if text.startswith(("SERVER_ERROR", "CLIENT_ERROR", "ERROR")):
            return raw
        current: list[str] = []
        for line in text.split("\r\n"):
            if line == "END" or not line:
                continue
            current.append(line)
            if line == "}":
                head = current[0]
                blocks.setdefault(head, "\r\n".join(current))
                current = []
    body = [blocks[head] for head in sorted(blocks, key=_block_name)]
    body.append("END\r\n")
    return "\r\n".join(body).encode()


def _block_name(head: str) -> str:
    """``queue 'jobs' {`` -> jobs (alias blocks sort among the queues, as one server's)."""
    start = head.find("'")
    end = head.rfind("'")
    return head[start + 1 : end] if 0 <= start < end else head
