"""One client connection: the memcache text protocol, parsed incrementally.

``data_received`` parses every complete request in the bytes that arrived
(pipelined requests, requests split across packets, data blocks holding any
bytes) and dispatches on the command word.  Replies are collected and written
once per batch of requests.  A ``set`` is acknowledged only when its journal
batch is written (or fsynced, with ``sync_journal = 0``): its reply waits in
the output list as a pending :class:`Batch` and later replies queue behind it,
so replies always come back in request order.

A request that must wait (a blocking get, ``monitor``) suspends parsing until
it completes; the rest of the input stays buffered, and reading is paused
when too much piles up.  A client that does not read its replies pauses
reading too (``pause_writing``), so nothing is buffered without bound.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

import structlog

from kestreld.journal.files import split_queue_name
from kestreld.journal.writer import Batch, JournalWriteError
from kestreld.protocol.confirm_reply import ConfirmReply
from kestreld.protocol.status import ServerStatus
from kestreld.queues.journaled_queue import QueueFull
from kestreld.queues.reader import OpenRead, Reader

if TYPE_CHECKING:
    from kestreld.protocol.server import Server

log = structlog.get_logger("kestreld.protocol")

STORED = b"STORED\r\n"
NOT_STORED = b"NOT_STORED\r\n"
END = b"END\r\n"
ERROR = b"ERROR\r\n"
DELETED = b"DELETED\r\n"
VALUE_END = b"\r\nEND\r\n"

#: Input held while a request waits, before reading from the socket pauses.
INPUT_PAUSE_LIMIT = 1024 * 1024
#: Reply bytes produced before they are handed to the transport (back-pressure check).
OUTPUT_FLUSH_SIZE = 256 * 1024
#: Bytes of a partial data block below which we simply concatenate packets.
ACCUMULATE_THRESHOLD = 64 * 1024

_RELATIVE_EXPIRY_LIMIT = 1_000_000
_MAX_TIME_MS = (1 << 63) - 1


class _Get:
    """Parsed options of ``get <q>[/t=ms][/open][/close][/abort][/peek]``."""

    __slots__ = ("name", "timeout", "open", "close", "abort", "peek")

    def __init__(self) -> None:
        self.name = ""
        self.timeout = 0
        self.open = self.close = self.abort = self.peek = False


def _client_error(reason: str) -> bytes:
    return b"CLIENT_ERROR " + reason.encode() + b"\r\n"


def _server_error(reason: str) -> bytes:
    return b"SERVER_ERROR " + reason.encode() + b"\r\n"


BAD_QUEUE_NAME = _client_error("bad queue name")


class MemcacheConnection(asyncio.Protocol):
    def __init__(self, server: Server) -> None:
        self.server = server
        self.stats = server.stats
        self.transport: asyncio.Transport | None = None
        self.peer = None
        self.buf = b""
        self.chunks: list[bytes] | None = None  # a large data block arriving in pieces
        self.chunk_len = 0
        self.need = 0
        self.skip = 0  # bytes of an oversized data block still to discard
        self.skip_reply: bytes | None = None
        self.pending_set: tuple[str, int, int, bool] | None = (
            None  # queue, expiry ms, size, noreply
        )
        self.out: list[bytes | Batch | ConfirmReply] = []
        self.out_size = 0  # large reply bytes in self.out
        self.pending_batches = 0
        self.unacked: list[Batch] = []  # batches holding this connection's sets, not yet resolved
        self.held = False  # a request waits for those sets
        self.waiting: asyncio.Future | None = None
        self.closing = False
        self.eof = False  # the client half-closed: finish what it sent, then close
        self.stopping = False  # the server is shutting down (closing_soon)
        self.write_paused = False
        self.read_paused = False
        self.last_active = time.monotonic()
        self.open_reads: dict[Reader, deque[OpenRead]] = {}
        self.waiting_reply: ConfirmReply | None = None  # a get waits for an item behind it
        self.confirm_ticket: Batch | None = None  # the last confirm ticket this connection awaits

    # --- asyncio.Protocol -----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.peer = transport.get_extra_info("peername")
        server = self.server
        if len(server.connections) >= server.config.max_connections:
            log.warning("connection_refused", peer=self.peer, reason="too many connections")
            transport.write(_server_error("too many connections"))  # type: ignore[attr-defined]
            self.closing = True
            transport.close()
            return
        server.connections.add(self)
        self.stats.total_connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if exc is not None:
            log.info("connection_error", peer=self.peer, error=str(exc))
        if self.waiting is not None and not self.waiting.done():
            self.waiting.cancel()
        self.release_open_reads()

    def closing_soon(self) -> None:
        """The server is stopping: take no new request, but still send pending replies."""
        self.stopping = True
        self.waiting = self.waiting or self.server.loop.create_future()
        if self.transport is not None and not self.read_paused:
            self.read_paused = True
            self.transport.pause_reading()

    def release_open_reads(self) -> None:
        """Every open read goes back to the head of its queue, in original order."""
        reads, self.open_reads = self.open_reads, {}
        for reader, queue in reads.items():
            reader.abort(list(queue))

    def pause_writing(self) -> None:
        self.write_paused = True
        self._pause_reading()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._resume()

    def _pause_reading(self) -> None:
        if not self.read_paused and self.transport is not None and not self.closing:
            self.read_paused = True
            self.transport.pause_reading()

    def data_received(self, data: bytes) -> None:
        self.stats.bytes_read += len(data)
        self.last_active = time.monotonic()
        if self.skip:
            n = min(self.skip, len(data))
            self.skip -= n
            data = data[n:]
            if self.skip:
                return
            self._skip_done()
        if self.chunks is not None:
            self.chunks.append(data)
            self.chunk_len += len(data)
            if self.chunk_len < self.need:
                return
            data = b"".join(self.chunks)
            self.chunks = None
        elif self.buf:
            data = self.buf + data
        if self.waiting is not None or self.write_paused or self.closing or self.held:
            self.buf = data
            if len(data) > INPUT_PAUSE_LIMIT:
                self._pause_reading()
            return
        self.buf = b""
        self.process(data)

    def eof_received(self) -> bool | None:
        """The client sent its last byte (``nc -N``, ``shutdown(SHUT_WR)``).

        Every complete request it sent is still answered, acknowledgements of its
        sets included, and then the connection is closed.  Nobody may be
        listening any more, so nothing blocks from here on: a waiting get ends
        now with ``END`` (an item is never handed to a client that may be gone)
        and later gets do not wait.
        """
        self.eof = True
        if self.stopping:
            return True  # the shutdown sends what is pending and closes
        waiting = self.waiting
        if waiting is not None and not waiting.done():
            waiting.cancel()  # its callback replies END (or ends the monitor) and resumes
        else:
            self._finish_if_eof()
        return True  # keep the transport open for the replies; _finish_if_eof closes it

    def _finish_if_eof(self) -> None:
        """After a half-close (callers check ``eof``): close once every request has its reply."""
        if (
            not self.closing
            and self.waiting is None
            and not self.held
            and not self.pending_batches
            and not self.write_paused
        ):
            self._close_after_reply()  # an incomplete request left in buf is dropped

    # --- parsing ------------------------------------------------------------------------

    def process(self, data: bytes) -> None:
        """Run every complete request in ``data``; keep the rest for later."""
        pos = 0
        end = len(data)
        max_line = self.server.config.max_line_length
        commands = _COMMANDS
        while pos < end:
            if self.waiting is not None or self.closing or self.write_paused or self.held:
                break
            pending = self.pending_set
            if pending is not None:
                size = pending[2]
                if end - pos < size + 2:
                    break
                block = data[pos : pos + size]
                ok = data[pos + size : pos + size + 2] == b"\r\n"
                pos += size + 2
                self.pending_set = None
                if ok:
                    self._store(pending[0], pending[1], block, pending[3])
                else:
                    self.out.append(_client_error("bad data chunk"))
                continue
            nl = data.find(b"\n", pos)
            if nl < 0 or nl - pos >= max_line:
                if nl >= 0 or end - pos >= max_line:
                    self.out.append(_client_error("line too long"))
                    self._close_after_reply()
                    pos = end
                break
            stop = nl - 1 if nl > pos and data[nl - 1] == 13 else nl
            args = data[pos:stop].split()
            line_start = pos
            pos = nl + 1
            if not args:
                continue
            handler = commands.get(args[0])
            if handler is None:
                handler = commands.get(args[0].lower())
                if handler is None:
                    name = args[0].lower().decode("ascii", "replace")[:40]
                    self.out.append(_client_error(f"unknown command {name}"))
                    continue
            if self.unacked and handler is not _SET and self._unacked_pending():
                # This connection's sets are not acknowledged yet: what follows
                # must see them (a get after a set gets the item), so wait.
                self.held = True
                pos = line_start
                break
            try:
                handler(self, args)
            except Exception as e:  # a bug must cost one request, not the connection
                log.exception(
                    "command_failed",
                    peer=self.peer,
                    command=args[0][:40].decode("ascii", "replace"),
                )
                self.out.append(_server_error(f"internal error: {type(e).__name__}"))
            if self.out_size > OUTPUT_FLUSH_SIZE:
                self.flush_out()  # may pause us (pause_writing) before the next request
            if self.skip:
                n = min(self.skip, end - pos)
                self.skip -= n
                pos += n
                if self.skip:
                    break
                self._skip_done()
        rest = data[pos:] if pos < end else b""
        if self.pending_set is not None and len(rest) < self.pending_set[2] + 2:
            need = self.pending_set[2] + 2
            if need > ACCUMULATE_THRESHOLD and self.waiting is None:
                self.chunks = [rest]
                self.chunk_len = len(rest)
                self.need = need
                rest = b""
        self.buf = rest
        self.flush_out()
        if self.eof:
            self._finish_if_eof()

    def _skip_done(self) -> None:
        if self.skip_reply is not None:
            self.out.append(self.skip_reply)
            self.skip_reply = None
        self.flush_out()

    def _resume(self) -> None:
        """Continue with buffered input after a wait or a write pause ended."""
        if self.closing or self.write_paused or self.waiting is not None or self.held:
            return
        if self.read_paused and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()
        data, self.buf = self.buf, b""
        if data:
            self.process(data)
        else:
            self.flush_out()
            if self.eof:
                self._finish_if_eof()

    # --- output -------------------------------------------------------------------------

    def flush_out(self) -> None:
        out = self.out
        if not out or self.transport is None:
            return
        self.out_size = 0
        if not self.pending_batches:
            data = b"".join(out)  # type: ignore[arg-type]
            out.clear()
        elif out[0].__class__ is not bytes and not out[0].done:  # type: ignore[union-attr]
            return  # the first reply waits for its batch: nothing can go yet
        else:
            ready: list[bytes] = []
            i = 0
            for i, part in enumerate(out):  # noqa: B007
                if part.__class__ is bytes:
                    ready.append(part)  # type: ignore[arg-type]
                elif part.done:  # type: ignore[union-attr]
                    self.pending_batches -= 1
                    if part.__class__ is ConfirmReply:
                        ready.append(part.render())  # type: ignore[union-attr]
                        if part.failed:  # type: ignore[union-attr]
                            self._undo(part)  # type: ignore[arg-type]
                        continue
                    observe = self.server.latency_observer
                    if observe is not None:
                        observe("set", time.perf_counter() - part.started)  # type: ignore[union-attr]
                    ready.append(STORED if part.error is None else _server_error(part.error))  # type: ignore[union-attr]
                else:
                    break
            else:
                i = len(out)
            del out[:i]
            data = b"".join(ready)
        if data and not self.closing:
            self.stats.bytes_written += len(data)
            self.transport.write(data)

    def _unacked_pending(self) -> bool:
        """Prune acknowledged batches; True while one of this connection's sets is pending."""
        self.unacked = [b for b in self.unacked if not b.done]
        return bool(self.unacked)

    def _on_batch(self, batch: Batch) -> None:
        unacked = self.unacked
        if len(unacked) == 1 and unacked[0] is batch:
            unacked.clear()  # the usual case: this connection's only pending batch
        else:
            self._unacked_pending()  # batches of several queues resolve in any order
        self.flush_out()
        if self.held and not self.unacked:
            self.held = False
            self._resume()
        elif self.eof:
            self._finish_if_eof()

    def _close_after_reply(self) -> None:
        self.flush_out()
        self.closing = True
        if self.transport is not None:
            self.transport.close()

    # --- set ------------------------------------------------------------------------------

    def cmd_set(self, args: list[bytes]) -> None:
        self.stats.cmd_set += 1
        if len(args) < 5:
            self.out.append(_client_error("bad command line format"))
            return
        try:
            size = int(args[4])
            if size < 0:
                raise ValueError
        except ValueError:
            self.out.append(_client_error("bad data chunk"))
            self._close_after_reply()
            return
        noreply = len(args) > 5 and args[5] == b"noreply"
        try:
            int(args[2])
            exptime = int(args[3])
        except ValueError:
            return self._discard_block(size, _client_error("bad command line format"), noreply)
        name = _queue_name(args[1])
        if name is None:
            return self._discard_block(size, BAD_QUEUE_NAME, noreply)
        if "+" in name:
            return self._discard_block(
                size, _client_error("cannot set to a fanout reader; write to the queue"), noreply
            )
        status = self.server.status
        if status is not ServerStatus.UP:
            return self._discard_block(size, _server_error(f"server is {status.value}"), noreply)
        if size > self.server.config.queue(name).max_item_size:
            return self._discard_block(size, NOT_STORED, noreply)
        now = int(time.time() * 1000)
        if exptime == 0:
            expire = 0
        elif exptime < _RELATIVE_EXPIRY_LIMIT:
            expire = now + exptime * 1000
        else:
            expire = exptime * 1000
        if not -_MAX_TIME_MS <= expire <= _MAX_TIME_MS:  # the journal stores an i64
            return self._discard_block(size, _client_error("bad command line format"), noreply)
        self.pending_set = (name, expire, size, noreply)

    def _discard_block(self, size: int, reply: bytes, noreply: bool) -> None:
        """Read and drop a data block as it arrives (never buffered), then reply."""
        self.skip = size + 2
        self.skip_reply = None if noreply and reply is not NOT_STORED else reply
        if noreply:
            self.skip_reply = None

    def _store(self, name: str, expire: int, data: bytes, noreply: bool) -> None:
        now = int(time.time() * 1000)
        try:
            batch = self.server.queues.put(name, data, expire, now)
        except QueueFull:
            if not noreply:
                self.out.append(NOT_STORED)
            return
        except JournalWriteError as e:
            if not noreply:
                self.out.append(_server_error(str(e)))
            return
        except OSError as e:
            log.error("put_failed", queue=name, error=str(e))
            if not noreply:
                self.out.append(_server_error(f"journal write failed: {e.strerror}"))
            return
        if batch is not None and not batch.done:
            unacked = self.unacked
            if not unacked or unacked[-1] is not batch:
                unacked.append(batch)
                batch.add_done_callback(self._on_batch)
        if noreply:
            return
        if batch is None or batch.done:
            observe = self.server.latency_observer
            if observe is not None:
                observe("set", 0.0)
            if batch is not None and batch.error is not None:
                self.out.append(_server_error(batch.error))
            else:
                self.out.append(STORED)
            return
        self.out.append(batch)
        self.pending_batches += 1

    # --- get ------------------------------------------------------------------------------

    def cmd_get(self, args: list[bytes]) -> None:
        if len(args) < 2:
            self.out.append(_client_error("missing queue name"))
            return
        key = args[1]
        opts = _parse_get(key)
        if isinstance(opts, bytes):
            self.out.append(opts)
            return
        name = opts.name
        fetch = opts.open or not (opts.close or opts.abort)
        # QUIESCENT refuses the fetch only: the /close or /abort before it still happens,
        # so a reliable reader's last item is not redelivered after a drain.
        refused = fetch and self.server.status is ServerStatus.QUIESCENT
        reader = self.server.queues.reader(name, create=fetch and not refused)
        if reader is None:
            if refused:
                self.out.append(_server_error("server is QUIESCENT"))
                return
            if fetch:
                self.stats.get_misses += 1
                if opts.peek:
                    self.stats.cmd_peek += 1
                else:
                    self.stats.cmd_get += 1
            self.out.append(END)
            return
        reads = self.open_reads.get(reader)
        if opts.abort and reads:
            reader.abort([reads.popleft()])
        reply = None
        if opts.close and reads:
            reply = self._confirm(reader, [reads.popleft()])
        if reads is not None and not reads:
            del self.open_reads[reader]
            reads = None
        if reply is not None:
            # The rest of the reply waits for the confirm to be durable.
            outer, self.out = self.out, reply.parts
            try:
                self._get(reader, key, opts, fetch, refused, reads, reply)
            finally:
                self.out = outer
            return
        self._get(reader, key, opts, fetch, refused, reads, None)

    def _get(
        self,
        reader: Reader,
        key: bytes,
        opts: _Get,
        fetch: bool,
        refused: bool,
        reads: deque[OpenRead] | None,
        reply: ConfirmReply | None,
    ) -> None:
        if refused:
            self.out.append(_server_error("server is QUIESCENT"))
            return
        if not fetch:
            self.out.append(END)
            return
        if opts.peek:
            self.stats.cmd_peek += 1
        else:
            self.stats.cmd_get += 1
            if reads:
                if not opts.open:
                    self.out.append(ERROR)  # a plain get while a read is open
                    return
                if len(reads) >= self.server.config.max_open_reads:
                    self.out.append(ERROR)
                    return
        now = int(time.time() * 1000)
        item = reader.peek(now) if opts.peek else reader.take(now)
        if item is not None:
            self.stats.get_hits += 1
            if self.server.latency_observer is not None:
                self.server.latency_observer("get_hit", 0.0)
            self._deliver(reader, key, item, opts.open, opts.peek, reply)
            return
        if opts.timeout <= 0 or opts.peek or self.eof:
            self.stats.get_misses += 1
            self.out.append(END)
            return
        fut = reader.wait(self.server.loop, opts.timeout / 1000)
        self.waiting = fut
        self.waiting_reply = reply
        started = time.perf_counter()
        fut.add_done_callback(lambda f: self._on_item(f, reader, key, opts.open, started))

    def _on_item(
        self, fut: asyncio.Future, reader: Reader, key: bytes, open_: bool, started: float
    ) -> None:
        item = None if fut.cancelled() else fut.result()
        observe = self.server.latency_observer
        if observe is not None and not self.closing:
            observe("get_hit" if item is not None else "get_timeout", time.perf_counter() - started)
        reply, self.waiting_reply = self.waiting_reply, None
        if self.closing or (reply is not None and reply.failed):
            if item is not None:
                reader.return_items([item])  # the waiter died (or its /close failed): it goes on
            if not self.closing:
                self.waiting = None
                self._resume()
            return
        self.waiting = None
        self.last_active = time.monotonic()  # idle from the reply on, not from the request
        outer = self.out
        if reply is not None and not reply.rendered:
            self.out = reply.parts  # still behind its /close: goes out with it
        else:
            reply = None
        try:
            if item is None:
                self.stats.get_misses += 1
                self.out.append(END)
            else:
                self.stats.get_hits += 1
                self._deliver(reader, key, item, open_, False, reply)
        finally:
            self.out = outer
        self._resume()

    def _deliver(
        self,
        reader: Reader,
        key: bytes,
        item,
        open_: bool,
        peek: bool,
        reply: ConfirmReply | None = None,
    ) -> None:
        data = item.data
        header = b"VALUE %s 0 %d\r\n" % (key, len(data))
        self.out_size += len(data)
        if peek:
            self.out += (header, data, VALUE_END)
            return
        if open_:
            self.out += (header, data, VALUE_END)
            read = reader.open(item)
            reads = self.open_reads.get(reader)
            if reads is None:
                reads = self.open_reads[reader] = deque()
            reads.append(read)
            if reply is not None:  # if its /close fails, the new read goes back too
                reply.give_back = read
            return
        # A plain get confirms as it delivers: the item goes out once that is durable.
        ticket = reader.consume(item)
        if ticket is None or (ticket.done and ticket.error is None):
            self.out += (header, data, VALUE_END)
            return
        consumed = self._held_reply(ticket, reader)
        consumed.parts += (header, data, VALUE_END)
        consumed.taken = item

    # --- confirms ---------------------------------------------------------------------

    def _confirm(self, reader: Reader, reads: list[OpenRead]) -> ConfirmReply | None:
        """Confirm reads; the reply to hold until that is durable (None: reply now)."""
        reply = None
        for read in reads:
            ticket = reader.confirm(read)
            if ticket is None:
                continue
            if reply is None or reply.batch is not ticket:
                reply = self._held_reply(ticket, reader)
            reply.reopen.append(read)
        return reply

    def _held_reply(self, ticket: Batch, reader: Reader) -> ConfirmReply:
        reply = ConfirmReply(ticket, reader)
        self.out.append(reply)
        self.pending_batches += 1
        if not ticket.done and self.confirm_ticket is not ticket:
            self.confirm_ticket = ticket  # one callback per ticket, however many replies
            ticket.add_done_callback(self._on_confirmed)
        return reply

    def _on_confirmed(self, batch: Batch) -> None:
        self.flush_out()
        if self.eof:
            self._finish_if_eof()

    def _undo(self, reply: ConfirmReply) -> None:
        """A confirm could not be made durable: put everything back as it was."""
        reader = reply.reader
        if reply.give_back is not None:
            self._give_back(reader, reply.give_back)
        for read in reversed(reply.reopen):
            self._reopen(reader, read)
        if reply.taken is not None:
            reader.return_items([reply.taken])

    def _reopen(self, reader: Reader, read: OpenRead) -> None:
        """A confirm failed: the read is open again, first in line to be confirmed."""
        reader.reopen(read)
        if self.closing:
            reader.abort([read])
            return
        reads = self.open_reads.get(reader)
        if reads is None:
            reads = self.open_reads[reader] = deque()
        reads.appendleft(read)

    def _give_back(self, reader: Reader, read: OpenRead) -> None:
        reads = self.open_reads.get(reader)
        if reads is not None and read in reads:
            reads.remove(read)
            if not reads:
                del self.open_reads[reader]
        reader.abort([read])

    # --- other queue commands ---------------------------------------------------------

    def _name_arg(self, args: list[bytes]) -> str | None:
        if len(args) < 2:
            self.out.append(_client_error("missing queue name"))
            return None
        name = _queue_name(args[1])
        if name is None:
            self.out.append(BAD_QUEUE_NAME)
        return name

    def _writable(self) -> bool:
        status = self.server.status
        if status is ServerStatus.UP:
            return True
        self.out.append(_server_error(f"server is {status.value}"))
        return False

    def cmd_delete(self, args: list[bytes]) -> None:
        name = self._name_arg(args)
        if name is None or not self._writable():
            return
        self.server.queues.delete(name)
        self.out.append(DELETED)

    def cmd_flush(self, args: list[bytes]) -> None:
        name = self._name_arg(args)
        if name is None or not self._writable():
            return
        self.server.queues.flush(name)
        self.out.append(END)

    def cmd_flush_all(self, args: list[bytes]) -> None:
        if self._writable():
            self.server.queues.flush_all()
            self.out.append(b"Flushed all queues.\r\n")

    def cmd_flush_expired(self, args: list[bytes]) -> None:
        name = self._name_arg(args)
        if name is None or not self._writable():
            return
        self.out.append(b"%d\r\n" % self.server.queues.flush_expired(name))

    def cmd_flush_all_expired(self, args: list[bytes]) -> None:
        if self._writable():
            self.out.append(b"%d\r\n" % self.server.queues.flush_all_expired())

    def cmd_confirm(self, args: list[bytes]) -> None:
        name = self._name_arg(args)
        if name is None:
            return
        try:
            count = int(args[2]) if len(args) > 2 else 1
            if count < 0:
                raise ValueError
        except ValueError:
            self.out.append(_client_error("bad count"))
            return
        reader = self.server.queues.reader(name, create=False)
        reads = self.open_reads.get(reader) if reader is not None else None
        if not reads:
            self.out.append(ERROR)
            return
        confirmed = [reads.popleft() for _ in range(min(count, len(reads)))]
        if not reads:
            del self.open_reads[reader]  # type: ignore[index]
        reply = self._confirm(reader, confirmed)  # type: ignore[arg-type]
        (reply.parts if reply is not None else self.out).append(END)

    def cmd_monitor(self, args: list[bytes]) -> None:
        name = self._name_arg(args)
        if name is None:
            return
        try:
            seconds = float(args[2]) if len(args) > 2 else 0.0
            limit = int(args[3]) if len(args) > 3 else self.server.config.max_open_reads
            if not seconds >= 0 or limit < 0:  # "not >=" also refuses NaN
                raise ValueError
        except ValueError:
            self.out.append(_client_error("bad monitor arguments"))
            return
        if self.server.status is ServerStatus.QUIESCENT:
            self.out.append(_server_error("server is QUIESCENT"))
            return
        reader = self.server.queues.reader(name, create=True)
        assert reader is not None
        if self.eof:
            seconds = 0.0  # half-closed: take what is there, wait for nothing
        self.flush_out()
        task = self.server.loop.create_task(self._monitor(reader, args[1], seconds, limit))
        self.waiting = task
        task.add_done_callback(self._monitor_done)

    async def _monitor(self, reader: Reader, key: bytes, seconds: float, limit: int) -> None:
        loop = self.server.loop
        deadline = loop.time() + seconds
        sent = 0
        while sent < limit and not self.closing:
            now = int(time.time() * 1000)
            item = reader.take(now)
            if item is None:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                fut = reader.wait(loop, remaining)
                try:
                    item = await fut
                except asyncio.CancelledError:
                    if fut.done() and not fut.cancelled() and fut.result() is not None:
                        reader.return_items([fut.result()])
                    raise
                if item is None:
                    break
                if self.closing:
                    reader.return_items([item])
                    break
            self.stats.get_hits += 1
            self._deliver(reader, key, item, True, False)
            self.flush_out()
            sent += 1
        self.out.append(END)

    def _monitor_done(self, task: asyncio.Task) -> None:
        if self.waiting is task:
            self.waiting = None
        self.last_active = time.monotonic()  # idle from the reply on, not from the request
        if not task.cancelled() and task.exception() is not None:
            log.error("monitor_failed", error=str(task.exception()))
        self._resume()

    # --- server commands ------------------------------------------------------------------

    def cmd_stats(self, args: list[bytes]) -> None:
        self.out.append(self.server.render_stats())

    def cmd_dump_stats(self, args: list[bytes]) -> None:
        self.out.append(
            self.server.render_dump_stats([a.decode("ascii", "replace") for a in args[1:]])
        )

    def cmd_dump_config(self, args: list[bytes]) -> None:
        names = []
        for raw in args[1:]:
            name = _queue_name(raw)
            if name is None:
                self.out.append(BAD_QUEUE_NAME)
                return
            names.append(name)
        self.out.append(self.server.render_dump_config(names))

    def cmd_reload(self, args: list[bytes]) -> None:
        error = self.server.reload()
        self.out.append(b"Reloaded config.\r\n" if error is None else _server_error(error))

    def cmd_version(self, args: list[bytes]) -> None:
        from kestreld import __version__

        self.out.append(b"VERSION " + __version__.encode() + b"\r\n")

    def cmd_shutdown(self, args: list[bytes]) -> None:
        self._close_after_reply()
        self.server.request_shutdown("shutdown command")

    def cmd_quit(self, args: list[bytes]) -> None:
        self._close_after_reply()

    def cmd_status(self, args: list[bytes]) -> None:
        if len(args) < 2:
            self.out.append(self.server.status.value.encode() + b"\r\n")
            return
        wanted = args[1].decode("ascii", "replace").upper()
        try:
            status = ServerStatus(wanted)
        except ValueError:
            self.out.append(_client_error(f"unknown status {wanted.lower()[:40]}"))
            return
        self.server.set_status(status)
        self.out.append(END)


_NAME_CACHE: dict[bytes, str | None] = {}
_NAME_CACHE_LIMIT = 10_000


def _queue_name(raw: bytes) -> str | None:
    """The queue name if legal (``q`` or ``q+r``), else None (cached: it runs per request)."""
    try:
        return _NAME_CACHE[raw]
    except KeyError:
        pass
    try:
        name: str | None = raw.decode("ascii")
    except UnicodeDecodeError:
        name = None
    if name is not None and split_queue_name(name) is None:
        name = None
    if len(_NAME_CACHE) >= _NAME_CACHE_LIMIT:
        _NAME_CACHE.clear()  # hostile clients cycling names cannot grow it without bound
    _NAME_CACHE[raw] = name
    return name


def _parse_get(key: bytes) -> _Get | bytes:
    """Options of a get key, or the CLIENT_ERROR reply for a bad one."""
    opts = _Get()
    parts = key.split(b"/")
    name = _queue_name(parts[0]) if parts[0] else None
    if not parts[0]:
        return _client_error("missing queue name")
    if name is None:
        return BAD_QUEUE_NAME
    opts.name = name
    for opt in parts[1:]:
        if opt == b"open":
            opts.open = True
        elif opt == b"close":
            opts.close = True
        elif opt == b"abort":
            opts.abort = True
        elif opt == b"peek":
            opts.peek = True
        elif opt.startswith(b"t="):
            value = opt[2:]
            if not value.isdigit():
                return _client_error("bad timeout")
            opts.timeout = int(value)
    if opts.peek and (opts.open or opts.close or opts.abort):
        return _client_error("peek cannot be combined with open, close or abort")
    if opts.abort and (opts.open or opts.close):
        return _client_error("abort cannot be combined with open or close")
    return opts


_COMMANDS = {
    b"get": MemcacheConnection.cmd_get,
    b"gets": MemcacheConnection.cmd_get,
    b"set": MemcacheConnection.cmd_set,
    b"delete": MemcacheConnection.cmd_delete,
    b"flush": MemcacheConnection.cmd_flush,
    b"flush_all": MemcacheConnection.cmd_flush_all,
    b"flush_expired": MemcacheConnection.cmd_flush_expired,
    b"flush_all_expired": MemcacheConnection.cmd_flush_all_expired,
    b"stats": MemcacheConnection.cmd_stats,
    b"dump_stats": MemcacheConnection.cmd_dump_stats,
    b"dump_config": MemcacheConnection.cmd_dump_config,
    b"reload": MemcacheConnection.cmd_reload,
    b"version": MemcacheConnection.cmd_version,
    b"shutdown": MemcacheConnection.cmd_shutdown,
    b"quit": MemcacheConnection.cmd_quit,
    b"monitor": MemcacheConnection.cmd_monitor,
    b"confirm": MemcacheConnection.cmd_confirm,
    b"status": MemcacheConnection.cmd_status,
}

_SET = MemcacheConnection.cmd_set
