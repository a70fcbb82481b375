"""Authentication and roles on the memcache port, memcached 1.6's way (``-Y``).

With an ``auth_file`` every connection starts locked: its framing gets the
:data:`LOCKED` command table, in which every command but ``set`` answers
``CLIENT_ERROR unauthenticated`` (a storage command's data block is skipped,
so the stream stays in step).  The auth ``set`` is memcached's: any key, data
``<user> <password>``; it answers ``STORED`` and stores nothing, or
``CLIENT_ERROR authentication failure`` (unknown user, wrong password) or
``CLIENT_ERROR bad authentication token format`` (not two words).  The
connection stays open after a refusal, so the client can try again.

The password check runs off the event loop (:class:`~kestreld.security.Authenticator`);
meanwhile the connection waits as a get with a timeout waits (``conn.waiting``):
its later requests stay buffered and replies stay in order.  Repeated
failures from one address are delayed before their refusal, on that
connection only.

Once authenticated, the connection gets the table of its user: the plain
command table for a user with every role on every queue (nothing is added
per request), else the commands wrapped in permission checks (``set`` needs
``write``; fetching — ``get``, ``/open``, ``/close``, ``/abort``, ``/peek``,
``confirm``, ``monitor`` — ``read``; ``flush``, ``delete``,
``flush_expired``, ``flush_all``, ``flush_all_expired``, ``status``,
``reload``, ``shutdown`` ``admin``), answering ``CLIENT_ERROR permission
denied`` with the data block of a refused ``set`` skipped.  Without an auth
file nothing here runs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kestreld.protocol import commands
from kestreld.protocol.framing import LINE, Command
from kestreld.protocol.replies import STORED, client_error
from kestreld.security.authenticator import parse_token
from kestreld.security.policy import ALL_ROLES, Role, User

if TYPE_CHECKING:
    from kestreld.protocol.connection import MemcacheConnection

UNAUTHENTICATED = client_error("unauthenticated")
AUTH_FAILURE = client_error("authentication failure")
BAD_TOKEN = client_error("bad authentication token format")
PERMISSION_DENIED = client_error("permission denied")

#: The longest auth ``set`` data read; a longer one is refused unread (skipped).
MAX_TOKEN = 4096


def lock(conn: MemcacheConnection) -> None:
    """A new connection of a server with an auth file: nothing runs until it authenticates."""
    conn.framing.table = LOCKED
    conn.framing.unknown = LOCKED_UNKNOWN


def admit(conn: MemcacheConnection, user: User) -> None:
    """The connection authenticated as ``user``: from now on its commands are the user's."""
    conn.framing.table = table_for(user)
    conn.framing.unknown = commands.UNKNOWN


# --- before authentication ------------------------------------------------------------------


def _refuse_line(conn: MemcacheConnection, args: list[bytes]) -> None:
    conn.out.append(UNAUTHENTICATED)


def _refuse_block(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
    conn.out.append(UNAUTHENTICATED)
    return False  # the block is skipped, never read


def _accept_auth(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
    """The line of the auth ``set``: read its data unless the line is not a set's."""
    if len(args) < 5 or not (args[2].isdigit() and args[3].lstrip(b"-").isdigit()):
        conn.out.append(UNAUTHENTICATED)  # memcached: a malformed set is just unauthenticated
        return False
    if size > MAX_TOKEN:
        _check_later(conn, _refused(conn, None, "token too long", AUTH_FAILURE))
        return False
    return True


def _auth(conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:
    """The data of the auth ``set``: ``<user> <password>``.

    Always answered as a wait, even when the password was checked before: the
    requests behind it are parsed afresh, with the table the answer gives.
    """
    quiet = len(args) > 5 and args[-1] == b"noreply"
    token = parse_token(data)
    if token is None:
        _check_later(conn, _refused(conn, None, "bad token format", BAD_TOKEN), quiet)
        return
    name, password = token
    _check_later(conn, _check(conn, name, password), quiet)


async def _check(conn: MemcacheConnection, name: str, password: bytes) -> bytes:
    user = await conn.server.authenticator.authenticate(name, password, _address(conn))  # type: ignore[attr-defined]
    if user is None:
        conn.stats.auth_failures += 1
        return AUTH_FAILURE
    _succeeded(conn, user)
    return STORED


async def _refused(conn: MemcacheConnection, name: str | None, reason: str, reply: bytes) -> bytes:
    conn.stats.auth_failures += 1
    await conn.server.authenticator.refused(_address(conn), name, reason)  # type: ignore[attr-defined]
    return reply


def _succeeded(conn: MemcacheConnection, user: User) -> None:
    conn.stats.auth_successes += 1
    admit(conn, user)


def _check_later(conn: MemcacheConnection, check, quiet: bool = False) -> None:
    """Run ``check`` (a coroutine giving the reply) as this connection's wait.

    ``quiet`` (``noreply``): no reply, refusal or ``STORED``.  (memcached 1.6
    answers ``STORED`` all the same, which puts pymemcache, whose ``set``
    defaults to ``noreply``, one reply out of step.)
    """
    task = conn.server.loop.create_task(check)
    conn.waiting = task  # later requests wait for the answer, in order
    task.add_done_callback(lambda t: _answered(conn, t, quiet))


def _answered(conn: MemcacheConnection, task: asyncio.Task, quiet: bool) -> None:
    if conn.waiting is task:
        conn.waiting = None
    if conn.closing:
        return
    if quiet:
        if not task.cancelled():
            task.exception()  # retrieved: nothing to answer
    elif not task.cancelled():
        if task.exception() is None:
            conn.out.append(task.result())
        else:
            conn.out.append(AUTH_FAILURE)  # never admit on an error
    conn.last_active = time.monotonic()
    conn.resume()


def _address(conn: MemcacheConnection) -> str | None:
    peer = conn.peer
    if isinstance(peer, tuple) and peer:
        return str(peer[0])
    return None if peer is None else str(peer)


def _locked_table() -> dict[bytes, Command]:
    table = {}
    for word, command in commands.COMMANDS.items():
        if word == b"set":
            table[word] = Command(
                word, _auth, shape=command.shape, noreply_after=5, accept=_accept_auth,
                waits_for_sets=False,
            )  # fmt: skip
        elif command.shape == LINE:
            table[word] = Command(word, _refuse_line, waits_for_sets=False)
        else:
            table[word] = Command(
                word, command.run, shape=command.shape, noreply_after=command.noreply_after,
                accept=_refuse_block, waits_for_sets=False,
            )  # fmt: skip
    return table


LOCKED: dict[bytes, Command] = _locked_table()
LOCKED_UNKNOWN = Command(b"", _refuse_line, waits_for_sets=False)


# --- after: the user's roles ------------------------------------------------------------------

#: Command word -> (role it needs, where its queue name is: "key" for args[1],
#: "keys" for every get key, None for the whole server).
NEEDS: dict[bytes, tuple[Role, str | None]] = {
    b"set": (Role.WRITE, "key"),
    b"get": (Role.READ, "keys"),
    b"gets": (Role.READ, "keys"),
    b"confirm": (Role.READ, "key"),
    b"monitor": (Role.READ, "key"),
    b"delete": (Role.ADMIN, "key"),
    b"flush": (Role.ADMIN, "key"),
    b"flush_expired": (Role.ADMIN, "key"),
    b"flush_all": (Role.ADMIN, None),
    b"flush_all_expired": (Role.ADMIN, None),
    b"status": (Role.ADMIN, None),
    b"reload": (Role.ADMIN, None),
    b"shutdown": (Role.ADMIN, None),
}

_TABLES: dict[User, dict[bytes, Command]] = {}


def table_for(user: User) -> dict[bytes, Command]:
    """The command table of ``user``: the plain one when nothing is limited."""
    if user.roles == ALL_ROLES and not user.patterns:
        return commands.COMMANDS
    table = _TABLES.get(user)
    if table is None:
        if len(_TABLES) >= 1000:
            _TABLES.clear()  # users of old auth files
        table = _TABLES[user] = {
            word: _guarded(user, command, *NEEDS[word]) if word in NEEDS else command
            for word, command in commands.COMMANDS.items()
        }
    return table


def _queue_of(raw: bytes) -> str | None:
    """The queue a key names (``q/open`` -> ``q``), None when it is not a legal name."""
    return commands.queue_name(raw.split(b"/", 1)[0])


def _permitted(user: User, role: Role, where: str | None, args: list[bytes]) -> bool:
    if where is None:
        return user.permits(role, None)
    keys = args[1:] if where == "keys" else args[1:2]
    for key in keys:
        name = _queue_of(key)
        if name is not None and not user.permits(role, name):
            return False
    return True  # a missing or bad name gets the command's own error


def _guarded(user: User, command: Command, role: Role, where: str | None) -> Command:
    run: Callable = command.run
    if command.shape == LINE:

        def guarded_run(conn: MemcacheConnection, args: list[bytes]) -> None:
            if _permitted(user, role, where, args):
                run(conn, args)
            else:
                conn.out.append(PERMISSION_DENIED)

        return Command(
            command.word, guarded_run, noreply_after=command.noreply_after,
            waits_for_sets=command.waits_for_sets,
        )  # fmt: skip
    accept: Callable = command.accept  # type: ignore[assignment]

    def guarded_accept(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
        if _permitted(user, role, where, args):
            return accept(conn, args, size)
        conn.out.append(PERMISSION_DENIED)
        return False  # the block is skipped: the stream stays in step

    return Command(
        command.word, run, shape=command.shape, noreply_after=command.noreply_after,
        accept=guarded_accept, waits_for_sets=command.waits_for_sets,
    )  # fmt: skip
