"""The server's own cost per request, in process, without sockets or a load generator.

Drives real :class:`MemcacheConnection` objects of a real started server with
in-memory transports: every connection sends one request per round, then the
event loop runs its tick (the journal batch is written and acknowledged, the
replies are "sent").  What is measured is the Python work of the front end,
the queues and the journal (file writes included), which is the part of
``scripts/bench``'s server CPU per operation that kestreld's code controls;
the socket system calls and uvloop's polling are left out.  Being work in
one process with no load generator, it repeats within a few percent on a
quiet machine, so it is the figure to compare before and after a change to
the hot path (in the same sitting: a busy host slows both sides alike).

    scripts/bench-hotpath                  # set, get, reliable; best of 3
    scripts/bench-hotpath --connections 100 --rounds 2000
    scripts/bench-hotpath --profile set    # cProfile, top functions
    scripts/bench-hotpath -c 2 waiting     # the open/close loop, the consumer blocked (/t=)
    scripts/bench-hotpath version          # no queue work: what every request pays

(``.venv/bin/python scripts/lab/hotpath.py`` is the same program.)  It measures the
implementation that runs (the first line says which): ``KESTRELD_NO_EXTENSIONS=1
scripts/bench-hotpath`` measures the plain Python of a compiled install.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import tempfile
import time

from kestreld import __version__
from kestreld.compiled import implementation
from kestreld.frontends.memcache.commands import COMMANDS, UNKNOWN
from kestreld.frontends.memcache.connection import MemcacheConnection
from kestreld.log import configure_logging
from kestreld.server import Server, build_server_config
from kestreld.testing.memory_transport import MemoryTransport


async def _rounds(conns, request: bytes, rounds: int) -> float:
    """CPU seconds for ``rounds`` rounds of one request per connection."""
    started = time.process_time()
    for _ in range(rounds):
        for c in conns:
            c.data_received(request)
        await asyncio.sleep(0)  # the tick: journal batch written, acknowledged, replies out
        await asyncio.sleep(0)
    return time.process_time() - started


async def _open_close_rounds(producers, consumers, set_req: bytes, rounds: int, *, waiting: bool):
    """CPU seconds for ``rounds`` items through the open/close loop."""
    get_req = b"get hot/close/open/t=500\r\n" if waiting else b"get hot/close/open\r\n"
    started = time.process_time()
    for _ in range(rounds):
        if waiting:
            for c in consumers:
                c.data_received(get_req)  # blocks: the queue is empty
        for c in producers:
            c.data_received(set_req)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        if not waiting:
            for c in consumers:
                c.data_received(get_req)
        await asyncio.sleep(0)
    return time.process_time() - started


async def measure(workload: str, connections: int, rounds: int, size: int, folder: str) -> dict:
    config = build_server_config(None, {"queue_path": folder, "port": 0, "log_level": "warning"})
    server = Server(config)
    await server.start()
    try:
        conns = [MemcacheConnection(server, COMMANDS, UNKNOWN) for _ in range(connections)]
        for c in conns:
            c.connection_made(MemoryTransport(keep=False))
        payload = b"x" * size
        set_req = b"set hot 0 0 %d\r\n%s\r\n" % (size, payload)
        ops = connections * rounds
        if workload == "set":
            seconds = await _rounds(conns, set_req, rounds)
        elif workload == "version":
            # No queue work: the floor every request pays (framing, command, reply, tick).
            seconds = await _rounds(conns, b"version\r\n", rounds)
        elif workload == "get":
            await _rounds(conns, set_req, rounds)  # prefill, unmeasured
            seconds = await _rounds(conns, b"get hot\r\n", rounds)
        elif workload in ("reliable", "waiting"):
            # Half the connections produce, half run the open/close loop: per item one set
            # and one get hot/close/open, as scripts/bench's reliable rows.  "waiting": the
            # consumer is blocked (/t=) when the item comes, the hand-off from the set's
            # acknowledgement to the waiting get.
            half = connections // 2
            if half == 0:
                raise SystemExit(
                    f"{workload}: needs at least 2 connections (producers and consumers)"
                )
            seconds = await _open_close_rounds(
                conns[:half], conns[half:], set_req, rounds, waiting=workload == "waiting"
            )
            ops = half * rounds
        else:
            raise SystemExit(f"unknown workload {workload}")
        return {"workload": workload, "ops": ops, "us_per_op": seconds / ops * 1e6}
    finally:
        await server.stop()


def run(workload: str, args: argparse.Namespace) -> dict:
    import uvloop

    with tempfile.TemporaryDirectory(prefix="kestreld-hot-", dir=args.workdir) as folder:
        return uvloop.run(measure(workload, args.connections, args.rounds, args.size, folder))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="scripts/bench-hotpath", description=__doc__.split("\n\n")[0])
    p.add_argument("workloads", nargs="*", default=["set", "get", "reliable"])
    p.add_argument("-c", "--connections", type=int, default=100)
    p.add_argument("--rounds", type=int, default=1000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=3, help="runs per workload; the best is shown")
    p.add_argument("--workdir", default=None)
    p.add_argument("--profile", metavar="WORKLOAD", help="cProfile one workload instead")
    args = p.parse_args(argv)
    configure_logging("console", "warning")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        run(args.profile, args)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
        return 0
    print(
        f"kestreld {__version__} ({implementation()}), {args.connections} connections, {args.size} B"
    )
    for workload in args.workloads:
        runs = [run(workload, args) for _ in range(args.repeat)]
        best = min(r["us_per_op"] for r in runs)
        spread = ", ".join(f"{r['us_per_op']:.2f}" for r in runs)
        print(f"{workload:9s} {best:7.2f} us/op (runs: {spread}) x {runs[0]['ops']:,} ops")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
