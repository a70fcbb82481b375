"""The metrics endpoint: Prometheus ``/metrics`` and ``/stats.json`` over HTTP.

``MetricsServer(server)`` listens on ``metrics_address`` (default: the
server's ``listen_address``) and ``metrics_port``.  It serves HTTP from the
server's own event loop and reads the figures there, on the thread that owns
the queues, exactly like the ``stats`` command (:class:`StatsSnapshot`).  The
expensive part, building and encoding thousands of samples, runs on the
endpoint's own thread from that snapshot, so a scrape holds up clients no
longer than ``stats`` would.

- ``GET /metrics``: every ``stats`` figure (see :mod:`kestreld.stats.collector`),
  the latency histograms (:mod:`kestreld.stats.latency`) and the process
  metrics, in the format the scraper asks for (Prometheus text, or
  OpenMetrics), gzipped when it accepts gzip.
- ``GET /stats.json``: the ``stats`` figures as one JSON object (Kestrel's
  admin port had the same): the global keys, ``status``, and ``queues``
  mapping each queue (and ``q+r`` reader) to its keys.
- ``GET /``: a short index.  Anything else: 404; methods other than GET and
  HEAD: 405.  One request per connection (``Connection: close``).

While it runs, the latency observers (``server.latency_observer`` and
``kestreld.journal.periodic_sync.fsync_observer``) feed its histograms.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from kestreld import __version__
from kestreld.journal import periodic_sync
from kestreld.stats.collector import StatsCollector, StatsSnapshot
from kestreld.stats.latency import LatencyHistograms

if TYPE_CHECKING:
    from kestreld.state import ServerState as Server

log = structlog.get_logger("kestreld.metrics")

#: Bytes of request line plus headers accepted; a scraper sends a few hundred.
MAX_REQUEST_HEAD = 16 * 1024
#: Seconds a client may take to send its request.
REQUEST_TIMEOUT = 10.0

_TEXT = "text/plain; charset=utf-8"
_INDEX = b"kestreld %s\n/metrics     Prometheus metrics\n/stats.json the stats as JSON\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}

#: (status, content type, body, extra headers)
Response = tuple[int, str, bytes, list[str]]


class MetricsServer:
    """The HTTP metrics endpoint of one :class:`Server`; ``start()`` then ``stop()``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.latency = LatencyHistograms()
        self._process = ProcessCollector(registry=None)
        self._platform = PlatformCollector(registry=None)
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kestreld-metrics")
        self._listener: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Listen, and hook the latency observers.  Raises StartupError when it cannot listen."""
        from kestreld.state import StartupError

        config = self.server.config
        address = config.metrics_address or config.listen_address
        try:
            self._listener = await asyncio.start_server(
                self._handle,
                address,
                config.metrics_port,
                reuse_address=True,
                limit=MAX_REQUEST_HEAD,
            )
        except OSError as e:
            raise StartupError(
                f"cannot listen on {address}:{config.metrics_port} for metrics: {e.strerror or e}"
            ) from None
        self.server.latency_observer = self.latency.observe_request
        periodic_sync.observe_fsyncs(self.latency.observe_fsync)
        sock = self._listener.sockets[0].getsockname()
        log.info(
            "metrics_listening", address=f"{sock[0]}:{sock[1]}", paths=["/metrics", "/stats.json"]
        )

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, end requests in progress, unhook the observers."""
        if self.server.latency_observer == self.latency.observe_request:
            self.server.latency_observer = None
        previous = periodic_sync.observe_fsyncs(None)
        if previous != self.latency.observe_fsync:
            periodic_sync.observe_fsyncs(previous)  # another server's: leave it
        if self._listener is None:
            return
        self._listener.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        self._listener = None
        self._encoder.shutdown(wait=True)  # at most one encoding in progress

    # --- what is served -------------------------------------------------------------------

    def registry(self, snapshot: StatsSnapshot, latency: LatencyHistograms) -> CollectorRegistry:
        """Everything ``/metrics`` shows, for one snapshot."""
        registry = CollectorRegistry(auto_describe=False)
        for collector in (StatsCollector(snapshot), latency, self._process, self._platform):
            registry.register(collector)
        return registry

    def render_metrics(
        self, snapshot: StatsSnapshot, latency: LatencyHistograms, headers: dict[str, str]
    ) -> Response:
        """``/metrics`` in the format the scraper accepts (any thread)."""
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry(snapshot, latency))
        extra = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            extra.append("Content-Encoding: gzip")
        return 200, content_type, body, extra

    @staticmethod
    def render_stats_json(snapshot: StatsSnapshot) -> Response:
        """``/stats.json``: the global keys, ``status``, and ``queues`` (any thread)."""
        doc: dict[str, object] = {}
        for key, value in snapshot.server:
            doc[key] = float(value) if key == "reserved_memory_ratio" else value  # type: ignore[arg-type]
        doc["status"] = snapshot.status.value
        if snapshot.zookeeper_connected is not None:
            doc["zookeeper_connected"] = snapshot.zookeeper_connected
        doc["queues"] = dict(snapshot.queues)
        body = json.dumps(doc, separators=(",", ":")).encode() + b"\n"
        return 200, "application/json", body, []

    # --- HTTP -----------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            except (
                asyncio.IncompleteReadError,
                asyncio.LimitOverrunError,
                TimeoutError,
                ConnectionError,
            ):
                return
            method = head.split(b" ", 1)[0]
            status, content_type, body, extra = await self._respond(head)
            lines = [
                f"HTTP/1.1 {status} {_REASONS[status]}",
                f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                *extra,
            ]
            out.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            if method != b"HEAD":
                out.write(body)
            await out.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("metrics_request_failed")
        finally:
            self._handlers.discard(task)
            out.close()

    async def _respond(self, head: bytes) -> Response:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, _TEXT, b"bad request\n", []
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, _TEXT, b"method not allowed\n", ["Allow: GET, HEAD"]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        path = urlsplit(target).path
        loop = asyncio.get_running_loop()
        if path == "/metrics":
            snapshot, latency = StatsSnapshot.take(self.server), self.latency.snapshot()
            return await loop.run_in_executor(
                self._encoder, self.render_metrics, snapshot, latency, headers
            )
        if path == "/stats.json":
            snapshot = StatsSnapshot.take(self.server)
            return await loop.run_in_executor(self._encoder, self.render_stats_json, snapshot)
        if path == "/":
            return 200, _TEXT, _INDEX % __version__.encode(), []
        return 404, _TEXT, b"not found: try /metrics or /stats.json\n", []
