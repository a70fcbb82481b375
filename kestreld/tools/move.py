"""``kestreld move``: move items from one queue to another, each exactly once.

    kestreld move SRC DST [--limit N] [--wait S] [--host H] [--port N] [--config FILE]
                  [login options]

SRC and DST are ``queue`` (on the server ``--host``/``--port``/``--config``
name) or ``HOST:PORT/queue`` (any server).  Each item is taken from SRC by a
reliable read, ``set`` to DST, and only once DST said ``STORED`` is the read
closed on SRC:

    get SRC/open  ->  set DST  ->  get SRC/close

So an item leaves SRC only after DST has it.  If the move is killed, or a
connection breaks, SRC gets the open item back when the connection drops: a
killed move loses nothing, and at most the one item in flight (stored on DST,
not yet closed on SRC) is moved twice.  SIGINT and SIGTERM stop it after the
item in flight, with nothing duplicated.

SRC needs only the plain memcache protocol with ``/open`` and ``/close``:
any Kestrel-compatible server (Kestrel 2.x or 3.x, Darner, kestreld) can be
drained this way while it runs, e.g. into kestreld during a migration.  Items
keep their data; their expiry time is not carried over (the protocol does not
return it).

The login options (``--tls``, ``--tls-ca-file``, ``--user``, ...;
:mod:`kestreld.tools.endpoint`) apply to both servers: on a server with an
auth file the user needs the ``read`` role on SRC and ``write`` on DST, and
a refusal names the role.

It stops when SRC is empty (after waiting ``--wait`` seconds for one more
item), after ``--limit`` items, or on an error.  Progress goes to stderr on a
terminal.  Exit status 0 when done, 1 on an error (the item in flight is
given back to SRC), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from typing import TextIO

import structlog

from kestreld.client.errors import KestrelError
from kestreld.client.wire import wait_ms
from kestreld.tools.endpoint import (
    EndpointError,
    Login,
    QueueAt,
    add_server_options,
    default_server,
    explain,
    login_from,
    parse_queue_at,
)

log = structlog.get_logger("kestreld.move")

#: Seconds between two progress lines on a terminal.
PROGRESS_EVERY = 0.5


class MoveError(Exception):
    """The move stopped early; the message says why (the item in flight went back to SRC)."""


@dataclass(slots=True)
class MoveResult:
    moved: int
    seconds: float
    stopped_by_signal: bool = False


class Progress:
    """``moved N items (R/s)`` rewritten in place on a terminal, silent otherwise."""

    def __init__(self, out: TextIO, what: str) -> None:
        self.out = out
        self.what = what
        self.enabled = out.isatty()
        self.started = self.last = time.monotonic()

    def update(self, moved: int, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self.last < PROGRESS_EVERY):
            return
        self.last = now
        rate = moved / max(now - self.started, 1e-9)
        self.out.write(f"\r{self.what}: moved {moved} items ({rate:,.0f}/s)  ")
        self.out.flush()

    def done(self, moved: int) -> None:
        if self.enabled:
            self.update(moved, force=True)
            self.out.write("\n")
            self.out.flush()


class Mover:
    """One move from ``src`` to ``dst``; ``run()`` once."""

    def __init__(
        self, src: QueueAt, dst: QueueAt, *, timeout: float = 10.0, login: Login | None = None
    ) -> None:
        if src == dst:
            raise EndpointError(f"source and destination are the same queue: {src}")
        if src.server == dst.server and src.queue.partition("+")[0] == dst.queue:
            raise EndpointError(
                f"{dst} feeds {src}: every item moved would come back to it, without end"
            )
        if "+" in dst.queue:
            raise EndpointError(f"cannot put to the fanout reader {dst.queue!r}: name its queue")
        self.src, self.dst = src, dst
        self.login = login or Login()
        self._src = self.login.connect(src.server, timeout)
        self._dst = self.login.connect(dst.server, timeout)
        self.stop_requested = False

    def request_stop(self, *_: object) -> None:
        """Stop after the item in flight (a signal handler)."""
        self.stop_requested = True

    def run(
        self, limit: int | None = None, wait: float = 0.0, progress: Progress | None = None
    ) -> MoveResult:
        started = time.monotonic()
        moved = 0
        open_key = f"{self.src.queue}/open" + (f"/t={wait_ms(wait)}" if wait > 0 else "")
        try:
            while not self.stop_requested and (limit is None or moved < limit):
                data = self._take(open_key, wait, moved)
                if data is None:
                    break  # SRC is empty
                # From here until the close, the item is "in flight": a kill now
                # gives it back to SRC when the connection drops.
                if not self._store(data):
                    raise MoveError(f"{self.dst} refused the item (NOT_STORED: full, or too large)")
                self._src.get(f"{self.src.queue}/close")
                moved += 1
                if progress is not None:
                    progress.update(moved)
        except KestrelError as e:
            raise MoveError(f"stopped after {moved} items: {e}") from None
        finally:
            # Closing SRC without a close gives back an item still open: never lost.
            self._src.close()
            self._dst.close()
            if progress is not None:
                progress.done(moved)
        return MoveResult(moved, time.monotonic() - started, self.stop_requested)

    def _take(self, open_key: str, wait: float, moved: int) -> bytes | None:
        try:
            return self._src.get(open_key, wait)
        except KestrelError as e:
            why = explain(e, self.login, f"take items from {self.src.queue}", "read")
            raise MoveError(
                f"stopped after {moved} items: {self.src.server.address}: {why}"
            ) from None

    def _store(self, data: bytes) -> bool:
        try:
            return self._dst.put(self.dst.queue, data, 0)
        except KestrelError as e:
            why = explain(e, self.login, f"put items to {self.dst.queue}", "write")
            raise MoveError(f"cannot store on {self.dst.server.address}: {why}") from None


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kestreld move",
        description="Move items from SRC to DST exactly once (reliable read, set, confirm). "
        "SRC and DST are QUEUE or HOST:PORT/QUEUE; SRC may be any Kestrel-compatible server.",
    )
    p.add_argument("src", metavar="SRC", help="queue to take items from: QUEUE or HOST:PORT/QUEUE")
    p.add_argument("dst", metavar="DST", help="queue to put them to: QUEUE or HOST:PORT/QUEUE")
    p.add_argument("--limit", type=int, help="move at most N items (default: until SRC is empty)")
    p.add_argument(
        "--wait",
        type=float,
        default=0.0,
        help="seconds to wait for another item before taking SRC as empty (default 0)",
    )
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default 10)")
    add_server_options(p)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.limit is not None and args.limit < 0:
        print("kestreld move: --limit must not be negative", file=sys.stderr)
        return 2
    try:
        default = default_server(args)
        src, dst = parse_queue_at(args.src, default), parse_queue_at(args.dst, default)
        mover = Mover(src, dst, timeout=args.timeout, login=login_from(args))
    except EndpointError as e:
        print(f"kestreld move: {e}", file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, mover.request_stop)
    progress = Progress(sys.stderr, f"{src} -> {dst}")
    try:
        result = mover.run(args.limit, args.wait, progress)
    except MoveError as e:
        print(f"kestreld move: {src} -> {dst}: {e}", file=sys.stderr)
        return 1
    rate = result.moved / result.seconds if result.seconds > 0 else 0.0
    why = " (stopped by signal)" if result.stopped_by_signal else ""
    print(
        f"moved {result.moved} items from {src} to {dst} in {result.seconds:.1f}s ({rate:,.0f}/s){why}"
    )
    return 0
