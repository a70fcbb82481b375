"""The command table: every memcache text command word, its shape and its handler.

Flat, in memcached's ``proto_text`` style: one small function per command,
taking the connection and the request's words (``args[0]`` is the command).
A handler parses the words, calls the connection's
:class:`~kestreld.session.session.Session` (which knows no memcache syntax)
and appends the reply to ``conn.out``; the connection keeps replies in
request order and drops them for ``noreply``.  Storage commands other than
``set`` and meta commands are not a queue server's: they get one error line,
after their data block has been skipped.

The server passes :data:`COMMANDS` and :data:`UNKNOWN` to each connection:
the connection never imports this module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kestreld.frontends.memcache.codes import META_SET, STORAGE
from kestreld.frontends.memcache.framing import Command
from kestreld.frontends.memcache.replies import (
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
    client_error,
    server_error,
)
from kestreld.journal.clock import now_ms
from kestreld.names import split_queue_name
from kestreld.session.errors import (
    NoOpenRead,
    NotStored,
    NotWritable,
    PutFailed,
    QueueRefused,
)
from kestreld.session.fetch import Fetch
from kestreld.state import ServerStatus

if TYPE_CHECKING:
    from kestreld.frontends.memcache.connection import MemcacheConnection

_RELATIVE_EXPIRY_LIMIT = 1_000_000
_MAX_TIME_MS = (1 << 63) - 1

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


#: Parsed get keys (``q/close/open/t=100``): a client repeats the same few, and parsing
#: one takes a split, a loop of comparisons and an int().  Each request gets its own copy.
_GET_CACHE: dict[bytes, Fetch | bytes] = {}
_GET_CACHE_LIMIT = 10_000
# The last key looked up and its entry: a consumer repeats one key, and comparing it costs
# less than hashing it for the cache.
_LAST_GET_KEY = b""
_LAST_GET: Fetch | bytes = b""


def parse_get(key: bytes) -> Fetch | bytes:
    """A new fetch for what a get key asks, or the CLIENT_ERROR reply for a bad one."""
    global _LAST_GET_KEY, _LAST_GET
    if key == _LAST_GET_KEY:
        parsed = _LAST_GET
    else:
        cache = _GET_CACHE
        parsed = cache.get(key)
        if parsed is None:
            parsed = _parse_get(key)
            if len(cache) >= _GET_CACHE_LIMIT:
                cache.clear()  # hostile clients cycling keys cannot grow it without bound
            cache[key] = parsed
        _LAST_GET_KEY = key
        _LAST_GET = parsed
    if type(parsed) is bytes:
        return parsed
    template: Fetch = parsed  # type: ignore[assignment]
    return template.again()


def _parse_get(key: bytes) -> Fetch | bytes:
    opts = Fetch()
    opts.key = key
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


# --- set ----------------------------------------------------------------------------------


def accept_set(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
    """The line of a ``set``: True to read its block, False (answered) to skip it."""
    conn.traffic.cmd_set += 1
    out = conn.out
    if len(args) < 5:
        out.append(BAD_COMMAND_LINE)
        return False
    raw = args[3]
    try:
        if args[2] != b"0":  # the usual flags and exptime: no number parsed
            int(args[2])
        exptime = 0 if raw == b"0" else int(raw)
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
    try:
        conn.session.admit_put(name, size)
    except NotWritable as e:
        out.append(server_error(str(e)))
        return False
    except NotStored:
        out.append(NOT_STORED)
        return False
    if exptime == 0:
        expire = 0
    elif exptime < _RELATIVE_EXPIRY_LIMIT:
        expire = now_ms() + exptime * 1000
    else:
        expire = exptime * 1000
    if not -_MAX_TIME_MS <= expire <= _MAX_TIME_MS:  # the journal stores an i64
        out.append(BAD_COMMAND_LINE)
        return False
    conn.expect_put(name, expire, len(args) > 5 and args[-1] == b"noreply")
    return True


def cmd_set(conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:
    """The block of an accepted ``set``: store it; STORED once its journal batch is written."""
    expire = conn.put_expire
    noreply = conn.put_noreply
    name = conn.take_put()
    try:
        reply = conn.session.put(name, data, expire, not noreply)
    except NotStored:
        if not noreply:
            conn.out.append(NOT_STORED)
        return
    except PutFailed as e:
        if not noreply:
            conn.out.append(server_error(str(e)))
        return
    if reply is not None:
        conn.hold(reply)  # STORED once the journal has it
    elif not noreply:
        observe = conn.session.gate.latency_observer
        if observe is not None:
            observe("set", 0.0)
        conn.out.append(STORED)


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
    parsed = parse_get(args[1])
    if type(parsed) is bytes:
        conn.out.append(parsed)  # type: ignore[arg-type]
        return
    f = parsed
    f.with_id = with_cas
    conn.session.fetch(f, True)
    conn.answer_fetch(f, True)


def _get_many(conn: MemcacheConnection, keys: list[bytes], with_cas: bool) -> None:
    parsed = []
    for key in keys:
        f = parse_get(key)
        if type(f) is bytes:
            conn.out.append(f)  # type: ignore[arg-type]
            return
        if f.open or f.timeout:  # type: ignore[union-attr]
            conn.out.append(client_error("/open and /t= take a single key"))
            return
        f.with_id = with_cas  # type: ignore[union-attr]
        parsed.append(f)
    session = conn.session
    try:
        session.check_readable()
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    for f in parsed:
        session.fetch(f, False)
        conn.answer_fetch(f, False)
    conn.out.append(END)


# --- other queue commands -----------------------------------------------------------------


def cmd_delete(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None:
        return
    try:
        conn.session.delete(name)
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    conn.out.append(DELETED)


def cmd_flush(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None:
        return
    try:
        reply = conn.session.flush(name)
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    if reply is None or args[-1] == b"noreply":  # noreply: nothing is held (nor sent)
        conn.out.append(END)
    else:  # END once the flush (a READ_HEAD jump) is durable, as a confirm's reply
        reply.parts.append(END)
        conn.hold(reply)


def cmd_flush_all(conn: MemcacheConnection, args: list[bytes]) -> None:
    try:
        reply = conn.session.flush_all()
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    if reply is None or args[-1] == b"noreply":  # noreply: nothing is held (nor sent)
        conn.out.append(FLUSHED_ALL)
    else:  # once every reader's flush is durable
        reply.parts.append(FLUSHED_ALL)
        conn.hold(reply)


def cmd_flush_expired(conn: MemcacheConnection, args: list[bytes]) -> None:
    name = _name_arg(conn, args)
    if name is None:
        return
    try:
        count = conn.session.flush_expired(name)
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    conn.out.append(b"%d\r\n" % count)


def cmd_flush_all_expired(conn: MemcacheConnection, args: list[bytes]) -> None:
    try:
        count = conn.session.flush_all_expired()
    except NotWritable as e:
        conn.out.append(server_error(str(e)))
        return
    conn.out.append(b"%d\r\n" % count)


def cmd_confirm(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``confirm <q> [count]``: confirm the oldest open reads of this connection."""
    name = _name_arg(conn, args)
    if name is None:
        return
    raw = args[2] if len(args) > 2 else b"1"
    if not raw.isdigit():
        conn.out.append(client_error("bad count"))
        return
    try:
        reply = conn.session.confirm(name, int(raw))
    except NoOpenRead:
        conn.out.append(ERROR)
        return
    if reply is None:
        conn.out.append(END)
    else:
        reply.parts.append(END)
        conn.hold(reply)


def cmd_monitor(conn: MemcacheConnection, args: list[bytes]) -> None:
    """``monitor <q> <seconds> [max]``: open reads of every item for a while, then END."""
    name = _name_arg(conn, args)
    if name is None:
        return
    try:
        seconds = float(args[2]) if len(args) > 2 else 0.0
        limit = int(args[3]) if len(args) > 3 else conn.session.max_open_reads()
        if not seconds >= 0 or limit < 0:  # "not >=" also refuses NaN
            raise ValueError
    except ValueError:
        conn.out.append(client_error("bad monitor arguments"))
        return
    f = Fetch()
    f.name = name
    f.key = args[1]
    f.open = True
    try:
        started = conn.session.monitor(f, seconds, limit)
    except (NotWritable, QueueRefused) as e:
        conn.out.append(server_error(str(e)))
        return
    if not started:  # an alias, or an unknown queue with create_queue_on_get off: empty
        conn.out.append(END)
        return
    conn.flush_out()


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
    conn.close()  # this connection's replies go out first, like any other's at the stop
    conn.server.request_shutdown("shutdown command")


def cmd_quit(conn: MemcacheConnection, args: list[bytes]) -> None:
    conn.close()


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


class GetCommand(Command):
    """``get`` and ``gets``: the connection calls :func:`cmd_get` through the command's own
    method (compiled: a C call, not a Python call of ``run`` per request)."""

    __slots__ = ()

    def run_line(self, conn: MemcacheConnection, args: list[bytes]) -> None:  # type: ignore[override]
        cmd_get(conn, args)


class SetCommand(Command):
    """``set``: :func:`accept_set` and :func:`cmd_set` called the same way."""

    __slots__ = ()

    def accept_block(self, conn: MemcacheConnection, args: list[bytes], size: int) -> bool:  # type: ignore[override]
        return accept_set(conn, args, size)

    def run_block(self, conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:  # type: ignore[override]
        cmd_set(conn, args, data)


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
        GetCommand(b"get", cmd_get),
        GetCommand(b"gets", cmd_get),
        SetCommand(
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

__all__ = ["COMMANDS", "UNKNOWN", "parse_get", "queue_name"]
