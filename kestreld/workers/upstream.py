"""One connection from a worker to another worker's channel, and the framing of its replies.

The requests are memcache text requests as a client sent them; the owner serves them
with its ordinary session, so its replies come back in request order and each one is
framed the way the client will read it: ``VALUE`` blocks, then one line (a get, a set, a
delete, a monitor), or lines up to ``END`` (``stats``, ``dump_stats``, ``dump_config``).
A request sent with ``noreply`` expects nothing.  A ``monitor``'s items may be passed on
one by one as they arrive (``item``), as a lone server sends them, and its last ``END``
is its answer.  When the channel is lost (the owner died), every reply still expected is
answered with ``None``: the caller says so to its client, and the next request opens a
new connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections import deque
from collections.abc import Callable

import structlog

log = structlog.get_logger("kestreld.workers")

#: Reply shapes.
ONE = 0  # VALUE blocks, then one line
LIST = 1  # lines up to END (or an error line)
MONITOR = 2  # items, each a get's reply (VALUE block, END), then END

_ERRORS = (b"ERROR", b"CLIENT_ERROR", b"SERVER_ERROR")

#: What a caller is told: the reply's bytes, or None when the channel was lost first.
Answer = Callable[[bytes | None], None]
#: Told each whole item of a monitor (its VALUE block and END) as it arrives.
Item = Callable[[bytes], None]


def item_end(buf: bytes, pos: int) -> int:
    """Where the monitor item starting at ``pos`` (its VALUE block, then END) ends; -1 when
    no whole item starts there (not all here yet, or the reply's last line)."""
    if not buf.startswith(b"VALUE ", pos):
        return -1
    eol = buf.find(b"\r\n", pos)
    if eol < 0:
        return -1
    try:
        size = int(buf[pos:eol].split()[3])
    except (IndexError, ValueError):
        return -1  # not an item line: reply_end relays it
    end = eol + 2 + size + 2
    return end + 5 if buf.startswith(b"END\r\n", end) else -1


def reply_end(buf: bytes, pos: int, shape: int) -> int:
    """Where the reply starting at ``pos`` ends (just past its last CRLF); -1: not all here."""
    after_value = False
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            return -1
        if after_value and shape == MONITOR and buf[pos:eol] == b"END":
            after_value = False  # the END of one item
            pos = eol + 2
            continue
        if buf.startswith(b"VALUE ", pos):
            words = buf[pos:eol].split()
            try:
                size = int(words[3])
            except (IndexError, ValueError):
                return eol + 2  # not a value line after all: let the caller relay it as is
            pos = eol + 2 + size + 2
            if pos > len(buf):
                return -1
            after_value = True
            continue
        if shape == LIST and not buf.startswith(_ERRORS, pos) and buf[pos:eol] != b"END":
            pos = eol + 2
            continue
        return eol + 2


def whole_items_end(buf: bytes) -> int:
    """Where the whole get replies (``VALUE`` block, ``END``) at the start of ``buf`` end."""
    pos = 0
    while buf.startswith(b"VALUE ", pos):
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            break
        try:
            size = int(buf[pos:eol].split()[3])
        except (IndexError, ValueError):
            break
        end = eol + 2 + size + 2
        if not buf.startswith(b"END\r\n", end):
            break
        pos = end + 5
    return pos


class Upstream(asyncio.Protocol):
    """A connection to worker ``index``'s channel; requests are answered in order."""

    def __init__(self, index: int, path: str) -> None:
        self.index = index
        self.path = path
        self.transport: asyncio.Transport | None = None
        #: Bytes to send once connected.
        self.unsent: list[bytes] = []
        #: The replies expected, oldest first: (shape, answer, a monitor's item or None).
        self.expected: deque[tuple[int, Answer, Item | None]] = deque()
        self.buf = b""
        self.lost = False
        self.closing = False
        self.eof = False  # no more requests: the owner answers what it has, then closes

    def open(self, loop: asyncio.AbstractEventLoop) -> None:
        """Connect (a local socket connects at once or not at all; raises OSError)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(self.path)
        except OSError:
            sock.close()
            raise
        sock.setblocking(False)
        loop.create_task(self._attach(loop, sock))

    async def _attach(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        try:
            await loop.create_unix_connection(lambda: self, sock=sock)
        except OSError as e:
            log.warning("worker_channel_failed", worker=self.index, error=str(e))
            with contextlib.suppress(OSError):
                sock.close()
            self.connection_lost(e)
            return
        if not isinstance(loop, asyncio.BaseEventLoop):  # uvloop, the server's loop
            # libuv owns the descriptor now and closes it with the transport.  uvloop takes
            # it from ``sock`` only when the transport closes after this point: one closed
            # already (the client left while its channel connected) would leave ``sock`` to
            # close the number again when collected, by then another connection's (the
            # worker aborted in libuv: the memcache fuzzer at workers = 2).  asyncio's own
            # loop keeps ``sock`` as its transport's socket: nothing to do there.
            sock.detach()

    # --- what the router calls ------------------------------------------------------------

    def request(
        self, data: bytes, shape: int, answer: Answer | None, item: Item | None = None
    ) -> None:
        """Send a request; ``answer`` is called with its reply (None: ``noreply``).  With
        ``item`` (a monitor's), each whole item is passed to it as it arrives, and
        ``answer`` gets what follows the last (its END)."""
        if self.lost or self.eof:  # after finish() nothing more may be written
            if answer is not None:
                answer(None)
            return
        if answer is not None:
            self.expected.append((shape, answer, item))
        if self.transport is None:
            self.unsent.append(data)
        else:
            self.transport.write(data)

    def in_flight(self) -> int:
        """Replies expected and not yet received."""
        return len(self.expected)

    def finish(self) -> None:
        """The client sent its last request (or the server stops): the owner ends a wait
        in progress with its empty reply, answers the rest, and closes (a half-close, as a
        client's own)."""
        if self.eof or self.lost:
            return
        self.eof = True
        if self.transport is not None:
            self.transport.write_eof()

    def close(self) -> None:
        """The client left: closing the channel connection gives its open reads back there."""
        self.closing = True
        if self.transport is not None:
            self.transport.close()
        else:
            self.lost = True  # _attach closes it as soon as it is made

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        if self.closing:
            transport.close()
            return
        if self.unsent:
            self.transport.writelines(self.unsent)  # type: ignore[union-attr]
            self.unsent = []
        if self.eof:
            self.transport.write_eof()  # type: ignore[union-attr]

    def eof_received(self) -> bool | None:
        return False  # the owner closed its side: so do we (connection_lost follows)

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        pos = 0
        expected = self.expected
        while expected:
            shape, answer, item = expected[0]
            if item is not None:  # each whole item goes on now
                end = item_end(buf, pos)
                while end > 0:
                    item(buf[pos:end])
                    pos = end
                    end = item_end(buf, pos)
            end = reply_end(buf, pos, shape)
            if end < 0:
                break
            expected.popleft()
            answer(buf[pos:end])
            pos = end
        self.buf = buf[pos:]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost and not self.expected:
            return
        self.lost = True
        self.unsent = []
        expected, self.expected = self.expected, deque()
        if expected and self.eof and expected[0][0] == MONITOR:
            # A monitor our half-close ended: the owner sent its whole items and no END,
            # as to a client of its own, and closed (the items' reads go back there).
            _, answer, _item = expected.popleft()
            answer(self.buf[: whole_items_end(self.buf)])
        self.buf = b""
        if expected:
            log.warning("worker_channel_lost", worker=self.index, replies_lost=len(expected))
        for _, answer, _item in expected:
            answer(None)
