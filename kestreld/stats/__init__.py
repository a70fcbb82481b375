"""Server and per-queue figures: the ``stats`` text (and later the metrics endpoint)."""

from kestreld.stats.counters import (
    QUEUE_STAT_KEYS,
    ServerStats,
    StatLinesCache,
    alias_stats,
    global_stats,
    queue_stats,
    render_dump_stats,
    render_stats,
)

__all__ = [
    "QUEUE_STAT_KEYS",
    "ServerStats",
    "StatLinesCache",
    "alias_stats",
    "global_stats",
    "queue_stats",
    "render_dump_stats",
    "render_stats",
]
