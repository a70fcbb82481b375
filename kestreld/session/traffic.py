"""The server-wide counters of client traffic: bytes each way, gets, sets, hits, misses.

They change on every request, so they are an object of their own: a ``cdef`` class
with C fields in the compiled build (``traffic.pxd``), which the front ends and
sessions add to without a Python attribute lookup.  It imports nothing:
:class:`~kestreld.stats.counters.ServerStats` holds the server's one instance and
shows them under the same names.
"""

from __future__ import annotations


class Traffic:
    __slots__ = (
        "cmd_get",
        "cmd_set",
        "cmd_peek",
        "get_hits",
        "get_misses",
        "bytes_read",
        "bytes_written",
    )

    def __init__(self) -> None:
        self.cmd_get = 0
        self.cmd_set = 0
        self.cmd_peek = 0
        self.get_hits = 0
        self.get_misses = 0
        self.bytes_read = 0
        self.bytes_written = 0


#: The counters, in the order ``stats`` shows them (the compiled class keeps ``__slots__`` too).
COUNTERS: tuple[str, ...] = Traffic.__slots__
