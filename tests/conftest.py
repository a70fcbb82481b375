"""Shared fixtures: real kestreld processes on loopback ports.

- ``server``: one server per test module (distinct queue names per test).
- ``make_server``: a factory for servers with their own folder and config,
  stopped at the end of the test: ``make_server(config="max_items = 3")``.
- ``conn``: a raw protocol connection to ``server``.

Strict mode (``KESTRELD_TEST_STRICT=1``, set by ``.ci/run``): every skip is a
failure.  The suite skips only when the machine lacks something (Java, root or
mount rights, memcached, file descriptors, ...); CI provides all of it, so a
skip there means a test that silently proved nothing.
"""

from __future__ import annotations

import itertools
import os
import sys

import pytest

# The harness (process, raw connection, in-memory transport) lives in tests/support/.
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "support"))

from kestreld_process import Conn, KestreldProcess  # noqa: E402

_names = itertools.count()

STRICT = os.environ.get("KESTRELD_TEST_STRICT", "") not in ("", "0")


def _fail_skip_when_strict(report) -> None:
    """Under strict mode, turn a skip (not an xfail) into a failure that says why."""
    if not (STRICT and report.skipped and not hasattr(report, "wasxfail")):
        return
    if "peer" in getattr(report, "keywords", {}):
        return  # an optional peer built by hand (Darner): CI has none, by design
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (
        f"skipped under KESTRELD_TEST_STRICT=1 (CI must provide what this test needs): {reason}"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_skip_when_strict(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_skip_when_strict(outcome.get_result())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    proc = KestreldProcess(tmp_path_factory.mktemp("kestreld") / "queues")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def make_server(tmp_path):
    started: list[KestreldProcess] = []

    def factory(
        config: str | None = None, *, queue_path=None, args=None, start=True, env=None
    ) -> KestreldProcess:
        n = len(started)
        path = queue_path or tmp_path / f"queues{n}"
        proc = KestreldProcess(
            path,
            config,
            args=args,
            config_path=tmp_path / f"kestreld{n}.conf" if config is not None else None,
            env=env,
        )
        started.append(proc)
        return proc.start() if start else proc

    yield factory
    for proc in started:
        try:
            proc.stop()
        except Exception:
            proc.kill()


@pytest.fixture
async def served(tmp_path):
    """An in-process server on a loopback port (default config): a test may look at its
    objects, or change its command table, while it talks to it over a real socket."""
    from kestreld.server import Server, build_server_config

    config = build_server_config(None, {"queue_path": str(tmp_path / "q"), "port": 0})
    server = Server(config)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
def conn(server):
    c = Conn(server.connect())
    yield c
    c.close()


@pytest.fixture
def qname(request) -> str:
    """A queue name unique to this test (servers are shared per module)."""
    base = "".join(ch if ch.isalnum() else "_" for ch in request.node.name)[:150]
    return f"{base}_{next(_names)}"
