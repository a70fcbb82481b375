"""An item taken with a reliable read (``get <queue>/open``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class ItemState(enum.Enum):
    #: Reserved: the server holds it for this client until confirmed or aborted.
    OPEN = "open"
    #: Confirmed: removed from the queue for good.
    CONFIRMED = "confirmed"
    #: Given back to the head of the queue, by ``abort`` or because the
    #: connection that held it broke (then the server gives it back itself,
    #: at once or, if it crashed, when it restarts).
    ABORTED = "aborted"


@dataclass(slots=True, eq=False)
class Item:
    """One open read: its data, and the connection and server it is pinned to.

    Confirm or abort it through the client that returned it.  Until then the
    server holds the item for this client alone; if the client dies, the
    connection closes and the server gives the item back.
    """

    queue: str
    data: bytes
    #: ``host:port`` of the server that holds the item.
    server: str
    state: ItemState = ItemState.OPEN
    #: The connection the read is open on (internal to the client).
    connection: Any = field(default=None, repr=False)

    @property
    def is_open(self) -> bool:
        return self.state is ItemState.OPEN

    def text(self, encoding: str = "utf-8") -> str:
        """The data decoded as text."""
        return self.data.decode(encoding)
