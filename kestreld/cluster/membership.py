"""A server's members of its two server sets, kept in step with its status (kazoo).

Kestrel 2.4's ``ZooKeeperServerStatus``: the server joins
``<path_prefix>/read`` while its status is UP, WRITEAVOID or READONLY and
``<path_prefix>/write`` only while UP, each as an ephemeral sequential
``member_`` node holding its server-set JSON (:mod:`kestreld.cluster.member`).
Leaving deletes the node; a crashed server's nodes vanish with its ZooKeeper
session, which is the failure detector.

:class:`ServerSetMembership` never blocks its caller's event loop and never
stops the queue server: the ZooKeeper session lives on kazoo's threads and
one worker thread of its own makes the nodes match what :meth:`want` asked
for.  The worker runs again whenever the session connects, a member node
changes or vanishes (a watch), or a ZooKeeper call failed (after a back-off
that doubles up to :data:`MAX_BACKOFF`); so a session lost while ZooKeeper
was down re-joins when it is back, and a member someone else deleted or
overwrote is put back.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable

import structlog
from kazoo.client import KazooState
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL, CREATOR_ALL_ACL, OPEN_ACL_UNSAFE, READ_ACL_UNSAFE

from kestreld.cluster.member import MEMBER_PREFIX, Endpoint, Member
from kestreld.cluster.session import ZooKeeperSession
from kestreld.config.model import ZooKeeperConfig

log = structlog.get_logger("kestreld.cluster")

#: The two server sets, in the order they are joined (read first, as Kestrel).
SETS = ("read", "write")
#: Back-off after a failed ZooKeeper call, doubling up to MAX_BACKOFF (seconds).
MIN_BACKOFF = 0.2
MAX_BACKOFF = 10.0
#: Even without events, the members are checked this often (seconds).
RECHECK = 5.0

ACLS: dict[str, list[ACL]] = {
    "open_unsafe": list(OPEN_ACL_UNSAFE),
    # twitter-commons' ZooKeeperUtils.EVERYONE_READ_CREATOR_ALL
    "everyone_read_creator_all": list(CREATOR_ALL_ACL) + list(READ_ACL_UNSAFE),
}


def advertised_host(address: str) -> str:
    """The host to advertise for a server listening on ``address``.

    A wildcard address (``0.0.0.0``, ``::``, empty) becomes the host's first
    non-loopback address; ValueError when it has none.  Anything else is
    advertised as it is (a loopback address works for one host only; the
    caller warns).
    """
    if address in ("", "0.0.0.0", "::", "*"):
        family = socket.AF_INET6 if address == "::" else socket.AF_INET
        for host in _local_addresses(family):
            return host
        raise ValueError(f"no non-loopback address to advertise for {address or '*'}")
    return address


def _local_addresses(family: int) -> list[str]:
    found: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, family, socket.SOCK_STREAM)
    except OSError:
        infos = []
    for info in infos:
        host = str(info[4][0])
        if not ipaddress.ip_address(host.split("%")[0]).is_loopback and host not in found:
            found.append(host)
    if not found:
        # The address the default route would use (a UDP connect sends nothing).
        probe = "2001:db8::1" if family == socket.AF_INET6 else "192.0.2.1"
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                host = s.getsockname()[0]
            if not ipaddress.ip_address(host).is_loopback:
                found.append(host)
        except OSError:
            pass
    return found


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def membership_of_server(
    config: ZooKeeperConfig,
    listen_address: str,
    ports: dict[str, int],
    on_connected: Callable[[bool], None] | None = None,
) -> ServerSetMembership:
    """The membership of a server listening on ``ports`` (front end -> port; memcache is the
    main endpoint, else thrift, else text, as Kestrel).  Raises ValueError for an address
    that cannot be advertised; warns when only this host could reach it."""
    host = advertised_host(config.advertise_address or listen_address)
    if is_loopback(host):
        log.warning(
            "zookeeper_advertises_loopback",
            address=host,
            hint="only clients on this host can use it; set zookeeper.advertise_address",
        )
    endpoints = {kind: Endpoint(host, port) for kind, port in ports.items()}
    return ServerSetMembership(config, endpoints, on_connected=on_connected)


class ServerSetMembership:
    """This server's ``read`` and ``write`` members, following :meth:`want`.

    ``on_connected`` is called (from a kazoo thread) with True or False when
    the ZooKeeper session connects or disconnects.  Every method is safe to
    call from any thread; :meth:`leave` and :meth:`close` block (run them off the event loop).
    """

    def __init__(
        self,
        config: ZooKeeperConfig,
        endpoints: dict[str, Endpoint],
        on_connected: Callable[[bool], None] | None = None,
    ) -> None:
        self.config = config
        self.member = Member.of_server(endpoints)
        self._data = self.member.encode()
        self._acl = ACLS[config.acl]
        self._on_connected = on_connected
        self._paths = {name: f"{config.path_prefix}/{name}" for name in SETS}
        self._wanted = dict.fromkeys(SETS, False)
        #: set name -> path of our member node, as far as we know it exists
        self._nodes: dict[str, str] = {}
        self._cond = threading.Condition()
        self._dirty = True
        self._session_lost = False
        self._sweep_strays = False
        self._closing = False
        self.connected = False
        self._session = ZooKeeperSession(
            config.hosts,
            config.session_timeout / 1000,
            credentials=config.credentials,
            default_acl=self._acl,
            on_state=self._session_changed,
        )
        self._zk = self._session.zk
        self._worker = threading.Thread(target=self._run, name="kestreld-zookeeper", daemon=True)

    # --- the caller's verbs ------------------------------------------------------------------

    def start(self) -> None:
        """Connect in the background and begin joining; returns at once."""
        log.info(
            "zookeeper_starting",
            hosts=self.config.hosts,
            path_prefix=self.config.path_prefix,
            member=self._data.decode(),
        )
        self._session.start()
        self._worker.start()

    def want(self, read: bool, write: bool) -> None:
        """Be a member of the read set iff ``read``, of the write set iff ``write``."""
        with self._cond:
            self._wanted = {"read": read, "write": write}
            self._dirty = True
            self._cond.notify_all()

    def members(self) -> dict[str, str]:
        """Set name -> path of this server's member node, for the sets it is in now."""
        with self._cond:
            return dict(self._nodes)

    def leave(self, timeout: float) -> bool:
        """Leave both sets and wait (at most ``timeout`` seconds); True when both are left."""
        self.want(False, False)
        with self._cond:
            self._cond.wait_for(lambda: not self._nodes or not self.connected, timeout)
            return not self._nodes

    def close(self) -> None:
        """End the session (its ephemeral members go with it) and the worker."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._worker.join(timeout=10)
        self._session.close()
        log.info("zookeeper_closed")

    # --- kazoo's threads -----------------------------------------------------------------------

    def _session_changed(self, state: str) -> None:
        """A kazoo listener: must not block; it only records and wakes the worker."""
        with self._cond:
            was = self.connected
            self.connected = state == KazooState.CONNECTED
            if state == KazooState.LOST:
                self._session_lost = True
            self._dirty = True
            self._cond.notify_all()
        if state == KazooState.CONNECTED:
            log.info("zookeeper_connected", hosts=self.config.hosts)
        elif state == KazooState.SUSPENDED:
            log.warning("zookeeper_disconnected", hosts=self.config.hosts)
        else:
            log.warning("zookeeper_session_lost", hosts=self.config.hosts)
        if self._on_connected is not None and was != self.connected:
            self._on_connected(self.connected)

    def _member_changed(self, event: object) -> None:
        """A watch on one of our member nodes fired (deleted, or data changed)."""
        with self._cond:
            self._dirty = True
            self._cond.notify_all()

    # --- the worker ------------------------------------------------------------------------------

    def _run(self) -> None:
        backoff = MIN_BACKOFF
        while True:
            with self._cond:
                if not self._dirty and not self._closing:
                    check_in = self._session.seconds_until_check()
                    self._cond.wait(RECHECK if check_in is None else min(RECHECK, check_in + 0.05))
                if self._closing:
                    return
                self._dirty = False
                if self._session_lost:
                    # Ephemeral nodes die with their session: nothing of ours is left.
                    self._session_lost = False
                    self._nodes.clear()
                    self._cond.notify_all()
                connected = self.connected
                wanted = dict(self._wanted)
                sweep = self._sweep_strays
            if not connected:
                self._session.check()  # a session that cannot resume is replaced
                continue
            try:
                # Leave the write set before the read set, join the read set first
                # (as Kestrel): a client never sees a writable server it may not read.
                for name in reversed(SETS):
                    if not wanted[name]:
                        self._reconcile(name, False, sweep)
                for name in SETS:
                    if wanted[name]:
                        self._reconcile(name, True, sweep)
                backoff = MIN_BACKOFF
                if sweep:
                    with self._cond:
                        self._sweep_strays = False
            except (KazooException, KazooTimeoutError) as e:
                log.warning(
                    "server_set_update_failed",
                    error=f"{type(e).__name__}: {e}",
                    retry_in=backoff,
                )
                with self._cond:
                    self._sweep_strays = True  # a create may have happened without its reply
                    self._dirty = True
                    self._cond.wait(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF)

    def _reconcile(self, name: str, wanted: bool, sweep: bool) -> None:
        """Make this server's member of set ``name`` exist (with our data) iff ``wanted``.

        ``sweep``: also delete other members of this session (after a failure).
        """
        zk = self._zk
        parent = self._paths[name]
        with self._cond:
            node = self._nodes.get(name)
        if not wanted:
            if node is not None:
                try:
                    zk.delete(node)
                except NoNodeError:
                    pass
                self._forget(name)
                log.info("server_set_left", set=name, node=node)
            if sweep:
                self._delete_strays(parent, keep=None)
            return
        if node is not None:
            try:
                data, _ = zk.get(node, watch=self._member_changed)
            except NoNodeError:
                log.warning("server_set_member_vanished", set=name, node=node)
                self._forget(name)
                node = None
            else:
                if data != self._data:
                    log.warning("server_set_member_repaired", set=name, node=node)
                    zk.set(node, self._data)
        if node is None:
            zk.ensure_path(parent, acl=self._acl)
            node = zk.create(
                f"{parent}/{MEMBER_PREFIX}",
                self._data,
                acl=self._acl,
                ephemeral=True,
                sequence=True,
            )
            with self._cond:
                self._nodes[name] = node
            zk.exists(node, watch=self._member_changed)
            log.info("server_set_joined", set=name, node=node)
        if sweep:
            self._delete_strays(parent, keep=node)

    def _delete_strays(self, parent: str, keep: str | None) -> None:
        """Delete members of this session other than ``keep`` (a create whose reply was lost)."""
        zk = self._zk
        session = zk.client_id[0] if zk.client_id else None
        try:
            children = zk.get_children(parent)
        except NoNodeError:
            return
        for child in children:
            path = f"{parent}/{child}"
            if path == keep or not child.startswith(MEMBER_PREFIX):
                continue
            stat = zk.exists(path)
            if stat is not None and stat.ephemeralOwner == session:
                try:
                    zk.delete(path)
                except NoNodeError:
                    continue
                log.warning("server_set_stray_member_deleted", node=path)

    def _forget(self, name: str) -> None:
        with self._cond:
            self._nodes.pop(name, None)
            self._cond.notify_all()
