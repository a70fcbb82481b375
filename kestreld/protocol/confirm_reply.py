"""A reply held until the confirms it acknowledges are durable.

``get q/close``, ``get q/close/open``, ``confirm`` and a plain ``get`` each
confirm an item; the queue layer hands back a ticket (the same group-commit
:class:`Batch` a ``set`` waits on) and the reply waits in the connection's
output for it, exactly like ``STORED``.  If the confirm could not be made
durable the reply becomes ``SERVER_ERROR <reason>`` and the undo steps run:
the confirmed read is open again and anything the same request handed out is
given back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kestreld.queues.item import QueueItem
    from kestreld.queues.journaled_queue import Batch
    from kestreld.queues.reader import OpenRead, Reader


class ConfirmReply:
    __slots__ = ("batch", "parts", "reader", "reopen", "give_back", "taken", "rendered", "failed")

    def __init__(self, batch: Batch, reader: Reader) -> None:
        self.batch = batch
        self.parts: list[bytes] = []  # the reply, sent once the batch succeeded
        self.reader = reader
        # What to undo if the batch failed (plain data, not closures: this is per request).
        self.reopen: list[OpenRead] = []  # the reads it confirmed: open again
        self.give_back: OpenRead | None = None  # a read the same request opened
        self.taken: QueueItem | None = None  # a plain get's item: back to the head
        self.rendered = False
        self.failed = False

    @property
    def done(self) -> bool:
        return self.batch.done

    def render(self) -> bytes:
        """The bytes to send now that the batch resolved.

        On failure the caller undoes it (:attr:`failed` is set); the reply is
        ``SERVER_ERROR <reason>``.
        """
        self.rendered = True
        error = self.batch.error
        if error is None:
            return b"".join(self.parts)
        self.failed = True
        return b"SERVER_ERROR %s\r\n" % error.encode("utf-8", "replace")
