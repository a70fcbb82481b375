"""Scraping a real server's Prometheus endpoint (``metrics_port``), for any test.

Used by tests/stats/test_metrics.py and by the tests that read a figure off
``/metrics`` (tests/reliability/test_durable_confirms.py).
"""

from __future__ import annotations

import urllib.error
import urllib.request

from kestreld_process import KestreldProcess
from prometheus_client.parser import text_string_to_metric_families

METRICS_CONFIG = "metrics_port = 0\n"


def metrics_url(proc: KestreldProcess, path: str = "/metrics") -> str:
    """The endpoint's URL, from the last ``metrics_listening`` event (port 0 = any free port)."""
    event = proc.events("metrics_listening")[-1]
    return f"http://{event['address']}{path}"


def fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def scrape(proc: KestreldProcess) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """sample name -> {sorted labels: value}, parsed by prometheus_client."""
    status, _, body = fetch(metrics_url(proc))
    assert status == 200
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]
