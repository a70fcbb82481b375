"""The metrics endpoint: Prometheus ``/metrics`` and ``/stats.json`` over HTTP.

``MetricsServer(server)`` listens on ``metrics_address`` (default: the
server's ``listen_address``) and ``metrics_port``.  It serves HTTP from the
server's own event loop, so every scrape reads the queues on the thread that
owns them, exactly like the ``stats`` command; nothing is shared with another
thread.  A scrape costs what ``stats`` costs.

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
``kestreld.journal.writer.fsync_observer``) feed its histograms.
"""

from __future__ import annotations

import asyncio
import gzip
import json
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder

from kestreld import __version__
from kestreld.journal import writer
from kestreld.stats.collector import StatsCollector
from kestreld.stats.counters import global_stats, queue_stats
from kestreld.stats.latency import LatencyHistograms

if TYPE_CHECKING:
    from kestreld.protocol.server import Server

log = structlog.get_logger("kestreld.metrics")

#: Bytes of request line plus headers accepted; a scraper sends a few hundred.
MAX_REQUEST_HEAD = 16 * 1024
#: Seconds a client may take to send its request.
REQUEST_TIMEOUT = 10.0

_INDEX = b"kestreld %s\n/metrics     Prometheus metrics\n/stats.json the stats as JSON\n"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


class MetricsServer:
    """The HTTP metrics endpoint of one :class:`Server`; ``start()`` then ``stop()``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.latency = LatencyHistograms()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatsCollector(server))
        self.registry.register(self.latency)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._listener: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()

    async def start(self) -> None:
        """Listen, and hook the latency observers.  Raises StartupError when it cannot listen."""
        from kestreld.protocol.server import StartupError

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
        writer.fsync_observer = self.latency.observe_fsync
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
        if writer.fsync_observer == self.latency.observe_fsync:
            writer.fsync_observer = None
        if self._listener is None:
            return
        self._listener.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        self._listener = None

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
            status, content_type, body, extra = self._respond(head)
            method = head.split(b" ", 1)[0]
            headers = [
                f"HTTP/1.1 {status} {_REASONS[status]}",
                f"Content-Type: {content_type}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                *extra,
            ]
            out.write(("\r\n".join(headers) + "\r\n\r\n").encode("latin-1"))
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

    def _respond(self, head: bytes) -> tuple[int, str, bytes, list[str]]:
        """(status, content type, body, extra headers) for one request head."""
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return 400, "text/plain; charset=utf-8", b"bad request\n", []
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            return 405, "text/plain; charset=utf-8", b"method not allowed\n", ["Allow: GET, HEAD"]
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        url = urlsplit(target)
        if url.path == "/metrics":
            return self._metrics(headers)
        if url.path == "/stats.json":
            body = json.dumps(self.stats_json(), separators=(",", ":")).encode() + b"\n"
            return 200, "application/json", body, []
        if url.path == "/":
            return 200, "text/plain; charset=utf-8", _INDEX % __version__.encode(), []
        return 404, "text/plain; charset=utf-8", b"not found: try /metrics or /stats.json\n", []

    def _metrics(self, headers: dict[str, str]) -> tuple[int, str, bytes, list[str]]:
        encoder, content_type = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=6)
            extra.append("Content-Encoding: gzip")
        return 200, content_type, body, extra

    def stats_json(self) -> dict[str, object]:
        """The ``stats`` figures as a JSON-ready object (numbers as numbers)."""
        server = self.server
        out: dict[str, object] = {}
        for key, value in global_stats(
            server.stats, server.queues, len(server.connections), __version__
        ):
            out[key] = float(value) if key == "reserved_memory_ratio" else value
        out["status"] = server.status.value
        out["queues"] = {name: values for name, values in queue_stats(server.queues)}
        return out
