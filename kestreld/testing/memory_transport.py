"""An in-memory transport: drive real connections in process, without sockets.

Used by the in-process benchmark of the hot path (``scripts/bench-hotpath``)
and by tests that look at a connection's own state after many requests.
"""

from __future__ import annotations

import asyncio
from typing import Any


class MemoryTransport(asyncio.Transport):
    """Takes every write (kept in ``data``, or only counted with ``keep=False``); never pushes back."""

    def __init__(self, *, keep: bool = True) -> None:
        super().__init__()
        self.keep = keep
        self.data = bytearray()
        self.written = 0
        self.closed = False
        self.reading = True  # pause_reading / resume_reading, as a socket's transport

    def write(self, data: Any) -> None:
        self.written += len(data)
        if self.keep:
            self.data += data

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 0) if name == "peername" else default

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def is_reading(self) -> bool:
        return self.reading

    def get_write_buffer_size(self) -> int:
        return 0  # every write is taken at once

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed
