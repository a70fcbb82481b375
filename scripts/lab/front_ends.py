"""Kestrel's thrift front end against memcache: items/s and server CPU per item.

    python scripts/lab/front_ends.py [--items 20000] [--size 1024] [--batch 100]

One client connection each, on a fresh server in a temporary folder:

- thrift ``put`` of ``batch`` items per call, then ``get(max_items=batch)``
  until the queue is empty (auto_abort_msec = 0: confirmed as returned);
- memcache single-item ``set``, then single-item ``get`` (pymemcache);
- ``get_version`` round trips on kestreld's thrift port and on thriftpy2's own
  asyncio server (same codec, a do-nothing handler): the cost of the framing
  and dispatch alone.

Server CPU is the process's user + system time over the phase (/proc), so
the client's own cost is not in it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import tempfile
import threading
import time
from pathlib import Path


def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _row(name: str, items: int, wall: float, cpu: float) -> str:
    return (
        f"| {name} | {items} | {items / wall:,.0f} | {cpu * 1e6 / items:,.1f} |"
        if items
        else f"| {name} | 0 | - | - |"
    )


def _thriftpy2_server_round_trips(calls: int) -> tuple[float, float]:
    """get_version round trips on thriftpy2's asyncio server: (wall s, server-thread CPU s)."""
    import thriftpy2
    from thriftpy2.contrib.aio.protocol import TAsyncBinaryProtocolFactory
    from thriftpy2.contrib.aio.rpc import make_server
    from thriftpy2.contrib.aio.transport import TAsyncFramedTransportFactory

    from kestreld.frontends.thrift.codec import IDL_PATH

    idl = thriftpy2.load(str(IDL_PATH), module_name="kestrel_bench_aio_thrift")

    class Handler:
        async def get_version(self) -> str:
            return "bench"

    port = _free_port()
    ready = threading.Event()
    cpu: list[float] = []
    loop_box: list[asyncio.AbstractEventLoop] = []

    def serve() -> None:
        import uvloop  # the loop kestreld runs on: only the server code differs

        loop = uvloop.new_event_loop()
        loop_box.append(loop)
        asyncio.set_event_loop(loop)
        server = make_server(
            idl.Kestrel,
            Handler(),
            "127.0.0.1",
            port,
            proto_factory=TAsyncBinaryProtocolFactory(),
            trans_factory=TAsyncFramedTransportFactory(),
            loop=loop,
        )
        server.init_server()
        ready.set()
        started = time.thread_time()
        loop.run_forever()
        cpu.append(time.thread_time() - started)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    client = _client(port)
    started = time.perf_counter()
    for _ in range(calls):
        client.get_version()
    wall = time.perf_counter() - started
    client.close()
    loop = loop_box[0]
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    return wall, cpu[0] if cpu else 0.0


def _client(port: int):
    from thriftpy2.protocol import TBinaryProtocolFactory
    from thriftpy2.rpc import make_client
    from thriftpy2.transport import TFramedTransportFactory

    from kestreld.frontends.thrift.codec import kestrel

    return make_client(
        kestrel.Kestrel,
        "127.0.0.1",
        port,
        trans_factory=TFramedTransportFactory(),
        proto_factory=TBinaryProtocolFactory(),
        timeout=60_000,
    )


def run(items: int, size: int, batch: int) -> list[str]:
    from pymemcache.client.base import Client

    from kestreld.testing.process import KestreldProcess

    data = os.urandom(size)
    rows = [
        "| phase | items | items/s | server CPU µs/item |",
        "|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as folder:
        mc_port, thrift_port = _free_port(), _free_port()
        proc = KestreldProcess(
            Path(folder) / "queues",
            args=["--port", str(mc_port), "--thrift-port", str(thrift_port)],
        ).start()
        try:
            pid = proc.pid
            client = _client(thrift_port)
            calls = items // batch

            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            for _ in range(calls):
                client.put("bench_thrift", [data] * batch, 0)
            rows.append(
                _row(
                    f"thrift put, {batch} × {size} B per call",
                    calls * batch,
                    time.perf_counter() - t0,
                    _cpu_seconds(pid) - cpu0,
                )
            )
            got = 0
            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            while True:
                n = len(client.get("bench_thrift", batch, 0, 0))
                if not n:
                    break
                got += n
            rows.append(
                _row(
                    f"thrift get, max_items = {batch}",
                    got,
                    time.perf_counter() - t0,
                    _cpu_seconds(pid) - cpu0,
                )
            )

            mc = Client(("127.0.0.1", mc_port), timeout=60)
            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            for _ in range(calls * batch):
                mc.set("bench_mc", data, noreply=False)
            rows.append(
                _row(
                    f"memcache set, 1 × {size} B",
                    calls * batch,
                    time.perf_counter() - t0,
                    _cpu_seconds(pid) - cpu0,
                )
            )
            got = 0
            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            while mc.get("bench_mc") is not None:
                got += 1
            rows.append(
                _row(
                    "memcache get, 1 item", got, time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
                )
            )
            mc.close()

            calls = 5000
            cpu0, t0 = _cpu_seconds(pid), time.perf_counter()
            for _ in range(calls):
                client.get_version()
            wall = time.perf_counter() - t0
            rows.append(
                f"| get_version round trips, kestreld's thrift port | {calls} calls | "
                f"{calls / wall:,.0f} calls/s | {(_cpu_seconds(pid) - cpu0) * 1e6 / calls:,.1f} µs/call |"
            )
            client.close()
        finally:
            proc.stop()
    wall, cpu = _thriftpy2_server_round_trips(5000)
    rows.append(
        f"| get_version round trips, thriftpy2's asyncio server | 5000 calls | "
        f"{5000 / wall:,.0f} calls/s | {cpu * 1e6 / 5000:,.1f} µs/call |"
    )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python scripts/lab/front_ends.py")
    p.add_argument("--items", type=int, default=20_000)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--batch", type=int, default=100)
    args = p.parse_args(argv)
    for row in run(args.items, args.size, args.batch):
        print(row)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
