"""The live page at ``GET /`` of the admin port, in a real headless Chromium (Debian's
``chromium`` and ``chromium-driver``, driven by selenium) against a real server.

Screenshots go to ``$KESTRELD_SCREENSHOT_DIR`` when set (else the test's tmp folder):
``admin-page-1280.png`` and ``admin-page-phone.png``.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from kestreld_process import Conn, KestreldProcess

webdriver = pytest.importorskip("selenium.webdriver")
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


def wait_until(predicate, timeout: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except Exception as e:  # the page is between two renders
            last = e
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}: {last!r}")


@pytest.fixture
def browser(tmp_path):
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        pytest.skip("needs Debian's chromium and chromium-driver (.ci/run installs them)")
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium must not download a driver
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(30)
    yield driver
    driver.quit()


@pytest.fixture
def shots(tmp_path) -> Path:
    folder = Path(os.environ.get("KESTRELD_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def page_url(proc: KestreldProcess) -> str:
    return f"http://{proc.events('metrics_listening')[-1]['address']}/"


def cell(driver, name: str, index: int) -> str:
    row = driver.find_element(By.CSS_SELECTOR, f'tr[data-name="{name}"]')
    return row.find_elements(By.TAG_NAME, "td")[index].text


ITEMS, OPEN, WAITERS = 2, 5, 6


def test_the_page_shows_every_queue_and_follows_sets_and_gets(make_server, browser, shots):
    proc = make_server(
        'admin_port = 0\n[queues."orders+audit"]\n'
        '[aliases.everyone]\ndestination_queues = ["idle_queue"]\n'
    )
    c = Conn(proc.connect())
    for i in range(5):
        assert c.set("new_jobs", f"job{i}") == b"STORED"
    for i in range(3):
        assert c.set("orders", f"order{i}") == b"STORED"
    assert c.get("orders") == b"order0"
    assert c.get("idle_queue") is None
    c.send("get orders/open\r\n")
    assert c.read_value() == b"order1"

    browser.get(page_url(proc))
    names = wait_until(
        lambda: (
            {
                r.get_attribute("data-name")
                for r in browser.find_elements(By.CSS_SELECTOR, "#rows tr")
            }
            >= {"orders", "orders+audit", "new_jobs", "idle_queue", "everyone"}
            and True
        ),
        what="every queue and reader in the table",
    )
    assert names
    assert browser.find_element(By.ID, "status").text == "UP"
    assert cell(browser, "new_jobs", ITEMS) == "5"
    assert cell(browser, "orders", ITEMS) == "1"  # one taken, one open
    assert cell(browser, "orders", OPEN) == "1"
    assert cell(browser, "orders+audit", ITEMS) == "3"
    # what needs attention comes first: items arrived and nobody takes them.  Seconds
    # old, they are growing; stalled needs a minute of waiting (tests/admin/test_admin_states.py)
    first = browser.find_element(By.CSS_SELECTOR, "#rows tr").get_attribute("data-name")
    assert first in ("new_jobs", "orders+audit")
    assert cell(browser, "new_jobs", 1).lower() == "growing"
    badge = browser.find_element(By.CSS_SELECTOR, 'tr[data-name="new_jobs"] .state')
    assert badge.get_attribute("title").startswith("more items than a minute ago")
    # an alias is listed with its destinations, after the queues (it holds nothing)
    assert cell(browser, "everyone", 1).lower() == "alias"
    assert "idle_queue" in cell(browser, "everyone", 0)

    for i in range(4):
        assert c.set("orders", f"more{i}") == b"STORED"
    wait_until(lambda: cell(browser, "orders", ITEMS) == "5", what="items after 4 sets")
    wait_until(lambda: cell(browser, "orders+audit", ITEMS) == "7", what="the reader's items")
    assert c.get("orders+audit") == b"order0"
    assert c.get("orders+audit") == b"order1"
    wait_until(lambda: cell(browser, "orders+audit", ITEMS) == "5", what="items after 2 gets")
    waiter = Conn(proc.connect())
    waiter.send("get idle_queue/t=30000\r\n")
    wait_until(lambda: cell(browser, "idle_queue", WAITERS) == "1", what="a waiter")
    latency = wait_until(
        lambda: "–" not in cell(browser, "orders+audit", 9) and cell(browser, "orders+audit", 9),
        what="delivery latency of the reader",
    )
    p50, p99 = latency.split(" / ")
    assert p50.endswith((" ms", " s")) and p99.endswith((" ms", " s"))

    # no asset from another host, no script error
    resources = browser.execute_script(
        "return performance.getEntriesByType('resource').map(e => e.name)"
    )
    origin = page_url(proc).rstrip("/")
    assert resources and all(r.startswith(origin) for r in resources), resources
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    fits = browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth + 1"
    )
    assert fits, "the page is wider than 1280 px"
    browser.save_screenshot(str(shots / "admin-page-1280.png"))

    browser.set_window_size(390, 844)  # a phone
    time.sleep(2.5)  # a refresh at the new size
    fits = browser.execute_script(
        "return document.documentElement.scrollWidth <= window.innerWidth + 1"
    )
    assert fits, "the page scrolls sideways on a phone"
    assert browser.find_element(By.CSS_SELECTOR, 'tr[data-name="orders"]').is_displayed()
    browser.save_screenshot(str(shots / "admin-page-phone.png"))
    waiter.close()
    c.close()


def test_the_page_works_with_the_server_offline_and_back(make_server, browser):
    proc = make_server("admin_port = 0\n")
    url = page_url(proc)
    browser.get(url)
    wait_until(lambda: browser.find_element(By.ID, "status").text == "UP", what="status")
    assert browser.find_element(By.ID, "empty").is_displayed()  # no queue yet
    proc.stop()
    wait_until(lambda: browser.find_element(By.ID, "offline").is_displayed(), what="offline notice")
