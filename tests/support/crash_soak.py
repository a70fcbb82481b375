"""Crash-durability cycles: mixed load on a real kestreld, ``kill -9`` at random moments.

Used by ``tests/reliability/test_reliability_crash.py`` (short CI profile) and ``scripts/soak``
(long runs).  Each cycle starts the server on the same folder, runs producers
and consumers against one queue for a random time, kills the server with
SIGKILL and lets every client thread notice.  Every client records what it saw
in its own event list; after the last cycle the queue is drained and the
ledger is checked against journal.md's decisions:

- every acknowledged ``set`` reaches every reader (the default reader and
  the two fanout readers) - except, for the plain-get reader, items taken by
  gets whose replies the kill cut (a plain get is consumed durably before its
  reply goes out, so a lost reply loses the item to the client, as in Kestrel
  2.x); those are bounded by the gets left unanswered at the kills of the
  life each item was stored in or a later one;
- an item whose confirm was acknowledged (the reply of ``/close``,
  ``confirm``, or a plain get read) before a crash never comes back
  (``confirm_grace`` = 0: confirms are as durable as puts);
- an item that comes back after a crash was open at that crash (delivered,
  neither confirmed nor aborted); the report counts these replays and the
  open reads at each kill;
- within one server life an item is delivered to a reader at most once per
  abort of it plus one: open items come back at most once per crash;
- nothing is delivered that was never sent, and the final drain of each
  reader is in per-producer order;
- after a clean restart every confirm is kept (the queue is empty).

The load covers: producers sending pipelined batches (group commit), reliable
consumers (``/close/open`` with aborts, several open reads closed with
``confirm``), a fanout reader read reliably and one read with plain gets,
segment rotation (small ``max_journal_size``) and dead-segment removal, and
checkpoint writes (small ``checkpoint_interval``).
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from kestreld.testing.process import Conn, KestreldProcess

QUEUE = "crash"
READERS = (QUEUE, f"{QUEUE}+audit", f"{QUEUE}+tail")  # reliable, reliable fanout, plain-get fanout
PLAIN_READER = READERS[2]


def crash_config(
    checkpoint_interval_ms: int, max_journal_size: str, sync_journal: int | None = 0
) -> str:
    return (
        (f"sync_journal = {sync_journal}\n" if sync_journal is not None else "")
        + f'max_journal_size = "{max_journal_size}"\n'
        f'checkpoint_interval = "{checkpoint_interval_ms}ms"\n'
        'max_memory_size = "64KiB"\n'  # keeps readers in read-behind across segments
        '[queues."crash+audit"]\n'
        '[queues."crash+tail"]\n'
    )


@dataclass
class CycleEvents:
    """What one worker thread saw during one server life (epoch)."""

    attempted: list[str] = field(default_factory=list)
    acked: list[str] = field(default_factory=list)
    # (reader, key, monotonic time)
    delivered: list[tuple[str, str, float]] = field(default_factory=list)
    confirmed: list[tuple[str, str, float]] = field(default_factory=list)
    aborted: list[tuple[str, str, float]] = field(default_factory=list)
    # Plain gets sent but not answered when the server died: each may have consumed
    # its item durably with the reply lost (at-most-once, as in Kestrel 2.x).
    unanswered_gets: int = 0
    # Confirms sent but not answered when the server died: durable or not, either is right.
    confirms_in_flight: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class CrashReport:
    cycles: int = 0
    attempted: int = 0
    acked: int = 0
    deliveries: int = 0
    confirms: int = 0
    aborts: int = 0
    redelivered_after_crash: int = 0  # allowed re-deliveries (open or recently confirmed)
    cut_plain_gets: int = 0  # plain gets whose reply the kill cut (may have consumed an item)
    consumed_unseen: int = 0  # items gone with such a reply (at most cut_plain_gets)
    open_at_kills: int = 0  # reads open (delivered, not confirmed or aborted) at the kills
    replayed_open: int = 0  # of those, delivered again after their crash
    segments_seen_max: int = 0
    #: the oldest confirm (seconds before its crash) that came back
    max_returned_confirm_age: float = 0.0
    generations: int = 0  # ledgers checked and closed (drain, check, clean restart)
    guarded_confirms: int = 0  # confirms old enough at their crash that they must not return
    startup_kills: int = 0  # extra kills while the server was still recovering
    drains: int = 0  # restarts after which every reader was drained and checked complete
    lost: int = 0
    torn: int = 0  # deliveries with zeroed bytes (only a power cut with writeback makes them)
    damage_skipped: int = 0  # torn tails of older segments skipped by readers (power cuts only)
    #: (kind, message); kinds: lost, missing_after_restart, confirmed_returned, duplicate,
    #: replayed_not_open, phantom, torn, order, clean_restart, server_error
    violations: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def of(self, kind: str) -> list[str]:
        return [m for k, m in self.violations if k == kind]

    def summary(self) -> str:
        return (
            f"cycles={self.cycles} attempted={self.attempted} acked={self.acked} "
            f"deliveries={self.deliveries} confirms={self.confirms} "
            f"guarded_confirms={self.guarded_confirms} aborts={self.aborts} "
            f"redelivered_after_crash={self.redelivered_after_crash} "
            f"open_at_kills={self.open_at_kills} replayed_open={self.replayed_open} "
            f"cut_plain_gets={self.cut_plain_gets} consumed_unseen={self.consumed_unseen} "
            f"max_returned_confirm_age={self.max_returned_confirm_age:.3f}s "
            f"max_segments={self.segments_seen_max} startup_kills={self.startup_kills} "
            f"drains={self.drains} ledgers={self.generations} lost={self.lost} torn={self.torn} "
            f"damage_skipped={self.damage_skipped} "
            f"violations={len(self.violations)} seconds={self.seconds:.1f}"
        )


#: Keys of items that came back with zeroed bytes (producers never send a NUL).
TORN = "torn#"
_torn_ids = itertools.count()


def item_key(data: bytes) -> str:
    # latin-1 decodes any bytes: a damaged item is reported, never a crash of the check.
    key = data.split(b"|", 1)[0].decode("latin-1")
    if b"\0" in data:
        # A power cut that wrote back some sectors of an unsynced record and not others
        # (the lazy file system's writeback) can leave its header whole and its data
        # zeroed: Kestrel's format has no checksum to tell.  Each such delivery is its own.
        return f"{TORN}{next(_torn_ids)}:{key[:40]!r}"
    return key


def _payload(key: str, rng: random.Random) -> bytes:
    return key.encode() + b"|" + b"x" * rng.randint(20, 400)


class _Client(Conn):
    def read_reply(self) -> tuple[bytes | None, bytes]:
        """(item data or None, first line)."""
        line = self.line()
        if line.startswith(b"VALUE "):
            size = int(line.split()[3])
            data = self.exact(size + 2)[:-2]
            end = self.line()
            if end != b"END":
                raise AssertionError(f"bad item framing: {end!r}")
            return data, line
        return None, line


def _producer(
    srv: KestreldProcess, epoch: int, pid: int, seed: int, stop: threading.Event, ev: CycleEvents
) -> None:
    rng = random.Random(seed)
    seq = 0
    try:
        c = _Client(srv.connect())
        while not stop.is_set():
            batch = []
            for _ in range(rng.randint(1, 8)):
                key = f"{epoch}.{pid}.{seq}"
                seq += 1
                batch.append(key)
            wire = b"".join(
                b"set %s 0 0 %d\r\n%s\r\n" % (QUEUE.encode(), len(p), p)
                for p in (_payload(k, rng) for k in batch)
            )
            ev.attempted.extend(batch)
            c.send(wire)
            for key in batch:
                reply = c.line()
                if reply == b"STORED":
                    ev.acked.append(key)
                elif not reply.startswith(b"SERVER_ERROR"):
                    raise AssertionError(f"set replied {reply!r}")
    except (OSError, ConnectionError):
        pass


def _reliable_consumer(
    srv: KestreldProcess, reader: str, seed: int, stop: threading.Event, ev: CycleEvents
) -> None:
    """``/close/open`` loop with occasional aborts."""
    rng = random.Random(seed)
    open_key: str | None = None
    try:
        c = _Client(srv.connect())
        while not stop.is_set():
            if open_key is not None and rng.random() < 0.05:
                c.send(f"get {reader}/abort\r\n")
                _, line = c.read_reply()
                assert line == b"END", line
                ev.aborted.append((reader, open_key, time.monotonic()))
                open_key = None
                continue
            if open_key is not None:
                ev.confirms_in_flight = [(reader, open_key)]
            c.send(f"get {reader}/close/open/t=50\r\n")
            data, line = c.read_reply()
            ev.confirms_in_flight = []
            now = time.monotonic()
            if open_key is not None:
                ev.confirmed.append((reader, open_key, now))
                open_key = None
            if data is not None:
                open_key = item_key(data)
                ev.delivered.append((reader, open_key, now))
            elif line != b"END":
                raise AssertionError(f"get replied {line!r}")
    except (OSError, ConnectionError):
        pass


def _batch_consumer(
    srv: KestreldProcess, reader: str, seed: int, stop: threading.Event, ev: CycleEvents
) -> None:
    """Opens up to four items, then confirms them with ``confirm <q> <n>``."""
    rng = random.Random(seed)
    try:
        c = _Client(srv.connect())
        while not stop.is_set():
            opened = []
            for _ in range(rng.randint(1, 4)):
                c.send(f"get {reader}/open/t=20\r\n")
                data, line = c.read_reply()
                if data is None:
                    break
                key = item_key(data)
                opened.append(key)
                ev.delivered.append((reader, key, time.monotonic()))
            if not opened:
                continue
            ev.confirms_in_flight = [(reader, k) for k in opened]
            c.send(f"confirm {reader} {len(opened)}\r\n")
            line = c.line()
            ev.confirms_in_flight = []
            assert line == b"END", line
            now = time.monotonic()
            ev.confirmed.extend((reader, k, now) for k in opened)
    except (OSError, ConnectionError):
        pass


def _plain_consumer(
    srv: KestreldProcess, reader: str, seed: int, stop: threading.Event, ev: CycleEvents
) -> None:
    """Plain gets, pipelined: each item is consumed the moment it is delivered."""
    rng = random.Random(seed)
    try:
        c = _Client(srv.connect())
        while not stop.is_set():
            n = rng.randint(1, 6)
            ev.unanswered_gets = n
            c.send(f"get {reader}/t=20\r\n" * n)
            for _ in range(n):
                data, line = c.read_reply()
                ev.unanswered_gets -= 1
                now = time.monotonic()
                if data is not None:
                    key = item_key(data)
                    ev.delivered.append((reader, key, now))
                    ev.confirmed.append((reader, key, now))
                elif line != b"END":
                    raise AssertionError(f"get replied {line!r}")
    except (OSError, ConnectionError):
        pass


def _segments(folder: Path) -> int:
    try:
        return sum(
            1
            for n in os.listdir(folder)
            if n.startswith(QUEUE + ".") and n[len(QUEUE) + 1 :].isdigit()
        )
    except OSError:
        return 0


def explained_by_cut_gets(missing: set[str], epochs: list[list[CycleEvents]]) -> bool:
    """Could plain gets whose replies the kills cut have taken every ``missing`` item?

    A get cut in life ``j`` can only have taken an item acknowledged in life
    ``j`` or before, and each takes at most one: the items acknowledged in life
    ``i`` or later need at least as many cut gets in life ``i`` or later, for
    every ``i`` (Hall's condition for these nested choices).  A bare count over
    all lives would let the gets cut early excuse an item stored later.
    """
    if not missing:
        return True
    acked_in: dict[str, int] = {}
    for i, evs in enumerate(epochs):
        for ev in evs:
            for key in ev.acked:
                acked_in.setdefault(key, i)
    need = [0] * (len(epochs) + 1)
    for key in missing:
        need[acked_in[key]] += 1
    have = [sum(ev.unanswered_gets for ev in evs) for evs in epochs] + [0]
    need_after = have_after = 0
    for i in range(len(epochs), -1, -1):
        need_after += need[i]
        have_after += have[i]
        if need_after > have_after:
            return False
    return True


class CrashCampaign:
    """The ledger of every epoch, and the checks over it."""

    def __init__(
        self,
        folder: Path,
        *,
        seed: int,
        checkpoint_interval_ms: int = 100,
        max_journal_size: str = "4KiB",
        confirm_grace: float = 0.0,
        sync_journal: int | None = 0,
        min_run: float = 0.3,
        max_run: float = 1.5,
        log=None,
    ) -> None:
        self.folder = Path(folder)
        self.rng = random.Random(seed)
        self.seed = seed
        self.ci = checkpoint_interval_ms / 1000
        # A confirm is durable before its reply is sent: one read before the kill
        # must never come back.  (A larger grace only serves to study older builds.)
        self.confirm_grace = confirm_grace
        self.min_run, self.max_run = min_run, max_run
        self.log = log or (lambda *_: None)
        self.srv = KestreldProcess(
            self.folder,
            crash_config(checkpoint_interval_ms, max_journal_size, sync_journal),
            config_path=self.folder.parent / f"{self.folder.name}-crash.conf",
        )
        self.epochs: list[list[CycleEvents]] = []
        self.kill_times: list[float] = []
        self.report = CrashReport()
        # Only a power cut that writes back part of the unsynced sectors tears records:
        # a record's data under a whole header, or the tail of a segment the writer had
        # already left for a newer one (start-up cuts the newest segment's tail; a reader
        # skips an older one's when it gets there).  Either holds only records never
        # acknowledged, which the lost and missing checks prove.  After a kill -9 (the page
        # cache survives) either is a violation.
        self.torn_possible = False
        self.startup_kill_chance = 0.2
        self.drain_every = 4  # every 4th life starts by draining every reader
        self.epoch_no = 0  # server lives so far, over every generation (keys stay unique)
        self._log_checked = 0
        self._started = time.monotonic()

    # --- running -----------------------------------------------------------------------

    def cycle(self) -> None:
        epoch = len(self.epochs)
        srv = self.srv
        if epoch and self.rng.random() < self.startup_kill_chance:
            self._kill_during_startup()
        srv.start()
        workers: list[tuple[threading.Thread, CycleEvents]] = []
        pre: list[CycleEvents] = []
        if epoch and epoch % self.drain_every == 0:
            # Right after this restart: is every acknowledged, unconfirmed item there?
            drain_ev, drained = self._drain()
            pre.append(drain_ev)
            self._check_complete(epoch, drained)
        stop = threading.Event()
        base = self.rng.randrange(1 << 30)
        for pid in range(2):
            ev = CycleEvents()
            workers.append(
                (
                    threading.Thread(
                        target=_producer,
                        args=(srv, self.epoch_no, pid, base + pid, stop, ev),
                        daemon=True,
                    ),
                    ev,
                )
            )
        for fn, reader, k in (
            (_reliable_consumer, QUEUE, 10),
            (_batch_consumer, QUEUE, 11),
            (_reliable_consumer, READERS[1], 12),
            (_plain_consumer, READERS[2], 13),
        ):
            ev = CycleEvents()
            workers.append(
                (
                    threading.Thread(
                        target=fn, args=(srv, reader, base + k, stop, ev), daemon=True
                    ),
                    ev,
                )
            )
        for t, _ in workers:
            t.start()
        time.sleep(self.rng.uniform(self.min_run, self.max_run))
        self.report.segments_seen_max = max(self.report.segments_seen_max, _segments(self.folder))
        self.kill_times.append(time.monotonic())
        srv.kill()
        stop.set()
        for t, _ in workers:
            t.join(15)
            if t.is_alive():
                raise RuntimeError("a client thread did not notice the crash")
        self.epochs.append(pre + [ev for _, ev in workers])
        self.epoch_no += 1
        self.report.cycles += 1

    def _kill_during_startup(self) -> None:
        """Start the server and kill it at a random moment of its recovery."""
        proc = subprocess.Popen(
            self.srv.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(self.rng.uniform(0.0, 0.4))
        proc.kill()
        proc.wait()
        self.report.startup_kills += 1

    def run(
        self,
        cycles: int | None = None,
        seconds: float | None = None,
        generation_cycles: int | None = None,
    ) -> CrashReport:
        """Crash cycles until ``cycles`` or ``seconds``; then the final check.

        With ``generation_cycles`` the ledger is checked and closed every that many
        cycles (drain, check, clean restart) and a fresh one begins, so a long soak
        keeps bounded memory; an old item that came back later is still caught
        (delivered but never sent in the current ledger).
        """
        started = time.monotonic()
        while True:
            if cycles is not None and self.report.cycles >= cycles:
                break
            if seconds is not None and time.monotonic() - started >= seconds:
                break
            if generation_cycles and len(self.epochs) >= generation_cycles:
                self.finish()
                self.log(f"ledger {self.report.generations} closed: {self.report.summary()}")
            self.cycle()
            if self.report.cycles % 10 == 0:
                self.log(f"cycle {self.report.cycles}: {self._quick_counts()}")
        self.finish()
        return self.report

    def _quick_counts(self) -> str:
        acked = sum(len(ev.acked) for evs in self.epochs for ev in evs)
        dl = sum(len(ev.delivered) for evs in self.epochs for ev in evs)
        return f"acked={self.report.acked + acked} deliveries={self.report.deliveries + dl}"

    def finish(self) -> None:
        """Restart, drain every reader, check the ledger, then check a clean restart keeps it."""
        srv = self.srv
        srv.start()
        final, drained = self._drain()
        self._check_complete(len(self.epochs), drained)
        self.epochs.append([final])
        srv.stop()
        srv.start()
        c = _Client(srv.connect())
        leftovers = {r: c.get(r) for r in READERS}
        c.close()
        srv.stop()
        self.check(drained, leftovers)
        self.epochs.clear()
        self.kill_times.clear()
        self.report.generations += 1
        self.report.seconds = time.monotonic() - self._started

    def _drain(self) -> tuple[CycleEvents, dict[str, list[str]]]:
        """Take every item of every reader with plain gets (each is consumed at once)."""
        ev = CycleEvents()
        drained: dict[str, list[str]] = {}
        c = _Client(self.srv.connect(timeout=30))
        for reader in READERS:
            keys = []
            while True:
                c.send(f"get {reader}\r\n")
                data, line = c.read_reply()
                if data is None:
                    assert line == b"END", line
                    break
                keys.append(item_key(data))
            now = time.monotonic()
            ev.delivered.extend((reader, k, now) for k in keys)
            ev.confirmed.extend((reader, k, now) for k in keys)
            drained[reader] = keys
        c.close()
        self.report.drains += 1
        return ev, drained

    def _check_complete(self, epoch: int, drained: dict[str, list[str]]) -> None:
        """After a restart each reader holds every acknowledged item it never confirmed."""
        acked: set[str] = set()
        confirmed: dict[str, set[str]] = defaultdict(set)
        for evs in self.epochs:
            for ev in evs:
                acked.update(ev.acked)
                for reader, key, _ in ev.confirmed:
                    confirmed[reader].add(key)
        for evs in self.epochs:
            for ev in evs:
                # A confirm the kill cut off may have been made durable: gone is right too.
                for reader, key in ev.confirms_in_flight:
                    confirmed[reader].add(key)
        for reader in READERS:
            missing = acked - confirmed[reader] - set(drained[reader])
            if reader == PLAIN_READER and explained_by_cut_gets(missing, self.epochs):
                continue  # consumed by plain gets whose replies the kills cut
            if missing:
                self.report.violations.append(
                    (
                        "missing_after_restart",
                        f"{reader}: {len(missing)} acknowledged, never confirmed items missing after "
                        f"restart {epoch}, e.g. {sorted(missing)[:5]}",
                    )
                )

    # --- checking ----------------------------------------------------------------------

    def check(self, drained: dict[str, list[str]], leftovers: dict[str, bytes | None]) -> None:
        rep = self.report
        v = rep.violations
        attempted: set[str] = set()
        acked: set[str] = set()
        seen: dict[str, set[str]] = defaultdict(set)
        # reader -> key -> (epoch, time) of the last confirm
        last_confirm: dict[str, dict[str, tuple[int, float]]] = defaultdict(dict)
        # (reader, key) open at a kill, or aborted: may come back in a later life
        returnable: set[tuple[str, str]] = set()
        open_at_kill: set[tuple[str, str]] = set()
        for epoch, evs in enumerate(self.epochs):
            seen_before = {r: set(keys) for r, keys in seen.items()}
            checked: set[tuple[str, str]] = set()  # later deliveries: the duplicate check
            deliveries: Counter = Counter()
            aborts: Counter = Counter()
            for ev in evs:
                attempted.update(ev.attempted)
                acked.update(ev.acked)
                rep.aborts += len(ev.aborted)
                for reader, key, _ in ev.aborted:
                    aborts[reader, key] += 1
            for ev in evs:
                for reader, key, _ in ev.delivered:
                    first = (reader, key) not in checked
                    checked.add((reader, key))
                    if (
                        first
                        and key in seen_before.get(reader, ())
                        and last_confirm[reader].get(key) is None
                    ):
                        # Delivered in an earlier life and never confirmed: it must have
                        # been open at a kill (or aborted) to come back.
                        if (reader, key) in open_at_kill:
                            open_at_kill.discard((reader, key))
                            rep.replayed_open += 1
                        if (reader, key) in returnable:
                            returnable.discard((reader, key))
                        else:
                            v.append(
                                (
                                    "replayed_not_open",
                                    f"{reader}: {key} came back in epoch {epoch} but was "
                                    "neither open at a kill nor aborted",
                                )
                            )
                    deliveries[reader, key] += 1
                    seen[reader].add(key)
                    prior = last_confirm[reader].get(key)
                    if prior is not None and prior[0] < epoch:
                        conf_epoch, conf_time = prior
                        age = self.kill_times[conf_epoch] - conf_time
                        rep.max_returned_confirm_age = max(rep.max_returned_confirm_age, age)
                        if age > self.confirm_grace:
                            v.append(
                                (
                                    "confirmed_returned",
                                    f"{reader}: {key} confirmed {age:.3f}s before crash {conf_epoch} came back in epoch {epoch}",
                                )
                            )
                        else:
                            rep.redelivered_after_crash += 1
                rep.deliveries += len(ev.delivered)
            for (reader, key), n in deliveries.items():
                if n > 1 + aborts[reader, key]:
                    v.append(
                        (
                            "duplicate",
                            f"{reader}: {key} delivered {n} times in epoch {epoch} with {aborts[reader, key]} aborts",
                        )
                    )
            kill = self.kill_times[epoch] if epoch < len(self.kill_times) else None
            open_at_kill = set()
            for ev in evs:
                done = {(r, k) for r, k, _ in ev.confirmed} | {(r, k) for r, k, _ in ev.aborted}
                open_at_kill |= {(r, k) for r, k, _ in ev.delivered} - done
                returnable.update((r, k) for r, k, _ in ev.aborted)
            returnable |= open_at_kill
            if kill is not None:
                rep.open_at_kills += len(open_at_kill)
            for ev in evs:
                rep.confirms += len(ev.confirmed)
                for reader, key, t in ev.confirmed:
                    last_confirm[reader][key] = (epoch, t)
                    if kill is not None and kill - t > self.confirm_grace:
                        rep.guarded_confirms += 1
        rep.attempted += len(attempted)
        rep.acked += len(acked)
        cut = sum(ev.unanswered_gets for evs in self.epochs for ev in evs)
        rep.cut_plain_gets += cut
        for reader in READERS:
            missing = acked - seen[reader]
            if reader == PLAIN_READER and explained_by_cut_gets(missing, self.epochs):
                # A plain get is consumed before its reply is sent; a kill can cut
                # the reply.  Bounded by the gets left unanswered at the kills
                # (in the life the item was stored or a later one).
                rep.consumed_unseen += len(missing)
                missing = set()
            rep.lost += len(missing)
            if missing:
                v.append(
                    (
                        "lost",
                        f"{reader}: {len(missing)} acknowledged items never delivered, e.g. {sorted(missing)[:5]}",
                    )
                )
            torn = {k for k in seen[reader] if k.startswith(TORN)}
            rep.torn += len(torn)
            if torn and not self.torn_possible:
                v.append(
                    ("torn", f"{reader}: items came back with zeroed bytes: {sorted(torn)[:3]}")
                )
            phantom = seen[reader] - attempted - torn
            if phantom:
                v.append(
                    ("phantom", f"{reader}: delivered items never sent: {sorted(phantom)[:5]}")
                )
            last_seq: dict[tuple[str, str], int] = {}
            for key in drained[reader]:
                if key not in attempted:
                    continue  # reported above as a phantom
                ep, pid, seq = key.split(".")
                if last_seq.get((ep, pid), -1) >= int(seq):
                    v.append(("order", f"{reader}: final drain out of producer order at {key}"))
                    break
                last_seq[ep, pid] = int(seq)
            if leftovers[reader] is not None:
                v.append(
                    (
                        "clean_restart",
                        f"{reader}: item {leftovers[reader][:30]!r} came back after a clean restart",
                    )
                )
        lines, self._log_checked = self.srv.log_lines[self._log_checked :], len(self.srv.log_lines)
        errors = [e for e in lines if '"level": "error"' in e or "Traceback" in e]
        if errors:
            v.append(("server_error", f"server logged errors: {errors[:3]}"))
        # A kill -9 never damages the middle of a segment (only its tail, cut at
        # start-up): a reader that skips damage at run time (or finds a segment
        # deleted under it) gives its items up.  Name the cause, not only the keys.
        skipped = [e for e in lines if '"journal_damage_skipped"' in e]
        if skipped and self.torn_possible:
            rep.damage_skipped += len(skipped)
        elif skipped:
            v.append(("server_error", f"a reader skipped journal damage: {skipped[:3]}"))


def main_loop(
    folder: Path,
    cycles: int | None,
    seconds: float | None,
    seed: int,
    generation_cycles: int | None = None,
    **kw,
) -> CrashReport:
    campaign = CrashCampaign(folder, seed=seed, **kw)
    try:
        return campaign.run(cycles, seconds, generation_cycles)
    finally:
        campaign.srv.kill()


def main(argv: list[str] | None = None) -> int:
    import argparse
    import json
    import shutil
    import tempfile

    p = argparse.ArgumentParser(
        prog="scripts/soak",
        description="Crash soak: run kestreld under mixed load (producers with sync_journal = 0, "
        "reliable and fanout consumers, 4 KiB segments, 100 ms checkpoints), kill -9 it at "
        "random moments, restart, and check that no acknowledged item was lost, no old "
        "confirm came back and open items came back at most once per crash.  Stops after "
        "--cycles or --seconds, whichever comes first (default: 600 seconds).",
    )
    p.add_argument("--cycles", type=int, help="number of crash cycles")
    p.add_argument("--seconds", type=float, help="run for this long (the final check comes after)")
    p.add_argument("--seed", type=int, help="random seed (default: random, printed)")
    p.add_argument("--checkpoint-interval", type=int, default=100, metavar="MS",
                   help="server checkpoint_interval (default 100)")  # fmt: skip
    p.add_argument(
        "--max-journal-size", default="4KiB", help="server max_journal_size (default 4KiB)"
    )
    p.add_argument(
        "--grace",
        type=float,
        metavar="SECONDS",
        default=0.0,
        help="confirms acknowledged less than this before a crash may come back (default 0: "
        "none may; a larger value only serves to study older builds)",
    )
    p.add_argument("--min-run", type=float, default=0.3, help="shortest server life in s (0.3)")
    p.add_argument("--max-run", type=float, default=1.5, help="longest server life in s (1.5)")
    p.add_argument(
        "--generation",
        type=int,
        default=100,
        metavar="CYCLES",
        help="check and close the ledger every this many cycles (bounded memory; default 100)",
    )
    p.add_argument(
        "--sync-journal",
        default="0",
        metavar="MS|none",
        help="server sync_journal: 0 (fsync before every acknowledgement, the default), "
        "a period in ms, or none",
    )
    p.add_argument("--folder", help="queue folder to use (default: a temporary one, removed after)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args(argv)
    if args.cycles is None and args.seconds is None:
        args.seconds = 600.0
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    tmp = None
    if args.folder:
        folder = Path(args.folder)
    else:
        tmp = tempfile.mkdtemp(prefix="kestreld-soak-")
        folder = Path(tmp) / "queues"
    print(
        f"soak: seed={seed} folder={folder} cycles={args.cycles} seconds={args.seconds}", flush=True
    )
    try:
        report = main_loop(
            folder,
            args.cycles,
            args.seconds,
            seed,
            checkpoint_interval_ms=args.checkpoint_interval,
            max_journal_size=args.max_journal_size,
            confirm_grace=args.grace,
            sync_journal=None if args.sync_journal == "none" else int(args.sync_journal),
            min_run=args.min_run,
            max_run=args.max_run,
            generation_cycles=args.generation,
            log=lambda msg: print(msg, flush=True),
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        out = dict(vars(report))
        out["seed"] = seed
        print(json.dumps(out, indent=2))
    else:
        print(f"soak: seed={seed} {report.summary()}")
        for kind, message in report.violations[:50]:
            print(f"VIOLATION {kind}: {message}")
    return 1 if report.violations else 0


if __name__ == "__main__":
    raise SystemExit(main())
