"""Why the session refused a request: each front end renders these its own way."""

from __future__ import annotations


class SessionError(Exception):
    """A request the session could not carry out; ``str(e)`` says why."""


class NotStored(SessionError):
    """A put the queue refused (full, without ``discard_old_when_full``): memcache ``NOT_STORED``."""


class PutFailed(SessionError):
    """A put whose journal write failed: nothing was stored."""


class NotWritable(SessionError):
    """The server refuses the request now: its status (READONLY, QUIESCENT: ``server is
    <status>``) or its connection count (``too many connections for writes`` / ``reads``)."""


class NoOpenRead(SessionError):
    """A confirm or abort of a queue on which this session holds no open read."""


class QueueRefused(PutFailed):
    """A new queue name beyond ``max_queues``: nothing was created (``SERVER_ERROR``)."""


class NoSuchQueue(SessionError):
    """The queue does not exist and ``create_queue_on_get`` is off: nothing to read."""
