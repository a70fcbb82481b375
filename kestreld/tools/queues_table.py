"""``kestreld queues``: a table of a running server's queues and fanout readers.

    kestreld queues [--host H] [--port N] [--config FILE] [--json] [login options]

Asks the server over the protocol (``stats`` and ``dump_stats``, one
exchange), so it works wherever a client can connect, and against any
Kestrel-compatible server (figures a server does not report show as ``-``).
One row per queue and per fanout reader (``orders+audit`` under ``orders``):

- ITEMS, BYTES: waiting items and their bytes (open reads excluded)
- OPEN: open reads (``get q/open`` not yet closed)
- WAITERS: clients blocked in a ``get q/t=...``
- OLDEST: how long the oldest waiting item has waited
- JOURNAL: bytes of the journal files (a queue's readers share its journal)

The login options (``--tls``, ``--tls-ca-file``, ``--user``, ...;
:mod:`kestreld.tools.endpoint`) reach a server with TLS or an auth file; any
user may read the figures (no role needed).

Exit status 0, 1 when the server cannot be reached or TLS or the login
failed (the message says which), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

from kestreld.client.errors import KestrelError
from kestreld.client.stats import parse_stats
from kestreld.tools.endpoint import (
    EndpointError,
    Login,
    Server,
    add_server_options,
    default_server,
    explain,
    login_from,
)


@dataclass(slots=True)
class QueueRow:
    """One queue or fanout reader; None where the server does not report the figure."""

    name: str
    items: int | None
    bytes: int | None
    open_reads: int | None
    waiters: int | None
    oldest_item_age_ms: int | None
    journal_bytes: int | None


def fetch_rows(server: Server, timeout: float = 10.0, login: Login | None = None) -> list[QueueRow]:
    """The queues of a running server, sorted by name (readers after their queue)."""
    conn = (login or Login()).connect(server, timeout)
    try:
        stats = parse_stats(server.address, *conn.stats())
    finally:
        conn.close()
    rows = []
    for name in sorted(stats.queues, key=lambda n: n.split("+", 1)):
        values = stats.queues[name]
        if "put_items" in values and "items" not in values:
            continue  # an alias: it holds nothing (its destinations have their rows)
        rows.append(
            QueueRow(
                name,
                values.get("items"),
                values.get("bytes"),
                values.get("open_transactions"),
                values.get("waiters"),
                values.get("oldest_item_age"),
                values.get("logsize"),
            )
        )
    return rows


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n}{unit}" if unit == "B" else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n:.1f}TiB"  # pragma: no cover


def human_age(ms: int | None) -> str:
    if ms is None:
        return "-"
    seconds = ms / 1000
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, seconds = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours // 24}d{hours % 24:02d}h"


def _count(n: int | None) -> str:
    return "-" if n is None else str(n)


def render_table(rows: list[QueueRow]) -> str:
    header = ("QUEUE", "ITEMS", "BYTES", "OPEN", "WAITERS", "OLDEST", "JOURNAL")
    lines = [header]
    for r in rows:
        name = r.name if "+" not in r.name else "  +" + r.name.split("+", 1)[1]
        lines.append(
            (
                name,
                _count(r.items),
                human_bytes(r.bytes),
                _count(r.open_reads),
                _count(r.waiters),
                human_age(r.oldest_item_age_ms),
                human_bytes(r.journal_bytes),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = []
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
        ]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out) + "\n"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld queues",
        description="Show a running server's queues and fanout readers: items, bytes, open "
        "reads, waiters, age of the oldest item, journal size.",
    )
    add_server_options(p)
    p.add_argument("--timeout", type=float, default=10.0, help="seconds to wait (default 10)")
    p.add_argument("--json", action="store_true", help="one JSON object per queue, one per line")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        server = default_server(args)
        login = login_from(args)
    except EndpointError as e:
        print(f"kestreld queues: {e}", file=sys.stderr)
        return 2
    try:
        rows = fetch_rows(server, args.timeout, login)
    except KestrelError as e:
        print(
            f"kestreld queues: {server.address}: {explain(e, login, 'read stats')}", file=sys.stderr
        )
        return 1
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
    elif rows:
        sys.stdout.write(render_table(rows))
    else:
        print(f"no queues on {server.address}")
    return 0
