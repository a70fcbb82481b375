"""Session trace (Kestrel's ``enable_session_trace``): one event when a client session
starts and one when it ends, and the client's address on the queue events it causes.

The server holds a :class:`SessionTrace` while the trace is on (None otherwise).  A
:class:`~kestreld.session.session.Session` asks it for a :class:`TracedSession` when
its front end accepts the client (:meth:`Session.begin`); with the trace off the
session holds None and each place below costs one ``is not None`` check.  The session
counts the items it hands out (a get, open or plain, and monitor items; not a peek)
and ends the trace in :meth:`Session.close` with the open reads it gave back (every
way a session ends passes there, a server stop included).  The front end counts each
command word it dispatches and runs a batch of requests between
:meth:`TracedSession.running` and :meth:`TracedSession.idle`: meanwhile every log event
carries ``client`` and ``session`` (``queue_created``, ``queue_deleted``,
``reader_deleted`` and ``queue_flushed`` come from the queue layer, which knows no
clients).  So every front end on the session layer gets the trace.

Events: ``session_started`` (session, client) and ``session_ended`` (session, client,
seconds, commands: ``word=count`` pairs joined by commas, in word order, items_taken,
open_reads_given_back): flat fields, as every event.
"""

from __future__ import annotations

import itertools
import time

import structlog
from structlog.contextvars import bind_contextvars, unbind_contextvars

log = structlog.get_logger("kestreld.session")

_CONTEXT_KEYS = ("client", "session")


def client_address(peer: object) -> str:
    """``host:port`` of a socket peer (``[v6]:port`` for IPv6), or its repr."""
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"
    return str(peer)


class TracedSession:
    """What one client session did; it logs itself when it ends."""

    __slots__ = ("id", "client", "started", "commands", "items_taken", "ended")

    def __init__(self, session_id: int, client: str) -> None:
        self.id = session_id
        self.client = client
        self.started = time.monotonic()
        self.commands: dict[str, int] = {}
        self.items_taken = 0
        self.ended = False

    def command(self, word: bytes) -> None:
        name = word.decode("ascii", "replace").lower()
        self.commands[name] = self.commands.get(name, 0) + 1

    def taken(self) -> None:
        """One item was handed to this session (a get, open or plain; not a peek)."""
        self.items_taken += 1

    def running(self) -> None:
        """The session's requests run now: log events carry its client (until :meth:`idle`)."""
        bind_contextvars(client=self.client, session=self.id)

    def idle(self) -> None:
        unbind_contextvars(*_CONTEXT_KEYS)

    def end(self, open_reads_given_back: int) -> None:
        """The session is over (logged once)."""
        if self.ended:
            return
        self.ended = True
        log.info(
            "session_ended",
            session=self.id,
            client=self.client,
            seconds=round(time.monotonic() - self.started, 3),
            commands=",".join(f"{word}={n}" for word, n in sorted(self.commands.items())),
            items_taken=self.items_taken,
            open_reads_given_back=open_reads_given_back,
        )


class SessionTrace:
    """Numbers sessions and starts their traces."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)

    def start(self, peer: object) -> TracedSession:
        session = TracedSession(next(self._ids), client_address(peer))
        log.info("session_started", session=session.id, client=session.client)
        return session
