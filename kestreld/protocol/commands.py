"""The command table: every memcache text command word, its shape and its handler.

Flat, in memcached's ``proto_text`` style: one small function per command,
taking the connection and the request's words (``args[0]`` is the command).
A handler appends its reply to ``conn.out``; the connection keeps replies in
request order and drops them for ``noreply``.  Storage commands other than
``set`` and meta commands are not a queue server's: they get one error line,
after their data block has been skipped.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING

import structlog

from kestreld.names import split_queue_name
from kestreld.protocol.framing import META_SET, STORAGE, Command
from kestreld.protocol.replies import (
    BAD_COMMAND_LINE,
    BAD_QUEUE_NAME,
    DELETED,
    END,
    ERROR,
    FLUSHED_ALL,
    MISSING_QUEUE_NAME,
    NOT_STORED,
    RELOADED,
    STORED,
    VALUE_END,
    client_error,
    server_error,
)
from kestreld.queues.journaled_queue import JournalWriteError, QueueFull
from kestreld.queues.reader import OpenRead, Reader
from kestreld.state import ServerStatus

if TYPE_CHECKING:
    from kestreld.protocol.confirm_reply import ConfirmReply
    from kestreld.protocol.connection import MemcacheConnection
    from kestreld.queues.item import QueueItem
    from kestreld.state import ServerState

log = structlog.get_logger("kestreld.protocol")

_RELATIVE_EXPIRY_LIMIT = 1_000_000
_MAX_TIME_MS = (1 << 63) - 1
CRLF = b"\r\n"

# --- names and get options ----------------------------------------------------------------

_NAME_CACHE: dict[bytes, str | None] = {}
_NAME_CACHE_LIMIT = 10_000


def queue_name(raw: bytes) -> str | None:
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


class GetOptions:
    """Parsed options of ``get <q>[/t=ms][/open][/close][/abort][/peek]``."""

    __slots__ = ("name", "timeout", "open", "close", "abort", "peek")

    def __init__(self) -> None:
        self.name = ""
        self.timeout = 0
        self.open = self.close = self.abort = self.peek = False


def parse_get(key: bytes) -> GetOptions | bytes:
    """Options of a get key, or the CLIENT_ERROR reply for a bad one."""
    opts = GetOptions()
    parts = key.split(b"/")
    if not parts[0]:
        return MISSING_QUEUE_NAME
    name = queue_name(parts[0])
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
                return client_error("bad timeout")
            opts.timeout = int(value)
    if opts.peek and (opts.open or opts.close or opts.abort):
        return client_error("peek cannot be combined with open, close or abort")
    if opts.abort and (opts.open or opts.close):
        return client_error("abort cannot be combined with open or close")
    return opts


def _name_arg(conn: MemcacheConnection, args: list[bytes]) -> str | None:
    if len(args) < 2:
        conn.out.append(MISSING_QUEUE_NAME)
        return None
    name = queue_name(args[1])
    if name is None:
        conn.out.append(BAD_QUEUE_NAME)
    return name


# --- refusals by status and connection count (Kestrel 2.4) -------------------------------

_WRITES_OVER_LIMIT = server_error("too many connections for writes")
_READS_OVER_LIMIT = server_error("too many connections for reads")


def write_refusal(server: ServerState) -> bytes | None:
    """The SERVER_ERROR that refuses a write now, or None: READONLY and QUIESCENT refuse
    (WRITEAVOID only leaves the write server set), as do more than
    ``connection_limit_refuse_writes`` connections."""
    status = server.status
    if status is not ServerStatus.UP and status is not ServerStatus.WRITEAVOID:
        return server_error(f"server is {status.value}")
    limit = server.config.connection_limit_refuse_writes
    if limit is not None and len(server.connections) > limit:
        return _WRITES_OVER_LIMIT
    return None


def read_refusal(server: ServerState) -> bytes | None:
    """The SERVER_ERROR that refuses a fetch now, or None: QUIESCENT refuses, as do more
    than ``connection_limit_refuse_reads`` connections."""
    if server.status is ServerStatus.QUIESCENT:
        return server_error("server is QUIESCENT")
    limit = server.config.connection_limit_refuse_reads
    if limit is not None and len(server.connections) > limit:
        return _READS_OVER_LIMIT
    return None


def _writable(conn: MemcacheConnection) -> bool:
    refusal = write_refusal(conn.server)
    if refusal is None:
        return True
    conn.out.append(refusal)
    return False


# --- set ----------------------------------------------------------------------------------


def accept_set(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
    """The line of a ``set``: True to read its block, False (answered) to skip it."""
    conn.stats.cmd_set += 1
    out = conn.out
    if len(args) < 5:
        out.append(BAD_COMMAND_LINE)
        return False
    try:
        int(args[2])
        exptime = int(args[3])
    except ValueError:
        out.append(BAD_COMMAND_LINE)
        return False
    name = queue_name(args[1])
    if name is None:
        out.append(BAD_QUEUE_NAME)
        return False
    if "+" in name:
        out.append(client_error("cannot set to a fanout reader; write to the queue"))
        return False
    server = conn.server
    refusal = write_refusal(server)
    if refusal is not None:
        out.append(refusal)
        return False
    # The queue's own config (the same object, kept current by reloads) saves a lookup.
    queue = server.queues.queues.get(name)
    config = queue.config if queue is not None else server.config.queue(name)
    if size > config.max_item_size:
        out.append(NOT_STORED)
        return False
    if exptime == 0:
        expire = 0
    elif exptime < _RELATIVE_EXPIRY_LIMIT:
        expire = int(time.time() * 1000) + exptime * 1000
    else:
        expire = exptime * 1000
    if not -_MAX_TIME_MS <= expire <= _MAX_TIME_MS:  # the journal stores an i64
        out.append(BAD_COMMAND_LINE)
        return False
    conn.put_target = (name, expire, len(args) > 5 and args[-1] == b"noreply")
    return True


def cmd_set(conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:
    """The block of an accepted ``set``: store it; STORED once its journal batch is written."""
    name, expire, noreply = conn.put_target  # type: ignore[misc]
    conn.put_target = None
    now = int(time.time() * 1000)
    out = conn.out
    try:
        batch = conn.server.queues.put(name, data, expire, now)
    except QueueFull:
        if not noreply:
            out.append(NOT_STORED)
        return
    except JournalWriteError as e:
        if not noreply:
            out.append(server_error(str(e)))
        return
    except OSError as e:
        log.error("put_failed", queue=name, error=str(e))
        if not noreply:
            out.append(server_error(f"journal write failed: {e.strerror}"))
        return
    if batch is not None and not batch.done:
        conn.watch_batch(batch)
    if noreply:
        return
    if batch is None or batch.done:
        observe = conn.server.latency_observer
        if observe is not None:
            observe("set", 0.0)
        if batch is not None and batch.error is not None:
            out.append(server_error(batch.error))
        else:
            out.append(STORED)
        return
    out.append(batch)  # type: ignore[arg-type]  # replaced by STORED when the batch resolves
    conn.pending_batches += 1


def accept_unsupported(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
    """``add``, ``cas``, ``ms`` ...: one error line; their block is skipped, never run."""
    word = args[0].lower().decode("ascii", "replace")
    conn.out.append(client_error(f"{word} is not supported by a queue server"))
    return False


def _no_block(conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:
    raise AssertionError("a skipped block is never run")


# --- get ----------------------------------------------------------------------------------


def cmd_get(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``get <q>[/options]``; several keys: one item from each, never waiting."""
    if len(args) < 2:
        conn.out.append(MISSING_QUEUE_NAME)
        return
    with_cas = args[0] != b"get" and args[0].lower() == b"gets"
    if len(args) > 2:
        _get_many(conn, args[1:], with_cas)
        return
    key = args[1]
    opts = parse_get(key)
    if opts.__class__ is bytes:
        conn.out.append(opts)  # type: ignore[arg-type]
        return
    if not _get_one(conn, key, opts, True, with_cas) and conn.waiting is None:  # type: ignore[arg-type]
        conn.out.append(END)


def _get_many(conn: MemcacheConnection, keys: list[bytes], with_cas: bool) -> None:
    parsed = []
    for key in keys:
        opts = parse_get(key)
        if opts.__class__ is bytes:
            conn.out.append(opts)  # type: ignore[arg-type]
            return
        if opts.open or opts.timeout:  # type: ignore[union-attr]
            conn.out.append(client_error("/open and /t= take a single key"))
            return
        parsed.append((key, opts))
    refusal = read_refusal(conn.server)
    if refusal is not None:
        conn.out.append(refusal)
        return
    for key, opts in parsed:
        _get_one(conn, key, opts, False, with_cas)  # type: ignore[arg-type]
    conn.out.append(END)


def _get_one(
    conn: MemcacheConnection, key: bytes, opts: GetOptions, single: bool, with_cas: bool
) -> bool:
    """One key of a get: its item (if any) goes to ``conn.out``, or a wait begins.

    ``single``: the only key of its get, which may wait and whose reply this
    completes (True: an item with its END, or an error line).  A key of a
    multi-key get never waits, and adds only its item.
    """
    server = conn.server
    stats = conn.stats
    fetch = opts.open or not (opts.close or opts.abort)
    # QUIESCENT refuses the fetch only: the /close or /abort before it still happens,
    # so a reliable reader's last item is not redelivered after a drain.
    refusal = read_refusal(server) if fetch else None
    refused = refusal is not None
    reader = server.queues.reader(opts.name, create=fetch and not refused)
    if reader is None:
        if refused:
            conn.out.append(refusal)  # type: ignore[arg-type]
            return True
        if fetch:
            stats.get_misses += 1
            if opts.peek:
                stats.cmd_peek += 1
            else:
                stats.cmd_get += 1
        return False
    reads = conn.open_reads.get(reader)
    if opts.abort and reads:
        reader.abort([reads.popleft()])
    reply = None
    if opts.close and reads:
        reply = confirm_reads(conn, reader, [reads.popleft()])
    if reads is not None and not reads:
        del conn.open_reads[reader]
        reads = None
    if reply is None:
        return _fetch(conn, reader, key, opts, single, with_cas, refused, reads, None)
    # The rest of this key's reply waits for its /close to be durable, and goes out with it.
    outer, conn.out = conn.out, reply.parts
    try:
        complete = _fetch(conn, reader, key, opts, single, with_cas, refused, reads, reply)
        if single and not complete and conn.waiting is None:
            conn.out.append(END)  # the whole reply is held: a failed close replaces all of it
            complete = True
        return complete
    finally:
        conn.out = outer


def _fetch(
    conn: MemcacheConnection,
    reader: Reader,
    key: bytes,
    opts: GetOptions,
    single: bool,
    with_cas: bool,
    refused: bool,
    reads: deque[OpenRead] | None,
    reply: ConfirmReply | None,
) -> bool:
    """The fetch of a get, after its /close or /abort: as :func:`_get_one` returns."""
    server = conn.server
    stats = conn.stats
    fetch = opts.open or not (opts.close or opts.abort)
    if refused:
        conn.out.append(read_refusal(server) or _READS_OVER_LIMIT)
        return True
    if not fetch:
        return False
    if opts.peek:
        stats.cmd_peek += 1
    else:
        stats.cmd_get += 1
        if reads:
            if not opts.open or len(reads) >= server.config.max_open_reads:
                # A plain get while a read is open, or too many open reads.
                if not single:
                    return False  # that key has no item
                conn.out.append(ERROR)
                return True
    now = int(time.time() * 1000)
    item = reader.peek(now) if opts.peek else reader.take(now)
    if item is not None:
        stats.get_hits += 1
        if server.latency_observer is not None:
            server.latency_observer("get_hit", 0.0)
        tail = VALUE_END if single else CRLF
        deliver(conn, reader, key, item, opts.open, opts.peek, tail, with_cas, reply)
        return single
    if not single or opts.timeout <= 0 or conn.eof:
        stats.get_misses += 1
        return False
    fut = reader.wait(server.loop, opts.timeout / 1000)
    conn.waiting = fut
    conn.waiting_reply = reply
    started = time.perf_counter()
    open_, peek = opts.open, opts.peek
    fut.add_done_callback(lambda f: _on_item(conn, f, reader, key, open_, peek, with_cas, started))
    return False


def _on_item(
    conn: MemcacheConnection,
    fut: asyncio.Future,
    reader: Reader,
    key: bytes,
    open_: bool,
    peek: bool,
    with_cas: bool,
    started: float,
) -> None:
    """A waiting get ended: with an item, or None at its timeout."""
    item = None if fut.cancelled() else fut.result()
    observe = conn.server.latency_observer
    if observe is not None and not conn.closing:
        observe("get_hit" if item is not None else "get_timeout", time.perf_counter() - started)
    reply, conn.waiting_reply = conn.waiting_reply, None
    if conn.closing or (reply is not None and reply.failed):
        if item is not None:
            reader.return_items([item])  # the waiter died (or its /close failed): it goes on
        if not conn.closing:
            conn.waiting = None
            conn.resume()
        return
    conn.waiting = None
    conn.last_active = time.monotonic()  # idle from the reply on, not from the request
    outer = conn.out
    if reply is not None and not reply.rendered:
        conn.out = reply.parts  # still behind its /close: goes out with it
    else:
        reply = None
    try:
        if item is None:
            conn.stats.get_misses += 1
            conn.out.append(END)
        else:
            conn.stats.get_hits += 1
            if peek:
                reader.return_items([item])  # a peek only looks: the item stays at the head
            deliver(conn, reader, key, item, open_, peek, VALUE_END, with_cas, reply)
    finally:
        conn.out = outer
    conn.resume()


def deliver(
    conn: MemcacheConnection,
    reader: Reader,
    key: bytes,
    item: QueueItem,
    open_: bool,
    peek: bool,
    tail: bytes,
    with_cas: bool = False,
    reply: ConfirmReply | None = None,
) -> None:
    """Write one item, then ``tail``; ``/open`` keeps it open, a plain get confirms it.

    A plain get's reply waits until that confirm is durable, like a ``/close``.
    ``reply``: the held reply of this get's ``/close``, which gives the new read
    back if that close fails.  ``gets`` adds a cas unique (the item's id), as
    memcache clients expect; no command takes it back.
    """
    data = item.data
    if with_cas:
        header = b"VALUE %s 0 %d %d\r\n" % (key, len(data), item.id)
    else:
        header = b"VALUE %s 0 %d\r\n" % (key, len(data))
    conn.out_size += len(data)
    if peek:
        conn.out += (header, data, tail)
        return
    if open_:
        conn.out += (header, data, tail)
        read = reader.open(item)
        reads = conn.open_reads.get(reader)
        if reads is None:
            reads = conn.open_reads[reader] = deque()
        reads.append(read)
        if reply is not None:
            reply.give_back = read
        return
    ticket = reader.consume(item)
    if ticket is None or (ticket.done and ticket.error is None):
        conn.out += (header, data, tail)
        return
    held = conn.hold_reply(ticket, reader)
    held.parts += (header, data, tail)
    held.taken = item


# --- confirms -----------------------------------------------------------------------------


def confirm_reads(
    conn: MemcacheConnection, reader: Reader, reads: list[OpenRead]
) -> ConfirmReply | None:
    """Confirm ``reads``; the reply to hold until that is durable (None: reply now)."""
    reply = None
    for read in reads:
        ticket = reader.confirm(read)
        if ticket is None:
            continue
        if reply is None or reply.batch is not ticket:
            reply = conn.hold_reply(ticket, reader)
        reply.reopen.append(read)
    return reply


def undo_confirm(conn: MemcacheConnection, reply: ConfirmReply) -> None:
    """A confirm could not be made durable: everything its request did is put back."""
    reader = reply.reader
    give_back = reply.give_back
    if give_back is not None:  # the read the same request opened goes back to the queue
        reads = conn.open_reads.get(reader)
        if reads is not None and give_back in reads:
            reads.remove(give_back)
            if not reads:
                del conn.open_reads[reader]
            reader.abort([give_back])
    for read in reversed(reply.reopen):  # open again, first in line to be confirmed
        reader.reopen(read)
        if conn.closing:
            reader.abort([read])
            continue
        reads = conn.open_reads.get(reader)
        if reads is None:
            reads = conn.open_reads[reader] = deque()
        reads.appendleft(read)
    if reply.taken is not None:
        reader.return_items([reply.taken])


# --- other queue commands -----------------------------------------------------------------


def cmd_delete(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None or not _writable(conn):
        return
    conn.server.queues.delete(name)
    conn.out.append(DELETED)


def cmd_flush(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None or not _writable(conn):
        return
    conn.server.queues.flush(name)
    conn.out.append(END)


def cmd_flush_all(conn: MemcacheConnection, args: list[bytes]) -> None:
    if _writable(conn):
        conn.server.queues.flush_all()
        conn.out.append(FLUSHED_ALL)


def cmd_flush_expired(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None or not _writable(conn):
        return
    conn.out.append(b"%d\r\n" % conn.server.queues.flush_expired(name))


def cmd_flush_all_expired(conn: MemcacheConnection, args: list[bytes]) -> None:
    if _writable(conn):
        conn.out.append(b"%d\r\n" % conn.server.queues.flush_all_expired())


def cmd_confirm(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``confirm <q> [count]``: confirm the oldest open reads of this connection."""
    name = _name_arg(conn, args)
    if name is None:
        return
    raw = args[2] if len(args) > 2 else b"1"
    if not raw.isdigit():
        conn.out.append(client_error("bad count"))
        return
    count = int(raw)
    reader = conn.server.queues.reader(name, create=False)
    reads = conn.open_reads.get(reader) if reader is not None else None
    if not reads:
        conn.out.append(ERROR)
        return
    confirmed = [reads.popleft() for _ in range(min(count, len(reads)))]
    if not reads:
        del conn.open_reads[reader]  # type: ignore[index]
    reply = confirm_reads(conn, reader, confirmed)  # type: ignore[arg-type]
    (reply.parts if reply is not None else conn.out).append(END)


def cmd_monitor(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``monitor <q> <seconds> [max]``: open reads of every item for a while, then END."""
    name = _name_arg(conn, args)
    if name is None:
        return
    server = conn.server
    try:
        seconds = float(args[2]) if len(args) > 2 else 0.0
        limit = int(args[3]) if len(args) > 3 else server.config.max_open_reads
        if not seconds >= 0 or limit < 0:  # "not >=" also refuses NaN
            raise ValueError
    except ValueError:
        conn.out.append(client_error("bad monitor arguments"))
        return
    refusal = read_refusal(server)
    if refusal is not None:
        conn.out.append(refusal)
        return
    reader = server.queues.reader(name, create=True)
    assert reader is not None
    if conn.eof:
        seconds = 0.0  # half-closed: take what is there, wait for nothing
    conn.flush_out()
    task = server.loop.create_task(_monitor(conn, reader, args[1], seconds, limit))
    conn.waiting = task
    task.add_done_callback(lambda t: _monitor_done(conn, t))


async def _monitor(
    conn: MemcacheConnection, reader: Reader, key: bytes, seconds: float, limit: int
) -> None:
    loop = conn.server.loop
    deadline = loop.time() + seconds
    sent = 0
    while sent < limit and not conn.closing:
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
            if conn.closing:
                reader.return_items([item])
                break
        conn.stats.get_hits += 1
        deliver(conn, reader, key, item, True, False, VALUE_END)  # each item is a get reply
        conn.flush_out()
        sent += 1
    conn.out.append(END)


def _monitor_done(conn: MemcacheConnection, task: asyncio.Task) -> None:
    if conn.waiting is task:
        conn.waiting = None
    conn.last_active = time.monotonic()  # idle from the reply on, not from the request
    if not task.cancelled() and task.exception() is not None:
        log.error("monitor_failed", error=str(task.exception()))
    conn.resume()


# --- server commands ----------------------------------------------------------------------


def cmd_stats(conn: MemcacheConnection, args: list[bytes]) -> None:
    conn.out.append(conn.server.render_stats())


def cmd_dump_stats(conn: MemcacheConnection, args: list[bytes]) -> None:
    names = [a.decode("ascii", "replace") for a in args[1:]]
    conn.out.append(conn.server.render_dump_stats(names))


def cmd_dump_config(conn: MemcacheConnection, args: list[bytes]) -> None:
    names = []
    for raw in args[1:]:
        name = queue_name(raw)
        if name is None:
            conn.out.append(BAD_QUEUE_NAME)
            return
        names.append(name)
    conn.out.append(conn.server.render_dump_config(names))


def cmd_reload(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``reload``: re-read the config file; the reply names what needs a restart."""
    error, needs_restart = conn.server.reload()
    if error is not None:
        conn.out.append(server_error(error))
    elif needs_restart:
        keys = " ".join(needs_restart)
        conn.out.append(b"Reloaded config; needs a restart to apply: " + keys.encode() + b"\r\n")
    else:
        conn.out.append(RELOADED)


def cmd_version(conn: MemcacheConnection, args: list[bytes]) -> None:
    from kestreld import __version__

    conn.out.append(b"VERSION " + __version__.encode() + b"\r\n")


def cmd_shutdown(conn: MemcacheConnection, args: list[bytes]) -> None:
    conn.close_after_reply()
    conn.server.request_shutdown("shutdown command")


def cmd_quit(conn: MemcacheConnection, args: list[bytes]) -> None:
    conn.close_after_reply()


def cmd_status(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``status``: the status in force (and a pending one, during a grace period);
    ``status <UP|WRITEAVOID|READONLY|QUIESCENT>`` (any case) sets it."""
    server = conn.server
    if len(args) < 2:
        conn.out.append(server.describe_status().encode() + b"\r\n")
        return
    wanted = args[1].decode("ascii", "replace").upper()
    try:
        status = ServerStatus(wanted)
    except ValueError:
        conn.out.append(
            client_error(
                f"unknown status {wanted.lower()[:40]} (up, writeavoid, readonly or quiescent)"
            )
        )
        return
    server.set_status(status)
    conn.out.append(END)


def cmd_unsupported(conn: MemcacheConnection, args: list[bytes]) -> None:
    """A memcached command a queue server has no use for: one error line."""
    word = args[0].lower().decode("ascii", "replace")
    conn.out.append(client_error(f"{word} is not supported by a queue server"))


def cmd_unknown(conn: MemcacheConnection, args: list[bytes]) -> None:
    word = args[0].lower().decode("ascii", "replace")[:40]
    conn.out.append(client_error(f"unknown command {word}"))


# --- the table ----------------------------------------------------------------------------


def _storage(word: bytes, noreply_after: int) -> Command:
    return Command(
        word,
        _no_block,
        shape=STORAGE,
        noreply_after=noreply_after,
        accept=accept_unsupported,
        waits_for_sets=False,
    )


def _unsupported(word: bytes, noreply_after: int = 0) -> Command:
    return Command(word, cmd_unsupported, noreply_after=noreply_after, waits_for_sets=False)


#: Every command word the framing knows.  ``noreply_after``: memcached's rule for
#: where ``noreply`` may stand (``delete <key> noreply``, ``set <key> <f> <e> <n> noreply``).
COMMANDS: dict[bytes, Command] = {
    c.word: c
    for c in (
        Command(b"get", cmd_get),
        Command(b"gets", cmd_get),
        Command(
            b"set",
            cmd_set,
            shape=STORAGE,
            noreply_after=5,
            accept=accept_set,
            waits_for_sets=False,
        ),
        Command(b"delete", cmd_delete, noreply_after=2),
        Command(b"flush", cmd_flush, noreply_after=2),
        Command(b"flush_all", cmd_flush_all, noreply_after=1),
        Command(b"flush_expired", cmd_flush_expired, noreply_after=2),
        Command(b"flush_all_expired", cmd_flush_all_expired, noreply_after=1),
        Command(b"confirm", cmd_confirm),
        Command(b"monitor", cmd_monitor),
        Command(b"stats", cmd_stats),
        Command(b"dump_stats", cmd_dump_stats),
        Command(b"dump_config", cmd_dump_config),
        Command(b"reload", cmd_reload),
        Command(b"version", cmd_version),
        Command(b"shutdown", cmd_shutdown),
        Command(b"quit", cmd_quit),
        Command(b"status", cmd_status),
        # Storage commands a queue cannot honour: the block is skipped, one error line.
        _storage(b"add", 5),
        _storage(b"replace", 5),
        _storage(b"append", 5),
        _storage(b"prepend", 5),
        _storage(b"cas", 6),
        Command(
            b"ms",
            _no_block,
            shape=META_SET,
            accept=accept_unsupported,
            waits_for_sets=False,
        ),
        # Other memcached commands: one error line (none with noreply).
        _unsupported(b"incr", 3),
        _unsupported(b"decr", 3),
        _unsupported(b"touch", 3),
        _unsupported(b"verbosity", 2),
        _unsupported(b"gat"),
        _unsupported(b"gats"),
        _unsupported(b"cache_memlimit", 2),
        _unsupported(b"lru_crawler"),
        _unsupported(b"slabs"),
        _unsupported(b"lru"),
        _unsupported(b"watch"),
        _unsupported(b"me"),
        _unsupported(b"mg"),
        _unsupported(b"md"),
        _unsupported(b"ma"),
        _unsupported(b"mn"),
    )
}

#: Any word not in the table.
UNKNOWN = Command(b"", cmd_unknown, waits_for_sets=False)

__all__ = ["COMMANDS", "UNKNOWN", "GetOptions", "deliver", "parse_get", "queue_name"]
