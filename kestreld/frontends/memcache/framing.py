"""Request framing of the memcache text protocol: lines, data blocks, skips and limits.

A request is a line, and for the storage commands (``set add replace append
prepend cas``) and meta ``ms`` a data block of the length the line names,
ended by ``\\r\\n`` (or a bare ``\\n``, for clients such as ``nc`` without
``-C``).  The framing knows every command's shape from the command table, so
a data block is always read, or skipped, before the next line is looked at:
payload bytes are never taken for a command, whatever they hold.

- A kept block (a ``set`` that may be stored) is buffered until it is whole;
  a large one is copied as it arrives into the bytes object the item will hold
  (compiled: no join, no slice, no multi-millisecond copy of an 8 MiB item on the
  event loop; the plain build keeps the chunks as they arrive and joins them once).
- A skipped block (any other storage command, a refused ``set``) is dropped
  as it arrives: at most one packet is ever held of it.
- A length that is not a number, negative, or beyond :data:`LENGTH_LIMIT`
  gets an error at once and closes the connection: where such a block would
  end cannot be known, so nothing after it can be trusted.
- A line longer than ``max_line_length`` is answered the same way.
- A block not followed by its terminator gets ``CLIENT_ERROR bad data chunk``
  at once and the rest of that line is dropped.

The framing owns no reply and no flow control: it hands each request to its
sink (the connection), which answers ``GO``, ``STOP`` or ``LATER``
(:mod:`kestreld.frontends.memcache.codes`).  State is a handful of fixed fields, so the class is
compiled by Cython (``framing.pxd`` beside this file: C fields, C integers for
positions, the sink called through a C vtable).
"""

from __future__ import annotations

from collections.abc import Callable

from kestreld.frontends.memcache.codes import GO, KEEP, LATER, LINE, SKIP, STORAGE
from kestreld.frontends.memcache.replies import BAD_COMMAND_LINE, BAD_DATA_CHUNK, LINE_TOO_LONG

try:
    import cython
    from cython.cimports.cpython.bytes import PyBytes_FromStringAndSize
    from cython.cimports.cpython.list import PyList_New, PyList_SET_ITEM
    from cython.cimports.cpython.ref import Py_INCREF
    from cython.cimports.libc.string import memchr, memcpy

    COMPILED = cython.compiled
except (ImportError, AttributeError):  # plain Python (Cython absent, or not compiling)
    COMPILED = False

#: The longest data block the framing will skip; memcached's own ceiling (``-I 1024m``).
#: A longer declared length is answered at once and the connection closed.
LENGTH_LIMIT = 1 << 30
#: Bytes of a data block up to which a partial one is simply concatenated with what follows;
#: a longer one is filled in place as it arrives.
ACCUMULATE_THRESHOLD = 64 * 1024


class Command:
    """One entry of the command table: the word, its shape and its handler."""

    __slots__ = ("word", "shape", "length_at", "noreply_after", "run", "accept", "waits_for_sets")

    def __init__(
        self,
        word: bytes,
        run: Callable,
        *,
        shape: int = LINE,
        noreply_after: int = 0,
        accept: Callable | None = None,
        waits_for_sets: bool = True,
    ) -> None:
        self.word = word
        self.shape = shape
        #: Index of the block length in the request line (storage: 4, ms: 2).
        self.length_at = 4 if shape == STORAGE else 2
        #: ``noreply`` may end the line after this many words (0: never, memcached's rule).
        self.noreply_after = noreply_after
        #: ``run(conn, args)`` for a line; ``run(conn, args, block)`` with a block.
        self.run = run
        #: ``accept(conn, args, size) -> bool`` for a block: True to read it, False to skip it.
        self.accept = accept
        #: Runs only after this connection's earlier sets are acknowledged.
        self.waits_for_sets = waits_for_sets

    # The connection runs a command through these.  Here they call ``run`` and ``accept``;
    # the table's ``get`` and ``set`` (commands.py) override them to call their handlers
    # directly: compiled, a C call through the vtable instead of a Python call per request.

    def run_line(self, conn: Sink, args: list[bytes]) -> None:
        self.run(conn, args)

    def accept_block(self, conn: Sink, args: list[bytes], size: int) -> bool:
        return self.accept(conn, args, size)  # type: ignore[misc]

    def run_block(self, conn: Sink, args: list[bytes], data: bytes) -> None:
        self.run(conn, args, data)


class Sink:
    """What the framing hands requests to: the connection derives from it.

    A base class rather than a protocol: compiled (framing.pxd), the framing
    calls these methods through a C vtable, not a Python attribute lookup.
    """

    __slots__ = ()

    def request(self, command: Command, args: list[bytes], quiet: bool) -> int:
        raise NotImplementedError

    def block_header(self, command: Command, args: list[bytes], size: int, quiet: bool) -> int:
        raise NotImplementedError

    def block(self, command: Command, args: list[bytes], data: bytes, quiet: bool) -> int:
        raise NotImplementedError

    def bad_block(self, quiet: bool) -> None:
        raise NotImplementedError

    def fatal(self, reply: bytes) -> None:
        raise NotImplementedError


class Framing:
    """The framing state of one connection; ``receive`` then ``parse``."""

    __slots__ = (
        "table",
        "unknown",
        "max_line",
        "buf",
        "block_data",
        "filled",
        "skip",
        "block_command",
        "block_args",
        "block_size",
        "block_quiet",
        "expect_end",
        "drop_line",
        "last_length",
        "last_size",
        "last_word",
        "last_command",
    )

    def __init__(self, table: dict[bytes, Command], unknown: Command, max_line: int) -> None:
        self.table = table
        self.unknown = unknown  # the entry for any word not in the table
        self.max_line = max_line
        self.buf = b""  # input not parsed yet
        #: A large kept block being filled as it arrives (``filled`` bytes so far); once
        #: whole, it waits here for its terminator.
        self.block_data: bytes | list[bytes] | None = None
        self.filled = 0
        self.skip = 0  # bytes of a skipped block still to drop
        self.block_command: Command | None = None  # a kept block being read
        self.block_args: list[bytes] | None = None
        self.block_size = 0
        self.block_quiet = False  # noreply: the block's errors are not answered either
        self.expect_end = False  # a skipped block ended: its terminator comes next
        self.drop_line = False  # after a bad terminator: drop up to the next newline
        # The last block length read and its value: a producer's items are often of one size.
        self.last_length = b""
        self.last_size = 0
        # The last command word looked up and its entry: a client mostly repeats one command,
        # and comparing the word costs less than hashing it for the table.
        self.last_word = b""
        self.last_command: Command | None = None

    def use_table(self, table: dict[bytes, Command], unknown: Command) -> None:
        """Judge the requests from here on with ``table`` (an authenticated client's)."""
        self.table = table
        self.unknown = unknown
        self.last_word = b""
        self.last_command = None

    def holds_input(self) -> bool:
        """True when input arrived that is not parsed yet (or a skip is under way):
        new input must go through :meth:`receive`."""
        return bool(self.buf) or self.skip > 0 or self.block_data is not None

    def mid_request(self) -> bool:
        """True when part of a request has arrived (its line or its data block)."""
        return (
            bool(self.buf)
            or self.skip > 0
            or self.block_data is not None
            or (self.block_command is not None)
        )

    def keep(self, data: bytes) -> None:
        """Hold ``data`` (from :meth:`receive`) unparsed: the sink cannot take requests now."""
        self.buf = data

    def drop_input(self) -> None:
        """The client is gone: let go of whatever part of a request arrived (a large
        block's buffer is freed now, not when the connection object is collected)."""
        self.buf = b""
        self.block_data = None
        self.filled = 0
        self.block_command = None
        self.block_args = None

    def take_input(self) -> bytes:
        """The input held by :meth:`keep` (or left by a stopped parse), to parse now."""
        data = self.buf
        self.buf = b""
        return data

    def receive(self, data: bytes) -> bytes | None:
        """Input as it arrives, past any skip: the bytes to parse, or None for none yet."""
        if self.skip:
            n = min(self.skip, len(data))
            self.skip -= n
            if self.skip or n == len(data):
                return None
            data = data[n:]
        block = self.block_data
        if block is not None and self.filled < self.block_size:
            n = min(len(data), self.block_size - self.filled)
            _fill(block, self.filled, data, n)
            self.filled += n
            if self.filled < self.block_size:
                return None
            self._block_whole()
            if n == len(data):
                return None  # its terminator comes next
            data = data[n:]
            if self.buf:
                data = self.buf + data
        elif self.buf:
            data = self.buf + data
        self.buf = b""
        return data

    def parse(self, sink: Sink, data: bytes) -> None:
        """Hand every complete request in ``data`` to ``sink``; keep the rest in ``buf``."""
        pos = 0
        end = len(data)
        table = self.table
        max_line = self.max_line
        while pos < end:
            command = self.block_command
            if command is not None:
                whole = self.block_data  # arrived before ``data``: its terminator is at pos
                stop = pos if whole is not None else pos + self.block_size
                if stop >= end:
                    break
                after = -1
                if data[stop] == 10:
                    after = stop + 1
                elif data[stop] == 13:
                    if stop + 1 >= end:
                        break
                    if data[stop + 1] == 10:
                        after = stop + 2
                args = self.block_args
                quiet = self.block_quiet
                self.block_command = None
                self.block_args = None
                self.block_data = None
                if after < 0:
                    sink.bad_block(quiet)  # nothing stored; the rest of the line is dropped
                    self.drop_line = True
                    pos = stop
                    continue
                block = whole if whole is not None else data[pos:stop]
                verdict = sink.block(command, args, block, quiet)  # type: ignore[arg-type]
                pos = after
                if verdict != GO:
                    break
                continue
            if self.expect_end:
                byte = data[pos]
                if byte == 10:
                    self.expect_end = False
                    pos += 1
                    continue
                if byte == 13:
                    if pos + 1 >= end:
                        break
                    if data[pos + 1] == 10:
                        self.expect_end = False
                        pos += 2
                        continue
                self.expect_end = False
                sink.bad_block(self.block_quiet)
                self.drop_line = True
                continue
            nl = _find_newline(data, pos, end) if COMPILED else data.find(b"\n", pos)
            if self.drop_line:
                if nl < 0:
                    pos = end  # dropped as it arrives, never buffered
                    break
                self.drop_line = False
                pos = nl + 1
                continue
            if nl < 0 or nl - pos >= max_line:
                if nl >= 0 or end - pos >= max_line:
                    sink.fatal(LINE_TOO_LONG)
                    pos = end
                break
            stop = nl - 1 if nl > pos and data[nl - 1] == 13 else nl
            args = _split_words(data, pos, stop) if COMPILED else data[pos:stop].split()
            start = pos
            pos = nl + 1
            if not args:
                continue
            word = args[0]
            if word == self.last_word:
                command = self.last_command
            else:
                command = table.get(word)
                if command is None:
                    command = table.get(word.lower())
                    if command is None:
                        command = self.unknown
                self.last_word = word
                self.last_command = command
            quiet = False
            if command.noreply_after and len(args) > command.noreply_after:
                quiet = args[-1] == b"noreply"
            if command.shape == LINE:
                verdict = sink.request(command, args, quiet)
            else:
                # The block's length: digits only (no sign), at most LENGTH_LIMIT.
                size = -2
                if len(args) > command.length_at:
                    raw = args[command.length_at]
                    if raw == self.last_length:
                        size = self.last_size
                    else:
                        size = int(raw) if raw.isdigit() and len(raw) <= 10 else -1
                        if size > LENGTH_LIMIT:
                            size = -1
                        elif size >= 0:
                            self.last_length = raw
                            self.last_size = size
                if size < 0:
                    # Where this block ends cannot be known: answer, and close.
                    sink.fatal(BAD_DATA_CHUNK if size == -1 else BAD_COMMAND_LINE)
                    pos = end
                    break
                verdict = sink.block_header(command, args, size, quiet)
                if verdict == KEEP:
                    self.block_command = command
                    self.block_args = args
                    self.block_size = size
                    self.block_quiet = quiet
                    continue
                if verdict == SKIP:
                    self.block_quiet = quiet
                    self.expect_end = True
                    n = min(size, end - pos)
                    pos += n
                    if n < size:
                        self.skip = size - n
                        break
                    continue
            if verdict == GO:
                continue
            if verdict == LATER:
                pos = start
            break
        rest = data[pos:] if pos < end else b""
        if self.block_command is not None and self.block_data is None:
            size = self.block_size
            if size > ACCUMULATE_THRESHOLD and len(rest) <= size:
                # Filled as it arrives: what came is copied into it once, and never again.
                self.block_data = _new_block(size)
                n = len(rest)
                _fill(self.block_data, 0, rest, n)
                self.filled = n
                if n == size:
                    self._block_whole()
                rest = b""
        self.buf = rest

    def _block_whole(self) -> None:
        """The block being filled is complete: the plain build's chunks become bytes."""
        if not COMPILED:
            self.block_data = b"".join(self.block_data)  # type: ignore[arg-type]


def _new_block(size: int) -> bytes | list[bytes]:
    """An uninitialised block of ``size`` bytes to fill as it arrives.

    Compiled: the bytes object itself (CPython's idiom for building one; nothing else
    sees it until it is whole).  Plain: a list of the chunks as they arrive, joined once
    whole (one copy; a bytearray was zeroed, filled, then copied into bytes: three)."""
    if COMPILED:
        return PyBytes_FromStringAndSize(cython.NULL, size)
    return []


def _fill(block: bytes | list[bytes], at: int, data: bytes, n: int) -> None:
    """Copy ``data[:n]`` into ``block`` at ``at`` (plain: keep it, the chunks in order)."""
    if COMPILED:
        target = block
        memcpy(cython.cast(cython.p_char, target) + at, cython.cast(cython.p_char, data), n)
        return
    block.append(data if n == len(data) else data[:n])  # type: ignore[union-attr]


def _find_newline(data: bytes, pos: int, end: int) -> int:
    """Where the next ``\\n`` at or after ``pos`` is in ``data`` (``end`` long); -1: none.

    The compiled build's ``bytes.find``: ``memchr``, not a Python method call."""
    start = cython.cast(cython.p_char, data)
    found = cython.cast(cython.p_char, memchr(start + pos, 10, end - pos))
    return -1 if found == cython.NULL else found - start


def _split_words(data: bytes, pos: int, stop: int) -> list[bytes]:
    """The words of ``data[pos:stop]`` split at ASCII whitespace, as ``bytes.split()``.

    The compiled build's split of a request line: no slice, no Python method call (the
    plain build's parse calls ``bytes.split`` itself)."""
    if not COMPILED:
        return data[pos:stop].split()
    chars = cython.cast(cython.p_uchar, cython.cast(cython.p_char, data))
    # Count first, then fill a list of that size: no list growth per word.
    count = 0
    i = pos
    while i < stop:
        if not _is_space(chars[i]) and (i == pos or _is_space(chars[i - 1])):
            count += 1
        i += 1
    words = PyList_New(count)
    n = 0
    i = pos
    while n < count:
        while _is_space(chars[i]):
            i += 1
        j = i + 1
        while j < stop and not _is_space(chars[j]):
            j += 1
        word = PyBytes_FromStringAndSize(cython.cast(cython.p_char, chars + i), j - i)
        Py_INCREF(word)  # PyList_SET_ITEM takes the reference
        PyList_SET_ITEM(words, n, word)
        n += 1
        i = j
    return words


def _is_space(c: int) -> bool:
    """``bytes.isspace`` of one byte: space, \\t, \\n, \\v, \\f, \\r."""
    return c == 32 or 9 <= c <= 13
