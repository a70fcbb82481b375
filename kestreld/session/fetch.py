"""One get as the session sees it: what to fetch, and what came of it.

A front end parses its own syntax into a :class:`Fetch` (memcache's
``get q/t=500/close/open`` sets ``close``, ``open`` and ``timeout``), hands it
to :meth:`kestreld.session.session.Session.fetch`, and renders the outcome.
One object per get carries both ways, so the hot path allocates nothing else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kestreld.queues.item import QueueItem
    from kestreld.queues.reader import Reader
    from kestreld.session.reply import PendingReply

#: Outcomes of a fetch (``Fetch.outcome``).
ITEM = 0  # ``item`` is the reply's item
MISS = 1  # no item (a get's empty reply)
WAIT = 2  # a wait began: the listener's ``wait_ended`` follows
REFUSED = 3  # the server refuses fetches (QUIESCENT, or too many connections for reads)
BUSY = 4  # a read of this queue is open and the get may not open another (memcache ERROR)
GONE = 5  # a wait ended with nothing to add: its /close failed and replaced the reply
LIMITED = 6  # a new queue name beyond max_queues: refused, nothing created


class Fetch:
    """Options of one get, then its outcome (set by the session)."""

    __slots__ = (
        "name",
        "timeout",
        "open",
        "close",
        "abort",
        "peek",
        "key",
        "with_id",
        "outcome",
        "item",
        "reply",
        "behind",
        "reader",
        "started",
    )

    def __init__(self) -> None:
        self.name = ""  # the queue (``q`` or ``q+reader``)
        self.timeout = 0  # ms to wait for an item; 0: do not wait
        self.open = self.close = self.abort = self.peek = False
        self.key = b""  # the front end's own name for this get (echoed in its reply)
        self.with_id = False  # the front end shows the item's id (memcache ``gets``)
        self.outcome = MISS
        self.item: QueueItem | None = None
        #: A reply to put in the output now: this get's /close, or a plain get's confirm.
        self.reply: PendingReply | None = None
        #: After a wait: the /close reply placed before it; the rest of the reply goes
        #: inside it (``parts``) unless it was already sent.
        self.behind: PendingReply | None = None
        self.reader: Reader | None = None
        self.started = 0.0  # perf_counter when a wait began

    def fetches(self) -> bool:
        """True when the get asks for an item (not only a /close or /abort)."""
        return self.open or not (self.close or self.abort)

    def again(self) -> Fetch:
        """A new get with these options (what a front end parsed) and no outcome yet: a front
        end keeps one parsed Fetch per distinct key and starts each request from it."""
        f = Fetch()  # the outcome's fields start as __init__ sets them: one list of defaults
        f.name = self.name
        f.timeout = self.timeout
        f.open = self.open
        f.close = self.close
        f.abort = self.abort
        f.peek = self.peek
        f.key = self.key
        return f
