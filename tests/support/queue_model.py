"""A model-based test of the queue core: a real server against a plain model of Kestrel.

A Hypothesis ``RuleBasedStateMachine`` drives one kestreld process (tiny
``max_memory_size`` and ``max_journal_size``, so read-behind and segment
rotation happen every few items) with random sequences of ``set`` (with no,
a past or a far expiry), ``get`` (plain, ``/open``, ``/close``, ``/abort``,
``/close/open``, ``/peek``), ``confirm``, ``flush``, ``flush_all``,
``delete``, fanout reader creation, disconnects, graceful restarts and
kill -9, over two queues: ``m`` (``max_items``, refusing when full) and
``d`` (``max_items`` with ``discard_old_when_full``).  Every reply is
compared with the model, and after every step so are the stats of every
reader: items, bytes, open_transactions, discarded, expired_items (and
``mem_items`` never above ``items``).

The model is plain Kestrel: a reader is a FIFO; an open read belongs to its
connection; an abort or a disconnect puts reads back at the head in order; a
restart (graceful or kill -9) brings back every item not confirmed,
discarded, dropped, expired or flushed, in id order, and nothing else.

Run by ``tests/queues/test_queue_model.py`` (a bounded number of sequences) and by
``scripts/queue-model`` (as many as asked: the long run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kestreld.testing.process import Conn, KestreldProcess

MAX_ITEMS_M = 6
MAX_ITEMS_D = 3
MAX_OPEN_READS = 2
CONFIG = f"""max_memory_size = "1KiB"
max_journal_size = "4KiB"
max_open_reads = {MAX_OPEN_READS}
checkpoint_interval = "150ms"

[queues.m]
max_items = {MAX_ITEMS_M}

[queues.d]
max_items = {MAX_ITEMS_D}
discard_old_when_full = true
"""
QUEUES = ("m", "d")
READERS = ("m", "m+f", "d", "d+f")
CLIENTS = 2
PAST = 1_000_000_000  # an absolute expiry in 2001: expired on arrival
FUTURE_S = 10 * 365 * 86400  # added to now: never expires during a run


@dataclass
class ModelReader:
    """One reader in the model: waiting items (oldest first) and its counters."""

    items: deque[bytes] = field(default_factory=deque)
    discarded: int = 0
    expired: int = 0

    @property
    def bytes(self) -> int:
        return sum(len(i) for i in self.items)


def _serial(item: bytes) -> int:
    return int(item[:7])


class QueueModel(RuleBasedStateMachine):
    """The state machine (see the module's docstring).  Counts sequences in ``runs``."""

    runs = 0
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.folder = tempfile.mkdtemp(prefix="kestreld-model-")
        self.server = KestreldProcess(os.path.join(self.folder, "queues"), CONFIG)
        self.server.start()
        self.conns: list[Conn] = [Conn(self.server.connect()) for _ in range(CLIENTS)]
        self.readers: dict[str, ModelReader] = {}
        # Open reads per (client, reader), oldest first.
        self.open: dict[tuple[int, str], deque[bytes]] = {}
        self.serial = 0
        self.history: list[str] = []  # the steps so far, for a failure's message
        QueueModel.runs += 1

    def teardown(self) -> None:
        for c in self.conns:
            c.close()
        try:
            self.server.stop()
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    # --- helpers ----------------------------------------------------------------------

    def _ensure(self, name: str) -> ModelReader:
        """A fetch on ``name`` creates its queue (with its default reader) and the reader."""
        queue = name.partition("+")[0]
        if queue not in self.readers:
            self.readers[queue] = ModelReader()
        if name not in self.readers:
            self.readers[name] = ModelReader()
        return self.readers[name]

    def _reads(self, client: int, name: str) -> deque[bytes]:
        return self.open.setdefault((client, name), deque())

    def _give_back(self, name: str, reads: list[bytes]) -> None:
        reader = self.readers.get(name)
        if reader is not None:
            reader.items.extendleft(reversed(reads))

    def _request(self, client: int, line: str) -> bytes:
        c = self.conns[client]
        c.send(line + "\r\n")
        return c.line()

    def _value(self, client: int, first: bytes) -> bytes | None:
        """The rest of a single-key get's reply: its item, or None for END."""
        if first == b"END":
            return None
        assert first.startswith(b"VALUE "), first
        size = int(first.split()[3])
        c = self.conns[client]
        data = c.exact(size + 2)[:-2]
        assert c.line() == b"END"
        return data

    def _wait_open_reads(self) -> None:
        """Until the server has given back what a closed connection held."""
        deadline = time.monotonic() + 10
        while True:
            stats = self._stats()
            if all(
                stats.get(f"queue_{n}_open_transactions", "0") == str(self._open_count(n))
                for n in self.readers
            ):
                return
            if time.monotonic() > deadline:
                raise AssertionError("open reads not given back within 10 s")
            time.sleep(0.01)

    def _open_count(self, name: str) -> int:
        return sum(len(reads) for (_, n), reads in self.open.items() if n == name)

    def _stats(self) -> dict[str, str]:
        return self.conns[0].stats()

    # --- rules ------------------------------------------------------------------------

    @initialize()
    def start(self) -> None:
        pass

    @rule(
        queue=st.sampled_from(QUEUES),
        size=st.integers(min_value=8, max_value=300),
        expiry=st.sampled_from(["none", "none", "none", "past", "future"]),
    )
    def set(self, queue: str, size: int, expiry: str) -> None:
        self.history.append(f"set {queue} size={size} expiry={expiry}")
        self.serial += 1
        data = f"{self.serial:07d}".encode().ljust(size, b"x")
        exptime = {"none": 0, "past": PAST, "future": int(time.time()) + FUTURE_S}[expiry]
        c = self.conns[0]
        c.send(f"set {queue} 0 {exptime} {len(data)}\r\n".encode() + data + b"\r\n")
        reply = c.line()
        default = self._ensure(queue)
        discard = queue == "d"
        limit = MAX_ITEMS_D if discard else MAX_ITEMS_M
        if not discard and len(default.items) >= limit:
            assert reply == b"NOT_STORED", reply
            return
        assert reply == b"STORED", reply
        for name, reader in self.readers.items():
            if name.partition("+")[0] != queue:
                continue
            if discard:
                while len(reader.items) >= limit:
                    reader.items.popleft()
                    reader.discarded += 1
            elif len(reader.items) >= limit:
                reader.discarded += 1  # a full fanout reader drops the new item
                continue
            if expiry == "past":
                reader.expired += 1
            else:
                reader.items.append(data)

    @rule(
        client=st.integers(min_value=0, max_value=CLIENTS - 1),
        name=st.sampled_from(READERS),
        mode=st.sampled_from(["", "", "/open", "/close", "/abort", "/close/open", "/peek"]),
    )
    def get(self, client: int, name: str, mode: str) -> None:
        self.history.append(f"client {client}: get {name}{mode}")
        first = self._request(client, f"get {name}{mode}")
        opened = mode in ("/open", "/close/open")
        fetch = opened or mode in ("", "/peek")
        if fetch:
            reader = self._ensure(name)
        else:
            reader = self.readers.get(name)  # type: ignore[assignment]
            if reader is None:
                assert first == b"END", first
                return
        reads = self._reads(client, name)
        if mode == "/abort" and reads:
            self._give_back(name, [reads.popleft()])
        if mode in ("/close", "/close/open") and reads:
            reads.popleft()
        if not fetch:
            assert first == b"END", first
            return
        if mode != "/peek" and reads and (not opened or len(reads) >= MAX_OPEN_READS):
            assert first == b"ERROR", first
            return
        value = self._value(client, first)
        expected = reader.items[0] if reader.items else None
        assert value == expected, (value, expected)
        if expected is None or mode == "/peek":
            return
        reader.items.popleft()
        if opened:
            reads.append(expected)

    @rule(
        client=st.integers(min_value=0, max_value=CLIENTS - 1),
        name=st.sampled_from(READERS),
        count=st.integers(min_value=1, max_value=3),
    )
    def confirm(self, client: int, name: str, count: int) -> None:
        self.history.append(f"client {client}: confirm {name} {count}")
        reply = self._request(client, f"confirm {name} {count}")
        reads = self.open.get((client, name))
        if name not in self.readers or not reads:
            assert reply == b"ERROR", reply
            return
        assert reply == b"END", reply
        for _ in range(min(count, len(reads))):
            reads.popleft()

    @rule(name=st.sampled_from(READERS))
    def flush(self, name: str) -> None:
        self.history.append(f"flush {name}")
        assert self._request(0, f"flush {name}") == b"END"
        if name in self.readers:
            self.readers[name].items.clear()

    @rule()
    def flush_all(self) -> None:
        self.history.append("flush_all")
        assert self._request(0, "flush_all") == b"Flushed all queues."
        for reader in self.readers.values():
            reader.items.clear()

    @precondition(lambda self: not any(self.open.values()))
    @rule(name=st.sampled_from(READERS))
    def delete(self, name: str) -> None:
        self.history.append(f"delete {name}")
        assert self._request(0, f"delete {name}") == b"DELETED"
        if "+" in name:
            self.readers.pop(name, None)
        else:
            for n in [n for n in self.readers if n.partition("+")[0] == name]:
                del self.readers[n]

    @rule(client=st.integers(min_value=0, max_value=CLIENTS - 1))
    def disconnect(self, client: int) -> None:
        self.history.append(f"client {client}: disconnect")
        self.conns[client].close()
        for (c, name), reads in self.open.items():
            if c == client and reads:
                self._give_back(name, list(reads))
                reads.clear()
        self.conns[client] = Conn(self.server.connect())
        self._wait_open_reads()

    @rule(kill=st.booleans())
    def restart(self, kill: bool) -> None:
        self.history.append("kill -9" if kill else "restart")
        for c in self.conns:
            c.close()
        self.server.restart(crash=kill)
        self.conns = [Conn(self.server.connect()) for _ in range(CLIENTS)]
        for (_, name), reads in self.open.items():
            if name in self.readers:
                self.readers[name].items.extend(reads)
        self.open.clear()
        for reader in self.readers.values():
            reader.items = deque(sorted(reader.items, key=_serial))
            reader.discarded = reader.expired = 0

    # --- the accounts ---------------------------------------------------------------------

    @invariant()
    def stats_match(self) -> None:
        if not hasattr(self, "server"):
            return
        QueueModel.steps += 1
        stats = self._stats()
        for name, reader in self.readers.items():

            def get(key: str, name: str = name) -> int:
                return int(stats.get(f"queue_{name}_{key}", "0"))

            got = {
                "items": get("items"),
                "bytes": get("bytes"),
                "open_transactions": get("open_transactions"),
                "discarded": get("discarded"),
                "expired_items": get("expired_items"),
                "punted_items": get("punted_items"),
            }
            want = {
                "items": len(reader.items),
                "bytes": reader.bytes,
                "open_transactions": self._open_count(name),
                "discarded": reader.discarded,
                "expired_items": reader.expired,
                "punted_items": 0,  # punting is off: an abort never moves an item
            }
            assert got == want, (name, got, want, self.history[-30:])
            assert 0 <= get("mem_items") <= got["items"], (name, get("mem_items"), got)


def run(examples: int, steps: int = 40, randomize: bool = False) -> tuple[int, int]:
    """Run ``examples`` sequences of up to ``steps`` steps; returns (sequences, steps) run.

    ``randomize``: new sequences each run (the long run); otherwise the same ones (CI).
    """
    QueueModel.runs = QueueModel.steps = 0
    test = QueueModel.TestCase
    test.settings = settings(
        max_examples=examples,
        stateful_step_count=steps,
        deadline=None,
        derandomize=not randomize,
        database=None,
        suppress_health_check=list(__import__("hypothesis").HealthCheck),
    )
    import unittest

    result = unittest.TextTestRunner(verbosity=0).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(test)
    )
    if not result.wasSuccessful():
        raise SystemExit(1)
    return QueueModel.runs, QueueModel.steps


def main(argv: list[str] | None = None) -> int:
    """``scripts/queue-model``: the long run of the model-based test."""
    parser = argparse.ArgumentParser(
        prog="scripts/queue-model",
        description="Random sequences against a real server, compared with a model of Kestrel "
        "(sets, gets, reliable reads, flush, delete, readers, expiry, limits, restarts, kill -9).",
    )
    parser.add_argument("--sequences", type=int, default=500, help="how many (default 500)")
    parser.add_argument("--steps", type=int, default=60, help="steps per sequence (default 60)")
    args = parser.parse_args(argv)
    started = time.monotonic()
    runs, steps = run(args.sequences, args.steps, randomize=True)
    print(
        f"model-based run: {runs} sequences, {steps} steps checked, "
        f"{time.monotonic() - started:.0f} s, no difference from the model"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
