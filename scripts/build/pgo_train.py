"""The training run of the profile-guided build: the requests the compiled modules are laid out for.

``setup.py`` compiles the extensions instrumented (GCC's ``-fprofile-generate``), runs
``scripts/build/pgo_train.py`` with them, and compiles them again from what the run
counted (``-fprofile-use``): the blocks a request runs are laid out together, and what it
never ran (error paths, slow paths, start-up) moves to cold sections.  A request then
touches fewer pages and cache lines of code, which is most of what a request costs at one
connection (the eleventh round of the performance notes, ``git show 67f5cad:BENCHMARKS.md``).  Code the run never reaches is compiled for
size, so the run covers what a production server runs most, through a real ``kestreld``
on a loopback port and real sockets: set, get, the reliable-read verbs and the open/close
loop (a consumer that waits, and one that does not), noreply and expiring sets, misses,
a fan-out queue, read-behind, at one connection and at many (pipelined rounds).

It checks every reply, so a broken build fails here (and the build falls back to the
plain one) rather than being tuned on errors.  Counts matter, not time: it takes a few
seconds.  Exit status 0 when it ran, 2 when the modules that run are not compiled.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from kestreld.compiled import implementation
from kestreld.testing.process import Conn, KestreldProcess

CONFIG = """\
[queues.behind]
max_memory_size = "16KiB"
"""

ITEM = b"x" * 1024


def expect(c: Conn, reply: bytes) -> None:
    line = c.line()
    if line != reply:
        raise RuntimeError(f"expected {reply!r}, got {line!r}")


def take(c: Conn, request: bytes) -> None:
    """Send a get that must bring the training item."""
    c.send(request)
    if c.read_value() != ITEM:
        raise RuntimeError(f"{request.strip().decode()}: no item")


def set_request(queue: str, data: bytes = ITEM, expiry: int = 0, noreply: bool = False) -> bytes:
    tail = b" noreply" if noreply else b""
    return b"set %s 0 %d %d%s\r\n%s\r\n" % (queue.encode(), expiry, len(data), tail, data)


def one_connection(server: KestreldProcess, n: int) -> None:
    c = Conn(server.connect())
    for _ in range(n):
        c.send(set_request("one"))
        expect(c, b"STORED")
    for _ in range(n // 2):
        take(c, b"get one\r\n")
    for _ in range(n - n // 2):
        take(c, b"get one/close/open\r\n")
    c.send(b"get one/abort\r\n")
    expect(c, b"END")
    take(c, b"get one/open\r\n")
    c.send(b"get one/close\r\n")
    expect(c, b"END")
    # Misses, with and without a wait, and a peek.
    for _ in range(n // 10):
        c.send(b"get one\r\n")
        expect(c, b"END")
        c.send(b"get one/peek\r\n")
        expect(c, b"END")
    for _ in range(10):
        c.send(b"get one/t=1\r\n")
        expect(c, b"END")
    # Noreply and expiring sets, drained.
    for i in range(n // 2):
        c.send(set_request("one", expiry=3600 if i % 2 else 0, noreply=True))
    c.send(b"version\r\n")
    if not c.line().startswith(b"VERSION"):
        raise RuntimeError("version: no VERSION")
    for _ in range(n // 2):
        take(c, b"get one\r\n")
    c.close()


def open_close_loop(server: KestreldProcess, n: int, waiting: bool) -> None:
    """One producer and one consumer: the consumer confirms each item as it opens the next."""
    producer, consumer = Conn(server.connect()), Conn(server.connect())
    get = b"get loop/close/open/t=1000\r\n" if waiting else b"get loop/close/open\r\n"
    for _ in range(n):
        if waiting:
            consumer.send(get)
            time.sleep(0.0002)  # the consumer waits when the item comes
        producer.send(set_request("loop"))
        expect(producer, b"STORED")
        if waiting:
            if consumer.read_value() != ITEM:
                raise RuntimeError("open/close loop: no item")
        else:
            take(consumer, get)
    consumer.send(b"get loop/close\r\n")
    expect(consumer, b"END")
    producer.close()
    consumer.close()


def many_connections(server: KestreldProcess, connections: int, rounds: int) -> None:
    """Pipelined rounds: every connection sends a request, then every reply is read."""
    conns = [Conn(server.connect()) for _ in range(connections)]
    half = connections // 2

    def round_of(request: bytes, check) -> None:
        for c in conns:
            c.send(request)
        for c in conns:
            check(c)

    def an_item(c: Conn) -> None:
        if c.read_value() != ITEM:
            raise RuntimeError("many connections: no item")

    for _ in range(rounds):
        round_of(set_request("many"), lambda c: expect(c, b"STORED"))
    for _ in range(rounds // 2):
        round_of(b"get many\r\n", an_item)
    for _ in range(rounds - rounds // 2):
        round_of(b"get many/close/open\r\n", an_item)
    round_of(b"get many/close\r\n", lambda c: expect(c, b"END"))
    # Half produce, half run the waiting open/close loop.
    producers, consumers = conns[:half], conns[half:]
    for _ in range(rounds):
        for c in consumers:
            c.send(b"get manyloop/close/open/t=1000\r\n")
        for c in producers:
            c.send(set_request("manyloop"))
        for c in producers:
            expect(c, b"STORED")
        for c in consumers:
            an_item(c)
    for c in consumers:
        c.send(b"get manyloop/close\r\n")
        expect(c, b"END")
    for c in conns:
        c.close()


def fanout_and_read_behind(server: KestreldProcess, n: int) -> None:
    c = Conn(server.connect())
    for name in ("fan+a", "fan+b"):
        c.send(b"get %s\r\n" % name.encode())  # creates the reader
        expect(c, b"END")
    for _ in range(n):
        c.send(set_request("fan"))
        expect(c, b"STORED")
        c.send(set_request("behind"))  # past 16 KiB the reader reads behind from the journal
        expect(c, b"STORED")
    for _ in range(n):
        for queue in (b"fan", b"fan+a", b"fan+b", b"behind"):
            take(c, b"get %s\r\n" % queue)
    c.close()


def main() -> int:
    if implementation() != "compiled":
        print("kestreld train: the compiled modules are not the ones that run", file=sys.stderr)
        return 2
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kestreld-train-") as tmp:
        server = KestreldProcess(Path(tmp) / "queues", CONFIG).start()
        try:
            one_connection(server, 3000)
            open_close_loop(server, 1000, waiting=True)
            open_close_loop(server, 1000, waiting=False)
            many_connections(server, 100, 40)
            fanout_and_read_behind(server, 300)
        finally:
            code = server.stop()  # a clean exit writes the counts
        if code != 0:
            print(f"kestreld train: the server exited with {code}", file=sys.stderr)
            return 1
    print(f"kestreld train: done in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
