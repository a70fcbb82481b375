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

from collections.abc import Callable

from kestreld.journal.batch import Batch


class ConfirmReply:
    __slots__ = ("batch", "parts", "undo", "rendered", "failed")

    def __init__(self, batch: Batch) -> None:
        self.batch = batch
        self.parts: list[bytes] = []  # the reply, sent once the batch succeeded
        self.undo: list[Callable[[], None]] = []  # run if it failed
        self.rendered = False
        self.failed = False

    @property
    def done(self) -> bool:
        return self.batch.done

    def render(self) -> bytes:
        """The bytes to send now that the batch resolved (runs the undo steps on failure)."""
        self.rendered = True
        error = self.batch.error
        if error is None:
            return b"".join(self.parts)
        self.failed = True
        for step in self.undo:
            step()
        return b"SERVER_ERROR %s\r\n" % error.encode("utf-8", "replace")
