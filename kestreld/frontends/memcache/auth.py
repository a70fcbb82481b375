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
meanwhile the connection waits as for a get with a timeout (the session's wait,
:meth:`~kestreld.session.session.Session.authenticate`):
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

from collections.abc import Callable
from typing import TYPE_CHECKING

from kestreld.frontends.memcache import commands
from kestreld.frontends.memcache.codes import LINE
from kestreld.frontends.memcache.framing import Command
from kestreld.frontends.memcache.replies import STORED, client_error
from kestreld.security.policy import ALL_ROLES, Role, User

if TYPE_CHECKING:
    from kestreld.frontends.memcache.connection import MemcacheConnection

UNAUTHENTICATED = client_error("unauthenticated")
AUTH_FAILURE = client_error("authentication failure")
BAD_TOKEN = client_error("bad authentication token format")
PERMISSION_DENIED = client_error("permission denied")

#: The longest auth ``set`` data read; a longer one is refused unread (skipped).
MAX_TOKEN = 4096


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
        quiet = len(args) > 5 and args[-1] == b"noreply"
        conn.session.refuse_authentication("token too long", _address(conn), _answer(quiet, False))
        return False
    return True


def _auth(conn: MemcacheConnection, args: list[bytes], data: bytes) -> None:
    """The data of the auth ``set``: ``<user> <password>``.

    Always answered after a wait (the session's), even when the password was
    checked before: the requests behind it are judged afresh, with the
    command table the answer gives.
    """
    from kestreld.security.authenticator import parse_token  # loaded with the auth file

    quiet = len(args) > 5 and args[-1] == b"noreply"
    token = parse_token(data)
    session = conn.session
    if token is None:
        session.refuse_authentication("bad token format", _address(conn), _answer(quiet, True))
        return
    name, password = token
    session.authenticate(name, password, _address(conn), _answer(quiet, False))


def _answer(quiet: bool, bad_token: bool) -> Callable[[MemcacheConnection, User | None], None]:
    """How the end of the check is answered (the connection's ``authentication_ended``).

    ``quiet`` (``noreply``): not at all, refusal or ``STORED``.  (memcached 1.6
    answers ``STORED`` all the same, which puts pymemcache, whose ``set``
    defaults to ``noreply``, one reply out of step.)
    """

    def answer(conn: MemcacheConnection, user: User | None) -> None:
        if user is not None:
            conn.framing.use_table(table_for(user, conn.server.commands), commands.UNKNOWN)
            reply = STORED
        else:
            reply = BAD_TOKEN if bad_token else AUTH_FAILURE
        if not quiet:
            conn.out.append(reply)

    return answer


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

_TABLES: dict[tuple[User, int], dict[bytes, Command]] = {}


def table_for(user: User, base: dict[bytes, Command] = commands.COMMANDS) -> dict[bytes, Command]:
    """The command table of ``user``: ``base`` (the server's table: with ``workers = N``
    the routed one, so permissions are judged where the client landed, before a request
    crosses) when nothing is limited, else its commands guarded."""
    if user.roles == ALL_ROLES and not user.patterns:
        return base
    key = (user, id(base))
    table = _TABLES.get(key)
    if table is None:
        if len(_TABLES) >= 1000:
            _TABLES.clear()  # users of old auth files
        table = _TABLES[key] = {
            word: _guarded(command, *NEEDS[word]) if word in NEEDS else command
            for word, command in base.items()
        }
    return table


def _queue_of(raw: bytes) -> str | None:
    """The queue a key names (``q/open`` -> ``q``), None when it is not a legal name."""
    return commands.queue_name(raw.split(b"/", 1)[0])


def _permitted(conn: MemcacheConnection, role: Role, where: str | None, args: list[bytes]) -> bool:
    # The session judges: a put through an alias needs the role on every destination.
    session = conn.session
    if where is None:
        return session.permit(role, None)
    keys = args[1:] if where == "keys" else args[1:2]
    for key in keys:
        name = _queue_of(key)
        if name is not None and not session.permit(role, name):
            return False
    return True  # a missing or bad name gets the command's own error


def _guarded(command: Command, role: Role, where: str | None) -> Command:
    run: Callable = command.run
    if command.shape == LINE:

        def guarded_run(conn: MemcacheConnection, args: list[bytes]) -> None:
            if _permitted(conn, role, where, args):
                run(conn, args)
            else:
                conn.out.append(PERMISSION_DENIED)

        return Command(
            command.word, guarded_run, noreply_after=command.noreply_after,
            waits_for_sets=command.waits_for_sets,
        )  # fmt: skip
    accept: Callable = command.accept  # type: ignore[assignment]

    def guarded_accept(conn: MemcacheConnection, args: list[bytes], size: int) -> bool:
        if _permitted(conn, role, where, args):
            return accept(conn, args, size)
        conn.out.append(PERMISSION_DENIED)
        return False  # the block is skipped: the stream stays in step

    return Command(
        command.word, run, shape=command.shape, noreply_after=command.noreply_after,
        accept=guarded_accept, waits_for_sets=command.waits_for_sets,
    )  # fmt: skip
