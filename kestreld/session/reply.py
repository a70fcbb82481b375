"""A reply promised to the client, held in its place in the output until the journal has it.

A ``set`` is acknowledged once its journal batch is written (or fsynced); a
confirm (``/close``, ``confirm``, a plain get) once its progress record is.
The session hands the front end one :class:`PendingReply` for each: the
front end puts it in its ordered output, fills :attr:`parts` with the bytes
to send on success, and writes nothing after it until it is :meth:`done`.
Then :meth:`settle` says how it resolved: ``None`` (send :attr:`parts`) or
the error text (send the front end's error line instead, and call
:meth:`kestreld.session.session.Session.reply_failed`, which undoes what the
request did).  The journal's batch stays inside: front ends never read it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kestreld.queues.item import QueueItem
    from kestreld.queues.reader import OpenRead, Reader

#: What a pending reply acknowledges.
PUT = 0
CONFIRM = 1


class PendingReply:
    """One promised reply: its bytes (or an error) once its ticket resolves."""

    __slots__ = (
        "ticket",
        "kind",
        "parts",
        "reader",
        "reopen",
        "give_back",
        "taken",
        "rendered",
        "failed",
    )

    def __init__(self, ticket: Any, kind: int, reader: Reader | None = None) -> None:
        self.ticket = ticket  # the queues' batch; opaque to front ends
        self.kind = kind
        #: The reply on success, filled by the front end (a put's is the front end's own
        #: word for stored: None).
        self.parts: list[bytes] | None = [] if kind == CONFIRM else None
        self.reader = reader
        # What to undo if the ticket fails (plain data, not closures: this is per request).
        self.reopen: list[OpenRead] | None = None  # open again (a confirm's, made when needed)
        self.give_back: OpenRead | None = None  # a read the same request opened
        self.taken: QueueItem | None = None  # a plain get's item: back to the head
        self.rendered = False
        self.failed = False

    def undo_reopens(self, read: OpenRead) -> None:
        """If the ticket fails, ``read`` (confirmed by this reply) is open again."""
        if self.reopen is None:
            self.reopen = [read]
        else:
            self.reopen.append(read)

    def undo_gives_back(self, read: OpenRead) -> None:
        """If the ticket fails, ``read`` (opened by the same request) goes back to its queue."""
        self.give_back = read

    def undo_returns(self, item: QueueItem) -> None:
        """If the ticket fails, ``item`` (a plain get's) goes back to the head of its queue."""
        self.taken = item

    def done(self) -> bool:
        """True once the ticket resolved, or its writes are stored ahead of an earlier
        large write (a put's): the reply may be sent."""
        ticket = self.ticket
        return ticket.done or ticket.stored

    def settle(self) -> str | None:
        """The outcome of a done reply, once: None to send :attr:`parts`, else the error text."""
        self.rendered = True
        error = self.ticket.error
        if error is not None:
            self.failed = True
        return error

    def started(self) -> float:
        """When its ticket's batch began (``perf_counter``): the latency of a put."""
        return self.ticket.started

    def size(self) -> int:
        """Bytes of :attr:`parts` (for back-pressure)."""
        parts = self.parts
        return sum([len(p) for p in parts]) if parts else 0


# The hot paths build their replies without a type call (its argument parsing costs more
# than the fields when compiled) and with one Python frame in the plain build.


def pending_put(ticket: Any) -> PendingReply:
    """The reply of a put, acknowledged once ``ticket`` resolves (no lists)."""
    reply = PendingReply.__new__(PendingReply)
    reply.ticket = ticket
    reply.kind = PUT
    reply.parts = None
    reply.reader = None
    reply.reopen = None
    reply.give_back = None
    reply.taken = None
    reply.rendered = False
    reply.failed = False
    return reply


def pending_confirm(ticket: Any, reader: Reader) -> PendingReply:
    """The reply of a confirm of ``reader`` (a ``/close``'s, a plain get's), acknowledged
    once ``ticket`` resolves."""
    reply = PendingReply.__new__(PendingReply)
    reply.ticket = ticket
    reply.kind = CONFIRM
    reply.parts = []
    reply.reader = reader
    reply.reopen = None
    reply.give_back = None
    reply.taken = None
    reply.rendered = False
    reply.failed = False
    return reply
