"""Finding the servers through ZooKeeper server sets (needs ``kestreld[zookeeper]``).

A kestreld (or Kestrel 2.4) cluster publishes two server sets:
``<path_prefix>/read`` holds the servers that serve reads and
``<path_prefix>/write`` those that take writes (see docs/operations.md,
"Clusters and discovery").  :class:`Discovery` follows both with ZooKeeper
watches and tells its subscribers the members' memcache endpoints after
every change::

    client = Client(zookeeper="zk1:2181,zk2:2181/kestrel/prod")

or, to share one ZooKeeper session between clients::

    discovery = Discovery("zk1:2181/kestrel/prod")
    discovery.start()
    client = Client(discovery=discovery)

A member whose data cannot be parsed is left out, with one warning.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from kestreld.cluster.member import MEMBER_PREFIX, parse_member
from kestreld.extras import install_command

log = structlog.get_logger("kestreld.client")

Members = list[tuple[str, int]]
Subscriber = Callable[[Members, Members], None]
SETS = ("read", "write")
#: Back-off after a failed ZooKeeper read, doubling up to MAX_BACKOFF (seconds).
MIN_BACKOFF = 0.2
MAX_BACKOFF = 5.0


def split_connect_string(text: str) -> tuple[str, str]:
    """``"zk1:2181,zk2:2181/kestrel/prod"`` -> (``"zk1:2181,zk2:2181"``, ``"/kestrel/prod"``)."""
    hosts, slash, path = text.partition("/")
    path = "/" + path.rstrip("/") if slash else ""
    if not hosts.strip() or not path or path == "/" or "//" in path:
        raise ValueError(
            f"zookeeper={text!r}: expected hosts and the server sets' path prefix, "
            'like "zk1:2181,zk2:2181/kestrel/prod"'
        )
    for part in hosts.split(","):
        host, port = part.strip(), "2181"
        if ":" in host:
            host, _, port = host.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"zookeeper={text!r}: {part!r} is not host:port")
    return hosts, path


class Discovery:
    """The read and write server sets under ``path_prefix``, kept current by watches.

    ``zookeeper`` is ``"hosts/path_prefix"``; or give ``hosts`` and
    ``path_prefix`` apart.  ``credentials`` (``"user:password"``) are sent
    as digest auth, for sets that only authenticated sessions may read.
    ``endpoint`` names the protocol whose address is used (``memcache``).
    Safe to use from any thread; subscribers are called on a worker thread.
    """

    def __init__(
        self,
        zookeeper: str | None = None,
        *,
        hosts: str | None = None,
        path_prefix: str | None = None,
        credentials: str | None = None,
        session_timeout: float = 10.0,
        endpoint: str = "memcache",
        start_timeout: float = 10.0,
    ) -> None:
        if zookeeper is not None:
            hosts, path_prefix = split_connect_string(zookeeper)
        if not hosts or not path_prefix:
            raise ValueError("Discovery needs zookeeper='hosts/path' or hosts= and path_prefix=")
        try:
            from kestreld.cluster.session import ZooKeeperSession
        except ImportError:
            raise ImportError(
                f"following ZooKeeper server sets needs kazoo: {install_command('zookeeper')}"
            ) from None
        self.hosts = hosts
        self.path_prefix = path_prefix.rstrip("/")
        self.endpoint = endpoint
        self.start_timeout = start_timeout
        self._members: dict[str, Members] = {name: [] for name in SETS}
        #: child path -> (host, port), or None for a member that cannot be parsed
        self._parsed: dict[str, tuple[str, int] | None] = {}
        self._subscribers: list[Subscriber] = []
        self._cond = threading.Condition()
        self._dirty = True
        self._loaded = False
        self._closing = False
        self._session = ZooKeeperSession(
            hosts, session_timeout, credentials=credentials, on_state=self._session_changed
        )
        self._zk = self._session.zk
        self._worker = threading.Thread(target=self._run, name="kestreld-discovery", daemon=True)

    # --- the caller's verbs ----------------------------------------------------------------------

    def start(self) -> bool:
        """Connect and read both sets; waits up to ``start_timeout`` seconds for the first
        read (True when it came; else the sets fill in when ZooKeeper answers)."""
        self._session.start()
        self._worker.start()
        with self._cond:
            loaded = self._cond.wait_for(lambda: self._loaded, self.start_timeout)
        if not loaded:
            log.warning(
                "discovery_not_ready",
                hosts=self.hosts,
                path_prefix=self.path_prefix,
                waited=self.start_timeout,
            )
        return loaded

    def read_servers(self) -> Members:
        """``(host, port)`` of every member of the read set."""
        with self._cond:
            return list(self._members["read"])

    def write_servers(self) -> Members:
        """``(host, port)`` of every member of the write set."""
        with self._cond:
            return list(self._members["write"])

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call ``subscriber(read, write)`` now and after every change."""
        with self._cond:
            self._subscribers.append(subscriber)
            read, write = list(self._members["read"]), list(self._members["write"])
        subscriber(read, write)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        with self._cond:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._worker.is_alive():
            self._worker.join(timeout=10)
        self._session.close()

    # --- kazoo's threads ---------------------------------------------------------------------------

    def _session_changed(self, state: str) -> None:
        self._changed(None)

    def _changed(self, event: object) -> None:
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    # --- the worker ----------------------------------------------------------------------------------

    def _run(self) -> None:
        from kazoo.exceptions import KazooException
        from kazoo.handlers.threading import KazooTimeoutError

        backoff = MIN_BACKOFF
        while True:
            with self._cond:
                if not self._dirty and not self._closing:
                    check_in = self._session.seconds_until_check()
                    self._cond.wait(None if check_in is None else check_in + 0.05)
                if self._closing:
                    return
                self._dirty = False
            if not self._session.connected:
                self._session.check()  # a session that cannot resume is replaced
                continue  # the session listener wakes us when it connects
            try:
                members = {name: self._read_set(name) for name in SETS}
                backoff = MIN_BACKOFF
            except (KazooException, KazooTimeoutError) as e:
                log.warning("discovery_read_failed", error=f"{type(e).__name__}: {e}")
                with self._cond:
                    self._dirty = True
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)
                continue
            with self._cond:
                changed = members != self._members or not self._loaded
                self._members = members
                self._loaded = True
                subscribers = list(self._subscribers)
                self._cond.notify_all()
            if changed:
                for subscriber in subscribers:
                    try:
                        subscriber(list(members["read"]), list(members["write"]))
                    except Exception:
                        log.exception("discovery_subscriber_failed")

    def _read_set(self, name: str) -> Members:
        """The members of one set now, with a watch for the next change."""
        from kazoo.exceptions import NoNodeError

        zk = self._zk
        path = f"{self.path_prefix}/{name}"
        try:
            children = zk.get_children(path, watch=self._changed)
        except NoNodeError:
            # Not created yet (no server joined): watch for its creation.
            if zk.exists(path, watch=self._changed) is None:
                return []
            children = zk.get_children(path, watch=self._changed)
        out: Members = []
        for child in sorted(children):
            if not child.startswith(MEMBER_PREFIX):
                continue
            child_path = f"{path}/{child}"
            if child_path not in self._parsed:
                self._parsed[child_path] = self._parse(child_path)
            found = self._parsed[child_path]
            if found is not None and found not in out:
                out.append(found)
        present = {f"{path}/{child}" for child in children}
        for gone in [p for p in self._parsed if p.startswith(path + "/") and p not in present]:
            del self._parsed[gone]
        return out

    def _parse(self, path: str) -> tuple[str, int] | None:
        from kazoo.exceptions import NoNodeError

        try:
            # A member's data is written once; a watch still catches one overwritten later.
            data, _ = self._zk.get(path, watch=self._member_rewritten)
        except NoNodeError:
            return None
        try:
            member = parse_member(data)
        except ValueError as e:
            log.warning("server_set_member_unparsable", node=path, error=str(e))
            return None
        endpoint = member.endpoint(self.endpoint)
        if endpoint is None:
            log.warning("server_set_member_without_endpoint", node=path, endpoint=self.endpoint)
            return None
        return endpoint.host, endpoint.port

    def _member_rewritten(self, event: object) -> None:
        path = getattr(event, "path", None)
        with self._cond:
            if path is not None:
                self._parsed.pop(path, None)
            self._dirty = True
            self._cond.notify_all()
