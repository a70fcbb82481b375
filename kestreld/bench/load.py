"""The load generator: worker processes, each driving its share of a role's raw-socket
connections from one epoll loop, a batch of ``depth`` requests in flight per connection.

Every item carries its id in its first 16 bytes, so that consumers can count how many times
each id arrived (the exactly-once check).  Every loop is bounded: by its item count, by
``seconds`` (no new batch after it) and by a stall timeout.
"""

from __future__ import annotations

import array
import contextlib
import multiprocessing as mp
import os
import queue
import random
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

from kestreld.bench.servers import pin
from kestreld.workers.ownership import owner_of

ID_DIGITS = 16
STORED = b"STORED\r\n"
VALUE_END = b"\r\nEND\r\n"


@dataclass(slots=True)
class Role:
    """One kind of connection in a workload and what it must achieve.

    ``kind``: ``set`` (store ``count`` items), ``get`` (receive items),
    ``reliable`` (``get q/close/open`` loop), ``pair`` (memcached's analog of
    a queue hand-off: ``set k`` then ``get k`` ``reads`` times, per item), ``db``
    (Darner's client: ``count`` sets and ``gets`` gets, one at a time, mixed).
    """

    name: str
    kind: str
    connections: int
    count: int
    size: int = 1024
    depth: int = 1
    queue: str = "bench"
    distinct_keys: bool = False  # memcached: one key per item (k<id>)
    wait_ms: int = 0  # get /t=<ms>
    shared_stop: bool = False  # connections race on one queue: stop when the role has `count`
    stop_on_miss: bool = False  # a miss means the queue is drained
    verify: bool = False  # count the ids received (exactly-once check)
    ordered: bool = False  # get: each connection must receive ids in increasing order (FIFO)
    reads: int = 1  # pair: gets per set
    abort_rate: float = 0.0  # reliable: give this fraction of open reads back (/abort)
    drop_rate: float = 0.0  # reliable: drop the connection holding this fraction of open reads
    rate: float = 0.0  # items per second per connection; 0 = as fast as replies come
    gets: int = 0  # db: gets, beside the ``count`` sets
    hangup: int = 0  # db: every n-th request of a connection is cut in half and hung up
    #: > 1: connection i uses queue ``<queue><i mod queues>`` (many queues), and with several
    #: ports it talks to the one its queue hashes to, as a client splits queues over servers.
    queues: int = 1
    #: set, > 1: connection i alternates its sets over queues i .. i + spread - 1 (mod queues),
    #: item by item (always on the first server: one server's queues).
    spread: int = 1

    def queue_of(self, index: int) -> str:
        """The queue connection ``index`` uses."""
        return f"{self.queue}{index % self.queues}" if self.queues > 1 else self.queue

    def id_range(self, index: int) -> tuple[int, int]:
        """Ids [lo, hi) produced (or fetched by key) by connection ``index``."""
        n, c = self.count, self.connections
        return n * index // c, n * (index + 1) // c


@dataclass(slots=True)
class RoleResult:
    """What a role's connections did: one worker's tally, then the merge of its workers'."""

    role: Role
    requests: int = 0  # replies received
    items: int = 0  # the role's unit: stored, received, confirmed, handed over
    errors: int = 0
    cpu: float = 0.0  # client CPU seconds
    error_samples: list[str] = field(default_factory=list)
    latencies: array.array = field(default_factory=lambda: array.array("d"))
    last: float = 0.0  # the last reply that counted an item
    ids: bytearray | None = None  # per id: how many times it arrived (saturating at 255)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.error_samples) < 5:
            self.error_samples.append(what)

    def count_id(self, id_: int) -> None:
        ids = self.ids
        assert ids is not None
        if 0 <= id_ < len(ids):
            if ids[id_] < 255:
                ids[id_] += 1
        else:
            self.error(f"unknown item id {id_}")

    def merge(self, part: RoleResult) -> None:
        for name in ("requests", "items", "errors", "cpu"):
            setattr(self, name, getattr(self, name) + getattr(part, name))
        self.error_samples += part.error_samples[: 5 - len(self.error_samples)]
        self.latencies.extend(part.latencies)
        self.last = max(self.last, part.last)
        if part.ids is not None:
            self.ids = part.ids if self.ids is None else add_counts(self.ids, part.ids)

    def percentiles(self, *qs: float) -> list[float]:
        """Batch latencies (seconds) at these quantiles; 1.0 is the maximum."""
        lat = sorted(self.latencies)
        if not lat:
            return [0.0 for _ in qs]
        return [lat[min(len(lat) - 1, int(q * (len(lat) - 1) + 0.5))] for q in qs]


def add_counts(a: bytearray, b: bytearray) -> bytearray:
    """Two tallies of the times each id arrived, added (saturating at 255)."""
    return bytearray(min(255, x + y) for x, y in zip(a, b, strict=True))


@dataclass(slots=True)
class LoadResult:
    roles: dict[str, RoleResult]
    started: float  # perf_counter when the barrier opened

    def window(self, name: str | None = None) -> float:
        """Seconds from the start to the last counted reply of role ``name`` (or of any)."""
        roles = [self.roles[name]] if name else self.roles.values()
        return max(1e-9, max(r.last for r in roles) - self.started)


# --- connections ------------------------------------------------------------------------------


def _set_format(role: Role, distinct: bool | None = None, queue: str = "") -> bytes:
    """A %-format for one set request to ``queue`` (the role's); takes the item id (twice
    for distinct keys)."""
    if role.size < ID_DIGITS:
        raise ValueError(f"items must be at least {ID_DIGITS} bytes")
    tail = b"%016d" + b"x" * (role.size - ID_DIGITS) + b"\r\n"
    if role.distinct_keys if distinct is None else distinct:
        return b"set k%%d 0 0 %d\r\n" % role.size + tail
    return b"set %s 0 0 %d\r\n" % ((queue or role.queue).encode(), role.size) + tail


class Connection:
    """One socket and its batch in flight.  Subclasses say what to send and what a reply means."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        self.worker = worker
        self.tally = worker.tally
        self.role = role
        self.index = index
        self.queue = role.queue_of(index).encode()
        self.sock = worker.connect(index)
        self.buf = bytearray()
        self.expected = 0  # replies still due for the batch in flight
        self.batch_items = 0
        self.items_at_send = 0
        self.sent_at = 0.0
        self.pace_start = 0.0  # rate-limited roles: when the first batch went out
        self.paced = 0  # and how many items went out since
        self.done = False

    # what subclasses provide
    def next_batch(self) -> tuple[bytes, int, int] | None:
        """(request bytes, replies expected, items it stands for), or None when finished."""
        raise NotImplementedError

    def on_value(self, buf: bytearray, start: int, size: int) -> None:
        self.tally.error("a VALUE where none was due")

    def on_line(self, line: bytes) -> None:
        raise NotImplementedError

    def batch_finished(self) -> bool:
        """Called after each batch; True when this connection is done."""
        return False

    def finish(self) -> None:
        """Last words before the socket closes (e.g. confirm the open read)."""

    # the mechanics
    def send_next(self) -> None:
        batch = self.next_batch() if time.perf_counter() < self.worker.deadline else None
        if batch is None:
            self.close()
            return
        data, self.expected, self.batch_items = batch
        self.items_at_send = self.tally.items
        self.sent_at = time.perf_counter()
        self.sock.sendall(data)

    def on_data(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        pos = 0
        n = len(buf)
        while self.expected:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            if buf.startswith(b"VALUE ", pos):
                size = int(buf[buf.rfind(b" ", pos, eol) + 1 : eol])
                start = eol + 2
                end = start + size + 7
                if n < end:
                    break
                if buf[start + size : end] != VALUE_END:
                    self.tally.error(f"reply out of step after {size}-byte value")
                    self.close()
                    return
                self.on_value(buf, start, size)
                pos = end
            else:
                self.on_line(bytes(buf[pos:eol]))
                pos = eol + 2
            self.expected -= 1
            self.tally.requests += 1
        if pos:
            del buf[:pos]
        if not self.expected and not self.done:
            self.batch_done()

    def batch_done(self) -> None:
        t = self.tally
        now = time.perf_counter()
        t.latencies.append(now - self.sent_at)
        if t.items != self.items_at_send:
            t.last = now  # the window ends at the last reply that counted an item
        if self.batch_finished():
            self.close()
            return
        if self.role.rate > 0:
            # On a fixed timeline, so that sleeps rounded up to epoll's 1 ms keep the average.
            self.paced += self.batch_items
            self.pace_start = self.pace_start or self.sent_at
            due = self.pace_start + self.paced / self.role.rate
            if due > now:
                self.worker.sleeping.append((due, self))
                return
        self.send_next()

    def close(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            self.finish()
        except OSError as e:
            self.tally.error(f"finish: {e}")
        self.worker.forget(self)
        self.sock.close()

    def reconnect(self) -> None:
        """Drop the connection (the server gives its open reads back) and open a new one."""
        self.worker.forget(self, closing=False)
        self.sock.close()
        self.buf.clear()
        self.sock = self.worker.connect(self.index)
        self.worker.watch(self)


class SetConnection(Connection):
    """Stores the ids of its range, ``depth`` sets per batch."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        super().__init__(worker, role, index)
        self.lo, self.hi = role.id_range(index)
        self.next_id = self.reply_id = self.lo
        self.fmt = _set_format(role, queue=self.queue.decode())
        self.copies = 2 if role.distinct_keys else 1  # the format takes a key's id, then the item's
        # several queues: item id k goes to the (k mod spread)-th
        self.fmts = [_set_format(role, queue=role.queue_of(index + k)) for k in range(role.spread)]

    def next_batch(self) -> tuple[bytes, int, int] | None:
        i = self.next_id
        if i >= self.hi:
            return None
        n = min(self.role.depth, self.hi - i)
        self.next_id = i + n
        self.reply_id = i  # the id the next STORED stands for
        if self.role.spread > 1:
            fmts, spread = self.fmts, self.role.spread
            return b"".join(fmts[k % spread] % k for k in range(i, i + n)), n, n
        ids = tuple(k for k in range(i, i + n) for _ in range(self.copies))
        return self.fmt * n % ids, n, n

    def on_data(self, data: bytes) -> None:
        n = self.expected
        if not self.buf and len(data) == 8 * n and data == STORED * n:  # the usual whole batch
            t = self.tally
            t.requests += n
            t.items += n
            if t.ids is not None:
                for i in range(self.reply_id, self.reply_id + n):
                    t.count_id(i)
            self.expected = 0
            self.batch_done()
        else:
            super().on_data(data)

    def on_line(self, line: bytes) -> None:
        t = self.tally
        if line == b"STORED":
            t.items += 1
            if t.ids is not None:
                t.count_id(self.reply_id)
        else:
            t.error(line.decode("ascii", "replace"))
        self.reply_id += 1


class GetConnection(Connection):
    """``get <queue>[/t=ms]`` until the role has its items (or the queue is dry),
    or ``get k<id>`` over its id range (memcached)."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        super().__init__(worker, role, index)
        self.lo, self.hi = role.id_range(index)
        self.quota = role.count if role.shared_stop else self.hi - self.lo
        wait = b"/t=%d" % role.wait_ms if role.wait_ms else b""
        self.request = b"get %s%s\r\n" % (self.queue, wait)
        self.got = self.asked = self.batch_hits = 0
        self.missed = False
        self.last_id = -1

    def next_batch(self) -> tuple[bytes, int, int] | None:
        role = self.role
        if role.distinct_keys:
            i = self.lo + self.asked
            n = min(role.depth, self.hi - i)
            self.asked += n
            return (b"".join(b"get k%d\r\n" % k for k in range(i, i + n)), n, n) if n > 0 else None
        n = role.depth if role.shared_stop else min(role.depth, self.quota - self.got)
        self.batch_hits = 0
        return (self.request * n, n, n) if n > 0 else None

    def on_value(self, buf: bytearray, start: int, size: int) -> None:
        t = self.tally
        t.items += 1
        self.got += 1
        self.batch_hits += 1
        if t.ids is not None:
            id_ = int(buf[start : start + ID_DIGITS])
            t.count_id(id_)
            if self.role.ordered and id_ < self.last_id:
                t.error(f"out of order: id {id_} after {self.last_id}")
            self.last_id = id_

    def on_line(self, line: bytes) -> None:
        if line != b"END":
            self.tally.error(line.decode("ascii", "replace"))
            return
        self.missed = True
        if self.role.distinct_keys:
            self.tally.error("memcached miss on a key that was set")

    def batch_finished(self) -> bool:
        role = self.role
        if role.shared_stop:
            return self.worker.add_shared(self.batch_hits) >= role.count
        return (self.missed and role.stop_on_miss) or self.got >= self.quota


class ReliableConnection(Connection):
    """The reliable-read loop: ``get q/close/open/t=ms`` confirms the previous item and opens
    the next.  With leak rates it sometimes gives an item back (``/abort``) or drops the
    connection while holding one; the item must then arrive again, elsewhere."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        super().__init__(worker, role, index)
        q = self.queue
        wait = b"/t=%d" % role.wait_ms if role.wait_ms else b""
        self.loop_request = b"get %s/close/open%s\r\n" % (q, wait)
        self.abort_request = b"get %s/abort\r\n" % q
        self.close_request = b"get %s/close\r\n" % q
        self.leaky = role.abort_rate > 0 or role.drop_rate > 0
        self.depth = 1 if self.leaky else role.depth
        self.open_id: int | None = None
        self.aborting = False
        self.batch_taken = 0
        self.rng = random.Random(index)

    def next_batch(self) -> tuple[bytes, int, int] | None:
        self.batch_taken = 0
        if self.aborting:
            return self.abort_request, 1, 0
        return self.loop_request * self.depth, self.depth, self.depth

    def _confirm(self) -> None:
        if self.open_id is not None:
            self.tally.items += 1
            if self.tally.ids is not None:
                self.tally.count_id(self.open_id)
            self.open_id = None

    def on_value(self, buf: bytearray, start: int, size: int) -> None:
        self._confirm()  # this request closed the previous open read first
        self.open_id = int(buf[start : start + ID_DIGITS])
        self.batch_taken += 1

    def on_line(self, line: bytes) -> None:
        if line != b"END":
            self.tally.error(line.decode("ascii", "replace"))
        elif self.aborting:  # the abort's reply: the item went back to the queue
            self.aborting = False
            self.open_id = None
            self.batch_taken -= 1
        else:
            self._confirm()

    def batch_finished(self) -> bool:
        if self.leaky and self.open_id is not None and not self.aborting:
            roll = self.rng.random()
            if roll < self.role.abort_rate:
                self.aborting = True
            elif roll < self.role.abort_rate + self.role.drop_rate:
                self.open_id = None
                self.batch_taken -= 1
                self.reconnect()
        taken = self.worker.add_shared(self.batch_taken)
        return taken >= self.role.count and not self.aborting

    def finish(self) -> None:
        if self.open_id is None:
            return
        self.sock.sendall(self.close_request)
        buf = bytes(self.buf)
        while b"END\r\n" not in buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise OSError("closed before confirming")
            buf += chunk
        self._confirm()


class PairConnection(Connection):
    """memcached's analog of a queue hand-off: per item ``set k<id>`` then ``get k<id>``
    ``reads`` times, pipelined ``depth`` items at a time."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        super().__init__(worker, role, index)
        self.next_id, self.hi = role.id_range(index)
        self.fmt = _set_format(role, distinct=True) + b"get k%d\r\n" * role.reads

    def next_batch(self) -> tuple[bytes, int, int] | None:
        i = self.next_id
        n = min(self.role.depth, self.hi - i)
        if n <= 0:
            return None
        self.next_id += n
        per = self.role.reads + 2  # the set format takes the id twice
        data = self.fmt * n % tuple(k for k in range(i, i + n) for _ in range(per))
        return data, n * (1 + self.role.reads), n

    def on_line(self, line: bytes) -> None:
        if line == b"STORED":
            self.tally.items += 1
        else:
            self.tally.error(line.decode("ascii", "replace"))

    def on_value(self, buf: bytearray, start: int, size: int) -> None:
        if self.tally.ids is not None:
            self.tally.count_id(int(buf[start : start + ID_DIGITS]))


class DbConnection(Connection):
    """Darner's ``db``: a get when the worker's gets left outnumber its sets left by more than
    the role's ratio, else a set.  With ``hangup`` n, every n-th request of a connection is
    sent half and the connection hung up; a new one takes its place."""

    def __init__(self, worker: Worker, role: Role, index: int) -> None:
        super().__init__(worker, role, index)
        q = role.queue.encode()
        self.requests = (b"set %s 0 0 %d\r\n%s\r\n" % (q, role.size, b"x" * role.size),
                         b"get %s\r\n" % q)  # fmt: skip
        self.ratio = role.gets / role.count if role.count else 0.0
        self.sent = 0

    def next_batch(self) -> tuple[bytes, int, int] | None:
        left = self.worker.left  # [sets, gets]
        while left[0] or left[1]:
            kind = 1 if left[1] and (not left[0] or left[1] / left[0] > self.ratio) else 0
            left[kind] -= 1
            self.sent += 1
            if not self.role.hangup or self.sent % self.role.hangup != 1 % self.role.hangup:
                return self.requests[kind], 1, 1
            self.sock.sendall(self.requests[kind][: len(self.requests[kind]) // 2])
            self.reconnect()
        return None

    def on_value(self, buf: bytearray, start: int, size: int) -> None:
        self.tally.items += 1

    def on_line(self, line: bytes) -> None:
        if line == b"STORED":
            self.tally.items += 1
        elif line != b"END":
            self.tally.error(line.decode("ascii", "replace"))


CONNECTIONS = {
    "set": SetConnection,
    "get": GetConnection,
    "reliable": ReliableConnection,
    "pair": PairConnection,
    "db": DbConnection,
}


# --- the worker process ------------------------------------------------------------------------


class Worker:
    """One process: its share of one role's connections, driven from one epoll loop."""

    def __init__(
        self, role: Role, indexes: range, ports: list[int], shared, seconds: float
    ) -> None:
        self.role = role
        self.indexes = indexes
        # Several ports: several server instances, used as a client list would be
        # (connection i of a role talks to ports[i % len(ports)], or to its queue's server).
        self.ports = ports
        self.shared = shared
        self.seconds = seconds
        self.deadline = float("inf")
        self.epoll = select.epoll()
        self.by_fd: dict[int, Connection] = {}
        self.sleeping: list[tuple[float, Connection]] = []
        self.active = 0
        self.tally = RoleResult(role, ids=bytearray(role.count) if role.verify else None)
        # db: this worker's share of the role's sets and gets, as of its connections
        c, lo, hi = role.connections, indexes.start, indexes.stop
        self.left = [n * hi // c - n * lo // c for n in (role.count, role.gets)]

    def connect(self, index: int = 0) -> socket.socket:
        if self.role.queues > 1:  # the server its queue hashes to (as a worker's owner is found)
            port = self.ports[owner_of(self.role.queue_of(index), len(self.ports))]
        else:
            port = self.ports[index % len(self.ports)]
        sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)  # blocking: recv only runs after epoll said readable
        return sock

    def watch(self, conn: Connection) -> None:
        fd = conn.sock.fileno()
        self.by_fd[fd] = conn
        self.epoll.register(fd, select.EPOLLIN)

    def forget(self, conn: Connection, closing: bool = True) -> None:
        fd = conn.sock.fileno()
        if self.by_fd.get(fd) is conn:
            del self.by_fd[fd]
            self.epoll.unregister(fd)
        if closing:
            self.active -= 1

    def add_shared(self, n: int) -> int:
        if n:
            with self.shared.get_lock():
                self.shared.value += n
                return self.shared.value
        return self.shared.value

    def run(self, barrier, stall: float) -> RoleResult:
        conns = [CONNECTIONS[self.role.kind](self, self.role, i) for i in self.indexes]
        for c in conns:
            self.watch(c)
        self.active = len(conns)
        barrier.wait()
        cpu0 = time.process_time()
        self.deadline = time.perf_counter() + self.seconds
        for c in conns:
            c.send_next()
        last_event = time.perf_counter()
        while self.active > 0:
            timeout = 0.05
            if self.sleeping:
                now = time.perf_counter()
                due = min(d for d, _ in self.sleeping)
                if due <= now:
                    ready = [c for d, c in self.sleeping if d <= now]
                    self.sleeping = [(d, c) for d, c in self.sleeping if d > now]
                    for c in ready:
                        c.send_next()
                    continue
                timeout = min(timeout, due - now)
            events = self.epoll.poll(timeout)
            if events:
                last_event = time.perf_counter()
            elif time.perf_counter() - last_event > stall and not self.sleeping:
                self.tally.error(
                    f"stalled: no reply for {stall:.0f} s on {self.active} connections"
                )
                break
            for fd, _ in events:
                conn = self.by_fd.get(fd)
                if conn is None:
                    continue
                try:
                    data = conn.sock.recv(1 << 18)
                except OSError as e:
                    data = b""
                    self.tally.error(f"recv: {e}")
                if not data:
                    self.tally.error("server closed the connection")
                    conn.expected = 0
                    conn.close()
                    continue
                conn.on_data(data)
        self.tally.cpu = time.process_time() - cpu0
        return self.tally


def _worker_main(role, indexes, ports, shared, seconds, stall, barrier, out, cpus) -> None:
    try:
        pin(os.getpid(), cpus)
        out.put((role.name, Worker(role, indexes, ports, shared, seconds).run(barrier, stall)))
    except BaseException as e:  # report it, and never leave the others at the barrier
        barrier.abort()
        out.put((role.name, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# --- the parent ----------------------------------------------------------------------------------


class LoadFailed(Exception):
    pass


def run(
    roles: list[Role],
    port: int | list[int],
    *,
    seconds: float,
    procs: int = 2,
    stall: float = 30.0,
    on_start: Callable[[], None] | None = None,
    cpus: frozenset[int] | None = None,
) -> LoadResult:
    """Run the roles at once against 127.0.0.1:port (connection i of a role to ``port[i %
    len(port)]`` with a list), the workers on ``cpus``; ``on_start()`` is called as they go."""
    ports = [port] if isinstance(port, int) else port
    ctx = mp.get_context("fork")
    total = sum(r.connections for r in roles)
    out = ctx.Queue()
    plan = []
    for role in roles:
        workers = max(1, min(role.connections, round(procs * role.connections / total)))
        shared = ctx.Value("q", 0)
        for w in range(workers):
            indexes = range(role.connections * w // workers, role.connections * (w + 1) // workers)
            plan.append((role, indexes, shared))
    barrier = ctx.Barrier(len(plan) + 1)
    processes = [
        ctx.Process(
            target=_worker_main,
            args=(role, indexes, ports, shared, seconds, stall, barrier, out, cpus),
            daemon=True,
        )
        for role, indexes, shared in plan
    ]
    for p in processes:
        p.start()
    results = {r.name: RoleResult(r) for r in roles}
    try:
        try:
            barrier.wait(timeout=120)
        except threading.BrokenBarrierError:
            why = []
            with contextlib.suppress(queue.Empty):  # what the workers said within a few seconds
                for _ in processes:
                    _, part = out.get(timeout=5)
                    why += [part] if isinstance(part, str) else []
            raise LoadFailed("workers could not start:\n" + "\n".join(why)) from None
        started = time.perf_counter()
        if on_start is not None:
            on_start()
        timeout = seconds + stall + 60
        for _ in processes:
            try:
                name, part = out.get(timeout=timeout)
            except queue.Empty:
                raise LoadFailed(f"a worker did not report within {timeout:.0f} s") from None
            if isinstance(part, str):
                raise LoadFailed(f"worker for {name} failed: {part}")
            results[name].merge(part)
    finally:
        for p in processes:
            p.join(timeout=10)
            if p.is_alive():
                p.terminate()
                p.join()
    return LoadResult(roles=results, started=started)
