"""The admin port's HTTP server: ostrich's endpoints, Prometheus ``/metrics``, the live page.

``AdminServer(server)`` listens on ``metrics_address`` (default: the server's
``listen_address``) and ``metrics_port`` (``admin_address`` / ``admin_port`` are the
same keys), on the server's own event loop.  It reads figures there, as ``stats``
does, and builds every large answer on its own thread from that snapshot, so a
scrape holds up clients no longer than a ``stats`` command would.

Reading (GET, HEAD; no token needed):

- ``/ping`` → ``{"response":"pong"}``; ``/server_info``; ``/stats.json`` in ostrich's
  shape (:mod:`kestreld.admin.ostrich`) with ``?period=N`` (1-60 s) and ``?filtered=1``;
  each also as ``.txt`` (ostrich's indented text) and ``.json`` or bare.
- ``/metrics``: Prometheus; ``/flat_stats.json``: the old flat ``/stats.json``.
- ``/``: the live page; ``/admin/overview.json`` and ``/admin/<file>``: what it loads.

Changing (POST, and GET for Kestrel's scripts): ``/reload``, ``/quiesce`` (status
QUIESCENT, then a graceful shutdown), ``/shutdown``.  With ``admin_token`` set each must
carry ``Authorization: Bearer <token>`` (compared in constant time), wherever the port
listens; without a token they are accepted only when the port listens on loopback only,
their ``Host`` names this server (the Host rule below), and never from a browser page of
another site.  Otherwise 403, and nothing changes.

The Host rule (the DNS-rebinding defence): a page of ``evil.example`` whose name the
attacker re-points at 127.0.0.1 reaches a loopback port from the victim's browser as
"same origin", but its requests still say ``Host: evil.example``.  So wherever a
browser could be the client — every request that arrives on a loopback address, and
every tokenless changing request — the ``Host`` header must name this server: a
loopback name or address (``localhost``, ``127.0.0.1``, ``[::1]``), the address the
connection arrived on, the configured admin address, or a name in
``admin_allowed_hosts``.  Otherwise (no ``Host`` either) 403.

HTTPS: with ``admin_tls_cert_file`` and ``admin_tls_key_file`` the port speaks TLS only;
``reload`` reads the files again (:attr:`AdminServer.tls`), as for the listeners.

Bad input: a request head over :data:`MAX_REQUEST_HEAD` gets 431, a body over
:data:`MAX_BODY` 413, a malformed request 400, a request not complete within
:data:`REQUEST_TIMEOUT` 408; an unknown path 404, another method 405.  One request per
connection; at most :data:`MAX_CLIENTS` at once (503 beyond); a reader that does not
take its answer within :data:`WRITE_TIMEOUT` is cut off.  Nothing here ever waits on
the event loop for a client, so a slow scraper never slows the memcache port.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

import structlog

from kestreld import __version__
from kestreld.admin import ostrich, page
from kestreld.admin.ostrich import AdminSnapshot, queue_limits
from kestreld.admin.window import MAX_PERIOD, SAMPLE_SECONDS, Sample, StatsWindow
from kestreld.compiled import implementation
from kestreld.journal import periodic_sync
from kestreld.queues import journaled_queue, reader
from kestreld.security.tls import HANDSHAKE_TIMEOUT, ServerTls, TlsError, TlsFiles
from kestreld.state import ServerStatus
from kestreld.stats.collector import StatsSnapshot
from kestreld.stats.latency import LatencyHistograms
from kestreld.stats.metrics import PrometheusExposition, Response, render_flat_stats_json

if TYPE_CHECKING:
    from kestreld.state import ServerState as Server
    from kestreld.workers.box_figures import BoxFigures

log = structlog.get_logger("kestreld.admin")

#: Bytes of request line plus headers accepted; a scraper or a browser sends under 2 KiB.
MAX_REQUEST_HEAD = 16 * 1024
#: Bytes of request body accepted (the changing endpoints take none; curl -d may send some).
MAX_BODY = 4 * 1024
#: Seconds a client may take to send its whole request.
REQUEST_TIMEOUT = 10.0
#: Seconds a client may take to read its answer.
WRITE_TIMEOUT = 30.0
#: Connections served at once; more get 503 at once.
MAX_CLIENTS = 64
#: Seconds between the answer to /quiesce or /shutdown and the start of the shutdown.
ACTION_DELAY = 0.1

_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_HOST_REFUSED = (
    "the Host header does not name this server (a loopback name or address, the admin "
    "address, or one of admin_allowed_hosts)"
)
_READING = ("GET", "HEAD")
_CHANGING = ("GET", "POST")
_OSTRICH_READING = ("ping", "server_info", "stats")
_OSTRICH_CHANGING = ("reload", "quiesce", "shutdown")


class BadRequest(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _plain(status: int, text: str, extra: list[str] | None = None) -> Response:
    return status, _TEXT, (text + "\n").encode(), extra or []


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """An IP address (an IPv4-mapped IPv6 one as IPv4, a zone dropped), or None for a name."""
    try:
        address = ipaddress.ip_address(text.split("%", 1)[0])
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)  # a dual-stack socket's 127.0.0.1
    return mapped if mapped is not None else address


def _is_loopback(host: str) -> bool:
    address = _ip(host)
    return address is not None and address.is_loopback


#: Host names that are this machine wherever they are asked (RFC 6761 keeps them on loopback).
LOOPBACK_NAMES = frozenset({"localhost"})


def host_of(header: str) -> str | None:
    """The host of a ``Host`` header: lower-case, without port or IPv6 brackets; None if malformed."""
    text = header.strip().lower()
    if text.startswith("["):
        host, closed, rest = text[1:].partition("]")
        if not closed or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        return host or None
    host, colon, port = text.partition(":")
    if colon and not port.isdigit():
        return None  # a bare IPv6 address or garbage: not a Host a browser sends
    return host.rstrip(".") or None


def _same_address(host: str, address: str) -> bool:
    """Does ``host`` name ``address``?  Never for an unspecified one (``0.0.0.0``, ``::``)."""
    ip = _ip(address)
    if ip is not None and ip.is_unspecified:
        return False  # listening everywhere is no name: a browser may dial 0.0.0.0 itself
    return (ip is not None and _ip(host) == ip) or host == address.lower()


class AdminServer:
    """The admin port of one :class:`Server`; ``start()`` then ``stop()``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.latency = LatencyHistograms()
        self.window = StatsWindow()
        self.prometheus = PrometheusExposition()
        self.started = time.time()
        self._encoder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kestreld-admin")
        self._listener: asyncio.Server | None = None
        self._handlers: set[asyncio.Task] = set()
        self._sampler: asyncio.Task | None = None
        self._loopback_only = False
        #: With ``workers = N``: worker 0's way to the other workers' figures (it serves the
        #: box's); None for a lone server, and in the other workers (they only count).
        self.box: BoxFigures | None = None
        #: HTTPS (admin_tls_cert_file): renewed by the server's reload, as the listeners' is.
        self.tls: ServerTls | None = None

    # --- life cycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen, hook the observers, start sampling.  Raises StartupError when it cannot."""
        from kestreld.state import StartupError

        config = self.server.config
        role = getattr(self.server, "role", None)
        if role is not None and not role.serves_box:
            self._observe()  # its figures are asked for over its channel (box_figures.py)
            return
        if role is not None and role.count > 1:
            from kestreld.workers.box_figures import BoxFigures

            self.box = BoxFigures(role.index, role.count, role.folder)
        address = config.metrics_address or config.listen_address
        tls = None
        if config.admin_tls_cert_file is not None and config.admin_tls_key_file is not None:
            try:
                self.tls = ServerTls(
                    TlsFiles(config.admin_tls_cert_file, config.admin_tls_key_file)
                )
            except TlsError as e:
                raise StartupError(f"admin port: {e}") from None
            tls = self.tls.context
        # A box's admin port was bound by its supervisor (kestreld/workers/supervisor.py).
        shared = role.sockets.get("admin") if role is not None else None
        where: dict[str, Any] = (
            {"sock": shared}
            if shared is not None
            else {"host": address, "port": config.metrics_port, "reuse_address": True}
        )
        try:
            self._listener = await asyncio.start_server(
                self._handle,
                **where,
                limit=MAX_REQUEST_HEAD,
                ssl=tls,
                ssl_handshake_timeout=HANDSHAKE_TIMEOUT if tls is not None else None,
            )
        except OSError as e:
            raise StartupError(
                f"cannot listen on {address}:{config.metrics_port} for metrics: {e.strerror or e}"
            ) from None
        self._loopback_only = all(
            _is_loopback(sock.getsockname()[0]) for sock in self._listener.sockets
        )
        self._observe()
        # The first sample, at start: a box's is this worker's figures alone (everything
        # counts from zero in every worker; the others' queues are new to the window).
        self.take_sample(self.snapshot())
        self._sampler = asyncio.get_running_loop().create_task(self._sample_forever())
        sock = self._listener.sockets[0].getsockname()
        log.info(
            "metrics_listening",
            address=f"{sock[0]}:{sock[1]}",
            paths="/,/metrics,/stats.json,/ping,/server_info",
            tls=tls is not None,
        )
        if not self._loopback_only and not config.admin_token:
            log.warning(
                "admin_port_unprotected",
                address=f"{sock[0]}:{sock[1]}",
                reason="the admin port listens beyond loopback and admin_token is not set: "
                "anyone who reaches it reads every figure; /reload, /quiesce and /shutdown "
                "are refused until admin_token is set",
            )

    def _observe(self) -> None:
        self.server.latency_observer = self.latency.observe_request
        periodic_sync.observe_fsyncs(self.latency.observe_fsync)
        reader.observe_deliveries(self.latency.observe_delivery)
        journaled_queue.observe_stores(self.latency.observe_stored)

    @property
    def port(self) -> int:
        assert self._listener is not None
        return self._listener.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening, let answers in progress finish (1 s), unhook the observers."""
        if self.server.latency_observer == self.latency.observe_request:
            self.server.latency_observer = None
        # Unhook ours; another server's observers (tests run several) stay.
        for observe, ours in (
            (periodic_sync.observe_fsyncs, self.latency.observe_fsync),
            (reader.observe_deliveries, self.latency.observe_delivery),
            (journaled_queue.observe_stores, self.latency.observe_stored),
        ):
            previous = observe(None)
            if previous != ours:
                observe(previous)
        if self._sampler is not None:
            self._sampler.cancel()
        if self.box is not None:
            self.box.close()
        if self._listener is None:
            return
        self._listener.close()
        current = asyncio.current_task()
        handlers = [t for t in self._handlers if t is not current]
        if handlers:
            _, pending = await asyncio.wait(handlers, timeout=1.0)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
        self._listener = None
        self._encoder.shutdown(wait=True)  # at most one rendering in progress

    # --- figures ----------------------------------------------------------------------------

    def snapshot(self) -> AdminSnapshot:
        """Everything the endpoints show, read now (on the event loop)."""
        samples = self.window.samples
        previous = samples[-1].latency if samples else None
        latency = self.latency.snapshot(previous)
        limits = queue_limits(self.server.queues)
        return AdminSnapshot(StatsSnapshot.take(self.server), latency, limits)

    async def figures(self) -> AdminSnapshot:
        """What the endpoints show: this server's, or with ``workers = N`` the box's
        (every worker's that answered in time, merged: kestreld/workers/box_figures.py)."""
        if self.box is None:
            return self.snapshot()
        return await self.box.gather(self.server, self.latency)

    def take_sample(self, snapshot: AdminSnapshot) -> None:
        delivered = snapshot.latency.queues["delivery"]
        flows = {}
        for name, values in snapshot.stats.queues:
            histogram = delivered.get(name)
            flows[name] = (
                int(values.get("total_items", 0)),
                histogram.count if histogram else 0,
                int(values.get("items", 0)),
            )
        for name, values in snapshot.stats.aliases:  # an alias is put to, never read
            flows[name] = (int(values.get("put_items", 0)), 0, 0)  # type: ignore[call-overload]
        self.latency.forget(set(flows))
        self.window.add(Sample(time.monotonic(), snapshot.counters(), snapshot.latency, flows))

    async def _sample_forever(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_SECONDS)
            try:
                self.take_sample(await self.figures())
            except Exception:
                log.exception("admin_sample_failed")

    def server_info(self) -> dict[str, object]:
        """``/server_info``: ostrich's fields that kestreld has."""
        now = time.time()
        return {
            "name": "kestreld",
            "version": __version__,
            "build": implementation(),
            "start_time": time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(self.started)),
            "uptime": int((now - self.server.stats.started) * 1000),
            "status": self.server.status.value,
        }

    def page_server(self, snapshot: AdminSnapshot) -> dict[str, object]:
        if self.box is not None:
            return self.page_box(snapshot)
        items, nbytes = self.server.queues.totals()
        return {
            "name": "kestreld",
            "version": __version__,
            "implementation": implementation(),
            "status": self.server.status.value,
            "uptime_s": int(time.time() - self.server.stats.started),
            "connections": self.server.clients(),
            "items": items,
            "bytes": nbytes,
            "queues": len(self.server.queues.queues),
            "port": self.server.config.port,
        }

    def page_box(self, snapshot: AdminSnapshot) -> dict[str, object]:
        """The page's server figures of a box: its totals, and how many workers answered."""
        values = snapshot.global_values()
        return {
            "name": "kestreld",
            "version": __version__,
            "implementation": implementation(),
            "status": snapshot.stats.status.value,
            "uptime_s": int(time.time() - self.server.stats.started),
            "connections": values["curr_connections"],
            "items": values["curr_items"],
            "bytes": values["bytes"],
            "queues": sum(1 for name, _ in snapshot.stats.queues if "+" not in name),
            "port": self.server.config.port,
            "workers": values["workers"],
            "workers_answering": values["workers_answering"],
        }

    # --- HTTP -------------------------------------------------------------------------------

    async def _handle(self, stream: asyncio.StreamReader, out: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        if len(self._handlers) >= MAX_CLIENTS:
            self._send(out, "GET", _plain(503, "too many admin connections; try again"))
            out.close()
            return
        self._handlers.add(task)
        method = "GET"
        try:
            try:
                method, target, headers = await asyncio.wait_for(
                    self._read_request(stream), REQUEST_TIMEOUT
                )
            except BadRequest as e:
                response = _plain(e.status, e.reason)
            except TimeoutError:
                response = _plain(408, "request not complete in time")
            else:
                local = out.get_extra_info("sockname")
                response = await self._respond(method, target, headers, local[0] if local else "")
            self._send(out, method, response)
            await asyncio.wait_for(out.drain(), WRITE_TIMEOUT)
        except TimeoutError:
            out.transport.abort()  # a reader that takes nothing: its answer is dropped
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        except Exception:
            log.exception("admin_request_failed")
        finally:
            self._handlers.discard(task)
            out.close()

    async def _read_request(self, stream: asyncio.StreamReader) -> tuple[str, str, dict[str, str]]:
        try:
            head = await stream.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise BadRequest(431, "request head too large") from None
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not parts[1].startswith("/"):
            raise BadRequest(400, "bad request line")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            if not line:
                continue
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise BadRequest(400, "bad header line")
            headers[name.lower()] = value.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            raise BadRequest(400, "chunked request bodies are not accepted")
        length_text = headers.get("content-length", "0")
        if not length_text.isdigit():
            raise BadRequest(400, "bad Content-Length")
        length = int(length_text)
        if length > MAX_BODY:
            raise BadRequest(413, f"request body over {MAX_BODY} bytes")
        if length:
            await stream.readexactly(length)  # not used: read so the answer is not a reset
        return parts[0], parts[1], headers

    def _send(self, out: asyncio.StreamWriter, method: str, response: Response) -> None:
        status, content_type, body, extra = response
        lines = [
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
            f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}",
            "Cache-Control: no-store",
            "X-Content-Type-Options: nosniff",
            "Connection: close",
            *extra,
        ]
        out.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if method != "HEAD":
            out.write(body)

    async def _respond(
        self, method: str, target: str, headers: dict[str, str], local: str
    ) -> Response:
        parts = urlsplit(target)
        path = parts.path
        if _is_loopback(local) and not self._host_allowed(headers, local):
            # Arrived on loopback, so a local browser may be the client: see the Host rule.
            log.warning("admin_request_refused", path=path, host=headers.get("host"))
            return _plain(403, f"forbidden: {_HOST_REFUSED}")
        query = parse_qs(parts.query)
        loop = asyncio.get_running_loop()
        name, dot, ext = path[1:].rpartition(".") if "." in path else (path[1:], "", "")
        fmt = ext if dot else "json"
        if name in _OSTRICH_CHANGING and fmt in ("json", "txt"):
            if method not in _CHANGING:
                return _plain(405, "method not allowed", ["Allow: GET, POST"])
            return self._change(name, fmt, headers, local)
        if method not in _READING:
            return _plain(405, "method not allowed", ["Allow: GET, HEAD"])
        if name in _OSTRICH_READING and fmt in ("json", "txt"):
            if name == "ping":
                return self._ostrich_answer("pong", fmt)
            if name == "server_info":
                return self._ostrich_answer(self.server_info(), fmt)
            return await self._stats(query, fmt)
        if path == "/metrics":
            if self.box is None:
                snapshot, latency = StatsSnapshot.take(self.server), self.latency.snapshot()
                processes = None
            else:
                from kestreld.workers.box_figures import WorkerProcesses

                box = await self.figures()
                snapshot, latency = box.stats, box.latency
                processes = WorkerProcesses(self.box.pids)
            return await loop.run_in_executor(
                self._encoder, self.prometheus.render, snapshot, latency, headers, processes
            )
        if path == "/flat_stats.json":
            snapshot = StatsSnapshot.take(self.server) if self.box is None else None
            if snapshot is None:
                snapshot = (await self.figures()).stats
            return await loop.run_in_executor(self._encoder, render_flat_stats_json, snapshot)
        if path == "/":
            return 200, page.STATIC_FILES["index.html"], page.static_file("index.html"), []
        if path == "/admin/overview.json":
            admin_snapshot = await self.figures()
            doc = await loop.run_in_executor(
                self._encoder,
                page.overview,
                admin_snapshot,
                self.window,
                time.monotonic(),
                self.page_server(admin_snapshot),
            )
            return 200, _JSON, json.dumps(doc, separators=(",", ":")).encode(), []
        if path.startswith("/admin/") and path[7:] in page.STATIC_FILES:
            return 200, page.STATIC_FILES[path[7:]], page.static_file(path[7:]), []
        return _plain(404, "not found: try /, /stats.json, /metrics, /ping or /server_info")

    def _ostrich_answer(self, value: object, fmt: str) -> Response:
        """As ostrich: text as it is, JSON always an object (``{"response": value}``)."""
        if fmt == "txt":
            return 200, _TEXT, ostrich.render_text(value).encode(), []
        if not isinstance(value, dict):
            value = {"response": value}
        body = json.dumps(value, separators=(",", ":")).encode() + b"\n"
        return 200, _JSON, body, []

    async def _stats(self, query: dict[str, list[str]], fmt: str) -> Response:
        period_text = query.get("period", [None])[-1]
        filters = self.server.config.stats_filters if query.get("filtered") == ["1"] else ()
        baseline = None
        if period_text is not None:
            if not period_text.isdigit() or not 1 <= int(period_text) <= MAX_PERIOD:
                return _plain(400, f"period: whole seconds from 1 to {MAX_PERIOD}")
            baseline = self.window.baseline(time.monotonic(), int(period_text))
        snapshot = await self.figures()

        def render() -> Response:
            doc = ostrich.summary(
                snapshot,
                baseline.counters if baseline is not None else None,
                baseline.latency if baseline is not None else None,
                filters,
            )
            return self._ostrich_answer(doc, fmt)

        return await asyncio.get_running_loop().run_in_executor(self._encoder, render)

    # --- changing the server ----------------------------------------------------------------

    def _host_allowed(self, headers: dict[str, str], local: str) -> bool:
        """Does the request's ``Host`` name this server (the Host rule in the module doc)?"""
        host = host_of(headers.get("host", ""))
        if host is None:
            return False
        config = self.server.config
        if host in LOOPBACK_NAMES or _is_loopback(host) or host in config.admin_allowed_hosts:
            return True
        configured = config.metrics_address or config.listen_address
        return _same_address(host, configured) or (bool(local) and _same_address(host, local))

    def _may_change(self, headers: dict[str, str], local: str) -> str | None:
        """None when this request may change the server, else why not."""
        token = self.server.config.admin_token
        if token:
            scheme, _, given = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer":
                return "this needs Authorization: Bearer <admin_token>"
            # Digests first: compare_digest is constant-time only for equal lengths.
            expected = hashlib.sha256(token.encode()).digest()
            offered = hashlib.sha256(given.strip().encode("latin-1")).digest()
            return None if hmac.compare_digest(expected, offered) else "wrong admin token"
        if not self._loopback_only:
            return "admin_token is not set and the admin port listens beyond loopback"
        if not self._host_allowed(headers, local):
            return _HOST_REFUSED
        # Tokenless on loopback: still not from a page of another site in a local browser.
        if headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none"):
            return "not from another site's page"
        origin = headers.get("origin")
        if origin is not None and urlsplit(origin).netloc != headers.get("host"):
            return "not from another site's page"
        return None

    def _change(self, action: str, fmt: str, headers: dict[str, str], local: str) -> Response:
        refused = self._may_change(headers, local)
        if refused is not None:
            log.warning("admin_action_refused", action=action, reason=refused)
            return _plain(403, f"forbidden: {refused}")
        log.info("admin_action", action=action)
        server = self.server
        loop = asyncio.get_running_loop()
        if action == "reload":
            error, needs_restart = server.reload()
            if error is not None:
                return 500, _JSON, json.dumps({"response": "error", "error": error}).encode(), []
            if self.box is not None:  # the same file: the other workers read it too
                self.box.reload_others()
            return self._ostrich_answer({"response": "ok", "needs_restart": needs_restart}, fmt)
        if action == "quiesce":
            server.set_status(ServerStatus.QUIESCENT)
            if self.box is not None:
                self.box.quiesce_others()
        # The answer goes out before the shutdown starts (ostrich waited 100 ms too).
        stop = server.request_shutdown if self.box is None else self.box.stop_box
        loop.call_later(ACTION_DELAY, stop, f"admin /{action}")
        return self._ostrich_answer("ok", fmt)
