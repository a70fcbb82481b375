"""Kestrel's text protocol, as bytes in and requests out (sans-IO: no socket, no queue).

A request is one line ending in ``\\n`` (a ``\\r`` before it is dropped): a
command word and its arguments, separated by spaces.  A line ending in ``:``
starts a request with items (``put <queue> [expiry_ms]:``): one item per line
follows, and an empty line ends it.  :class:`TextParser` turns whatever bytes
arrived into complete :class:`TextRequest` values and :class:`TextError`
values, in order, and keeps the rest for the next call, so the stream stays in
step after every error but a fatal one.
"""

from __future__ import annotations

from dataclasses import dataclass

from kestreld.frontends.core.limits import MAX_REQUEST_ITEM_BYTES

#: Most items one ``put`` may carry (Kestrel's MAX_PUT_BUFFER).
MAX_PUT_ITEMS = 1024
#: Most item bytes one ``put`` may carry (the connection core's limit on one request).
MAX_PUT_BYTES = MAX_REQUEST_ITEM_BYTES


@dataclass(slots=True)
class TextRequest:
    """One complete request: the command word (lower case), its arguments, its items."""

    command: bytes
    args: list[bytes]
    items: list[bytes] | None = None  # None: a plain line; a list: it ended in ':'


@dataclass(slots=True)
class TextError:
    """A request that cannot run; ``fatal``: the stream cannot be followed any more."""

    message: str
    fatal: bool = False


class TextParser:
    """Splits the byte stream of one connection into requests.

    ``max_line``: the longest request line; ``max_item``: the longest item line
    of a put; ``max_items``: most items in one put.  A longer line is fatal (the
    parser cannot tell where the next request starts without reading it all);
    a put with too many items is skipped to its empty line and answered with
    one error, nothing of it stored.
    """

    __slots__ = (
        "max_line", "max_item", "max_items", "max_bytes", "buf", "scanned", "put", "put_bytes",
        "put_error", "dead",
    )  # fmt: skip

    def __init__(
        self,
        max_line: int,
        max_item: int,
        max_items: int = MAX_PUT_ITEMS,
        max_bytes: int = MAX_PUT_BYTES,
    ) -> None:
        self.max_line = max_line
        self.max_item = max_item
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.put_bytes = 0  # item bytes of the put being read
        self.buf = bytearray()
        self.scanned = 0  # bytes of buf known to hold no '\n' (a long line is not rescanned)
        #: The put whose items are being read, or None.
        self.put: TextRequest | None = None
        self.put_error: str | None = None  # that put is being skipped: its error
        self.dead = False  # after a fatal error nothing more is parsed

    @property
    def pending(self) -> int:
        """Bytes held for an incomplete line."""
        return len(self.buf)

    def feed(self, data: bytes) -> list[TextRequest | TextError]:
        """Every complete request (or error) in what arrived so far, in order."""
        if self.dead:
            return []
        buf = self.buf
        buf += data
        events: list[TextRequest | TextError] = []
        pos = 0
        start = self.scanned
        while True:
            limit = self.max_line if self.put is None else self.max_item
            nl = buf.find(b"\n", start)
            if nl < 0:
                if len(buf) - pos > limit + 1:  # +1: room for a '\r'
                    self._fatal(events, limit)
                break
            end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl  # drop one '\r'
            if end - pos > limit:
                self._fatal(events, limit)
                break
            line = bytes(buf[pos:end])
            pos = start = nl + 1
            if self.put is None:
                self._line(line, events)
            else:
                self._item(line, events)
        if self.dead:
            buf.clear()
        elif pos:
            del buf[:pos]
        self.scanned = len(buf)
        return events

    def _line(self, line: bytes, events: list[TextRequest | TextError]) -> None:
        if line.endswith(b":"):
            words = line[:-1].split()
            command = words[0].lower() if words else b""
            self.put = TextRequest(command, words[1:], [])
            self.put_error = None
            self.put_bytes = 0
            return
        words = line.split()
        if not words:
            events.append(TextRequest(b"", []))
            return
        events.append(TextRequest(words[0].lower(), words[1:]))

    def _item(self, line: bytes, events: list[TextRequest | TextError]) -> None:
        put = self.put
        assert put is not None and put.items is not None
        if not line:
            self.put = None
            if self.put_error is not None:
                events.append(TextError(self.put_error))
            else:
                events.append(put)
            return
        if self.put_error is not None:
            return  # skipping to the empty line, keeping nothing
        if len(put.items) >= self.max_items:
            put.items.clear()
            self.put_error = f"Too many items in one put (at most {self.max_items})."
            return
        self.put_bytes += len(line)
        if self.put_bytes > self.max_bytes:
            # One request is held whole before it runs: its size bounds the connection's input.
            put.items.clear()
            self.put_error = f"Too many bytes in one put (at most {self.max_bytes})."
            return
        put.items.append(line)

    def _fatal(self, events: list[TextRequest | TextError], limit: int) -> None:
        what = "Item" if self.put is not None else "Request line"
        events.append(TextError(f"{what} too long (at most {limit} bytes).", fatal=True))
        self.dead = True
        self.put = None


__all__ = ["MAX_PUT_BYTES", "MAX_PUT_ITEMS", "TextError", "TextParser", "TextRequest"]
