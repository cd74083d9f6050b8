"""The web console (`/ui/`) in a real headless Chromium, against a real eventbusd.

Each test starts its own eventbusd on free ports (its durable store in a temporary
directory, its addresses read from the `eventbusd started` line) and drives Debian's
`chromium` through `chromium-driver`. Nothing sleeps to synchronise: every wait is a
condition with a deadline (Selenium's WebDriverWait, or `eventually`). Screenshots go
to target/ui-screenshots/<page>.png.

    bash ui-tests/run.sh            # builds nothing: run `cargo build` first
"""

from __future__ import annotations

import http.server
import json
import os
import queue
import re
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[1]
EVENTBUSD = Path(os.environ.get("EVENTBUS_BIN", REPO / "target" / "debug" / "eventbusd"))
EVENTBUS = Path(os.environ.get("EVENTBUS_CLI", REPO / "target" / "debug" / "eventbus"))
SHOTS = Path(os.environ.get("UI_SCREENSHOTS", REPO / "target" / "ui-screenshots"))
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")
TIMEOUT = 20.0
ANSI = re.compile(r"\x1b\[[0-9;]*m")


# --- the broker ---


class Broker:
    """One eventbusd; `http` is its HTTP base URL."""

    def __init__(self, workdir: Path, env: Optional[Dict[str, str]] = None) -> None:
        self.workdir = workdir
        self.proc: Optional[subprocess.Popen[str]] = None
        self.http = ""
        self.grpc = ""
        self.token = ""  # sent by `api` unless told otherwise
        clean = {k: v for k, v in os.environ.items() if not k.startswith("EVENTBUS__") and k != "RUST_LOG"}
        clean.update({"EVENTBUS__DURABLE__DATA_DIR": str(workdir / "data"), "NO_COLOR": "1"})
        clean.update(env or {})
        self.env = clean

    def start(self) -> "Broker":
        if not EVENTBUSD.exists():
            pytest.fail(f"{EVENTBUSD} not found: cargo build -p eventbus-server --bin eventbusd")
        log = open(self.workdir / "eventbusd.log", "w")
        self.proc = subprocess.Popen(
            [str(EVENTBUSD), "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"],
            cwd=self.workdir, env=self.env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )
        lines: "queue.Queue[Optional[str]]" = queue.Queue()

        def pump() -> None:  # drains the pipe for the daemon's whole life
            assert self.proc is not None and self.proc.stdout is not None
            for line in self.proc.stdout:
                log.write(line)
                log.flush()
                lines.put(line)
            lines.put(None)
            log.close()

        threading.Thread(target=pump, daemon=True).start()
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                pytest.fail(f"eventbusd did not start within {TIMEOUT}s")
            if line is None:
                pytest.fail("eventbusd exited before starting: " + (self.workdir / "eventbusd.log").read_text())
            line = ANSI.sub("", line)
            if "eventbusd started" in line:
                grpc = re.search(r'grpc_addr="?([^\s"]+)', line)
                http = re.search(r'http_addr="?([^\s"]+)', line)
                assert grpc and http, line
                self.grpc, self.http = grpc.group(1), "http://" + http.group(1)
                return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def request(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> Tuple[int, Any, Any]:
        """(status, JSON body or None, headers)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.http + path, data=data, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        token = self.token if token is None else token
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
                raw, status, headers = r.read(), r.status, r.headers
        except urllib.error.HTTPError as e:
            raw, status, headers = e.read(), e.code, e.headers
        try:
            parsed = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        return status, parsed, headers

    def api(self, method: str, path: str, body: Any = None, token: Optional[str] = None) -> Any:
        status, parsed, _ = self.request(method, path, body, token)
        assert 200 <= status < 300, f"{method} {path}: {status} {parsed}"
        return parsed

    def publish(self, channel: str, payload: Any) -> str:
        return self.api("POST", "/admin/eventbus/publish", {"channel": channel, "payload": payload})["event_id"]

    def consumer(self, name: str) -> Dict[str, Any]:
        return self.api("GET", f"/admin/eventbus/consumers/{name}")


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    # The push endpoints of these tests listen on 127.0.0.1, which push.deny_networks
    # refuses by default: the broker opts in, as local development does.
    b = Broker(tmp_path, {"EVENTBUS__PUSH__ALLOW_NETWORKS": "127.0.0.0/8"}).start()
    yield b
    b.stop()


def eventually(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Polls `check` until it returns something truthy, or fails after `timeout`."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what} (last: {last!r})")


# --- the browser ---


@pytest.fixture(scope="session")
def chrome() -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} missing: apt-get install chromium chromium-driver")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,900",
                "--disable-gpu", "--no-first-run", "--disable-extensions", "--disable-background-networking",
                "--force-color-profile=srgb", "--lang=en-US"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(TIMEOUT)
    yield driver
    driver.quit()


@pytest.fixture
def browser(chrome: WebDriver) -> Iterator[WebDriver]:
    """The shared Chromium, its console log checked after each test: no script error and
    no Content-Security-Policy violation."""
    chrome.get_log("browser")  # drop what earlier tests left
    yield chrome
    problems = [e["message"] for e in chrome.get_log("browser") if e["level"] == "SEVERE"
                or "Content Security Policy" in e["message"]]
    # Refusals the tests provoke (a wrong token, a right the principal lacks) are logged
    # by Chromium as failed loads; the page shows them in its banner, which tests check.
    problems = [m for m in problems if "Failed to load resource" not in m and "net::ERR_ABORTED" not in m]
    chrome.get("about:blank")  # ends this test's streams before its broker stops
    assert not problems, problems


def wait(driver: WebDriver, what: str, condition: Callable[[WebDriver], Any], timeout: float = TIMEOUT) -> Any:
    def guarded(d: WebDriver) -> Any:
        try:
            return condition(d)
        except StaleElementReferenceException:  # a poll re-rendered the table: look again
            return False

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(guarded, f"timed out waiting for {what}")


def by_id(driver: WebDriver, id_: str) -> WebElement:
    return driver.find_element(By.ID, id_)


def text(driver: WebDriver, id_: str) -> str:
    return by_id(driver, id_).text.strip()


def visible(driver: WebDriver, id_: str) -> bool:
    found = driver.find_elements(By.ID, id_)
    return bool(found) and found[0].is_displayed()


def number(s: str) -> Optional[float]:
    s = s.replace(",", "").strip()
    try:
        return float(s)
    except ValueError:
        return None


def row(driver: WebDriver, test: str, **data: str) -> Optional[WebElement]:
    selector = f'[data-test="{test}"]' + "".join(f'[data-{k.replace("_", "-")}="{v}"]' for k, v in data.items())
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found and found[0].is_displayed() else None


def field(tr: WebElement, name: str) -> str:
    return tr.find_element(By.CSS_SELECTOR, f'[data-field="{name}"]').text.strip()


def shot(driver: WebDriver, page: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(SHOTS / f"{page}.png"))


def full_shot(driver: WebDriver, page: str) -> None:
    """A screenshot of the whole page, not only the window's height."""
    width, height = driver.get_window_size()["width"], driver.get_window_size()["height"]
    inner = driver.execute_script("return window.innerHeight")
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(width, height - inner + full)
    try:
        shot(driver, page)
    finally:
        driver.set_window_size(width, height)


def pills(tr: WebElement) -> Dict[str, str]:
    """The status pills of a consumer row: warning key (or "ok") -> text."""
    cell = tr.find_element(By.CSS_SELECTOR, '[data-field="status"]')
    return {(p.get_attribute("data-warning") or p.get_attribute("data-state") or ""): p.text.strip()
            for p in cell.find_elements(By.CSS_SELECTOR, ".pill")}


def no_error_banner(driver: WebDriver) -> None:
    banner = by_id(driver, "banner")
    if banner.is_displayed():
        assert banner.get_attribute("data-kind") == "info", f"error banner: {text(driver, 'banner-text')}"


def confirm(driver: WebDriver, button: WebElement, expected: str) -> None:
    """Clicks `button`, checks the in-page dialog asks about `expected`, confirms."""
    button.click()
    wait(driver, "the confirmation dialog", lambda d: visible(d, "modal"))
    assert expected in text(driver, "modal-text")
    by_id(driver, "modal-confirm").click()
    wait(driver, "the dialog to close", lambda d: not visible(d, "modal"))


class Publisher(threading.Thread):
    """Publishes to `channel` every 50 ms until stopped (gives the overview its rates)."""

    def __init__(self, broker: Broker, channel: str) -> None:
        super().__init__(daemon=True)
        self.broker, self.channel, self.halt = broker, channel, threading.Event()

    def run(self) -> None:
        n = 0
        while not self.halt.wait(0.05):
            n += 1
            self.broker.publish(self.channel, {"n": n})


class SseSubscription:
    """A subscription held open by the test (GET /v1/subscribe), for the pages that list them."""

    def __init__(self, broker: Broker, pattern: str) -> None:
        req = urllib.request.Request(f"{broker.http}/v1/subscribe?channel={pattern}&name=ui-test-watcher")
        self.response = urllib.request.urlopen(req, timeout=TIMEOUT)
        first = self.response.readline().decode()
        assert first.startswith("event: started"), first

    def close(self) -> None:
        self.response.close()


# --- the tests ---


def test_console_loads_and_shows_the_broker(broker: Broker, browser: WebDriver) -> None:
    # The files: their types and the console's headers.
    for path, content_type in [("/ui/", "text/html"), ("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")]:
        req = urllib.request.Request(broker.http + path)
        with urllib.request.urlopen(req, timeout=TIMEOUT) as r:
            assert r.headers["content-type"].startswith(content_type), path
            assert r.headers["content-security-policy"].startswith("default-src 'self'"), path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["cache-control"] == "no-cache", path
    broker.publish("orders.created", {"id": 1})
    broker.publish("orders.shipped", {"id": 1})
    watcher = SseSubscription(broker, "orders.%3E")
    publisher = Publisher(broker, "orders.created")
    publisher.start()
    try:
        browser.get(broker.http + "/ui")
        assert browser.current_url.endswith("/ui/#/overview"), browser.current_url  # 308 to /ui/
        wait(browser, "the overview", lambda d: visible(d, "page-overview"))
        assert text(browser, "whoami") == "authentication off"
        assert not visible(browser, "logout") and not visible(browser, "page-login")
        wait(browser, "published >= 2", lambda d: (number(text(d, "stat-published")) or 0) >= 2)
        wait(browser, "health", lambda d: text(d, "health") == "ready")
        wait(browser, "a publish rate", lambda d: (number(text(d, "rate-published")) or 0) > 0)
        assert number(text(browser, "stat-channels")) >= 2
        assert number(text(browser, "stat-subscriptions")) >= 1
        wait(browser, "the subscription on the overview", lambda d: row(d, "overview-subscription-row"))
        # A few points on the rate chart, for the picture.
        wait(browser, "4 points on the chart", lambda d: int(by_id(d, "rate-chart").get_attribute("data-points") or 0) >= 4)
        no_error_banner(browser)
        shot(browser, "overview")

        by_id(browser, "nav-channels").click()
        wait(browser, "the channels page", lambda d: visible(d, "page-channels"))
        created = wait(browser, "orders.created", lambda d: row(d, "channel-row", channel="orders.created"))
        assert (number(field(created, "published")) or 0) >= 1
        assert row(browser, "channel-row", channel="orders.shipped")
        assert browser.current_url.endswith("#/channels")
        shot(browser, "channels")

        by_id(browser, "nav-subscriptions").click()
        wait(browser, "the subscriptions page", lambda d: visible(d, "page-subscriptions"))
        sub = wait(browser, "the watcher's subscription", lambda d: row(d, "subscription-row"))
        assert "ui-test-watcher" in sub.text and "orders.>" in sub.text
        no_error_banner(browser)
        shot(browser, "subscriptions")
    finally:
        publisher.halt.set()
        publisher.join(timeout=TIMEOUT)
        watcher.close()


def test_close_a_subscription_from_the_subscriptions_page(broker: Broker, browser: WebDriver) -> None:
    watcher = SseSubscription(broker, "audit.%3E")
    try:
        browser.get(broker.http + "/ui/#/subscriptions")
        tr = wait(browser, "the watcher's subscription", lambda d: row(d, "subscription-row"))
        sub_id = tr.get_attribute("data-id")
        button = tr.find_element(By.CSS_SELECTOR, '[data-test="subscription-close"]')
        # Cancel changes nothing.
        button.click()
        wait(browser, "the confirmation dialog", lambda d: visible(d, "modal"))
        assert "ui-test-watcher" in text(browser, "modal-text") and "audit.>" in text(browser, "modal-text")
        by_id(browser, "modal-cancel").click()
        wait(browser, "the dialog to close", lambda d: not visible(d, "modal"))
        assert [s["id"] for s in broker.api("GET", "/admin/eventbus/subscriptions")["subscriptions"]] == [sub_id]

        confirm(browser, button, sub_id)
        wait(browser, "the answer", lambda d: visible(d, "banner") and "closed" in text(d, "banner-text"))
        wait(browser, "the row to go", lambda d: row(d, "subscription-row") is None
             and "No active subscriptions" in text(d, "subscriptions-rows"))
        assert broker.api("GET", "/admin/eventbus/subscriptions")["subscriptions"] == []
        # The subscriber's stream was ended by the broker, not left hanging.
        rest = watcher.response.read().decode()
        assert "event: end" in rest, rest
        no_error_banner(browser)
    finally:
        watcher.close()


def test_live_tail_shows_published_events(broker: Broker, browser: WebDriver) -> None:
    browser.get(broker.http + "/ui/#/tail")
    wait(browser, "the tail page", lambda d: visible(d, "page-tail"))
    pattern = by_id(browser, "tail-pattern")
    pattern.clear()
    pattern.send_keys("orders.>")
    by_id(browser, "tail-start").click()
    wait(browser, "the stream to start", lambda d: text(d, "tail-status") == "live")
    first = broker.publish("orders.created", {"order": 41, "total": "12.50"})
    broker.publish("payments.settled", {"ignored": True})  # outside the pattern
    second = broker.publish("orders.shipped", {"order": 41, "carrier": "post"})
    wait(browser, "the second event", lambda d: row(d, "tail-row", event_id=second))
    rows = browser.find_elements(By.CSS_SELECTOR, '[data-test="tail-row"]')
    assert [r.get_attribute("data-event-id") for r in rows] == [second, first], "newest first"
    assert '"carrier":"post"' in field(rows[0], "payload")
    assert rows[1].get_attribute("data-channel") == "orders.created"
    # The id's last 8 characters (the random part of a UUIDv7), the whole id on hover.
    shown = rows[0].find_element(By.CSS_SELECTOR, '[data-field="id"]')
    assert shown.text.strip() == "…" + second[-8:] and shown.get_attribute("title") == second
    # The source is the publisher's host, not its connection's ephemeral port.
    source = rows[0].find_element(By.CSS_SELECTOR, '[data-field="source"]')
    assert source.text.strip() == "127.0.0.1", source.text
    assert re.fullmatch(r"127\.0\.0\.1:\d+", source.get_attribute("title") or ""), source.get_attribute("title")
    assert text(browser, "tail-count") == "2"
    no_error_banner(browser)
    shot(browser, "tail")
    by_id(browser, "tail-stop").click()
    wait(browser, "the stream to stop", lambda d: text(d, "tail-status") == "stopped")
    assert by_id(browser, "tail-start").is_enabled()


def test_pause_and_resume_a_consumer(broker: Broker, browser: WebDriver) -> None:
    broker.api("POST", "/admin/eventbus/consumers", {"name": "billing-invoices", "channels": ["orders.>"]})
    broker.api("POST", "/admin/eventbus/consumers", {"name": "shipping-labels", "channels": ["orders.shipped"]})
    for n in range(3):
        broker.publish("orders.created", {"order": n})
    eventually("3 pending", lambda: broker.consumer("billing-invoices")["pending"] == 3)

    browser.get(broker.http + "/ui/#/consumers")
    wait(browser, "the consumers page", lambda d: visible(d, "page-consumers"))
    tr = wait(browser, "the consumer's row", lambda d: row(d, "consumer-row", name="billing-invoices"))
    wait(browser, "3 pending", lambda d: field(row(d, "consumer-row", name="billing-invoices"), "pending") == "3")
    tr = row(browser, "consumer-row", name="billing-invoices")
    # 3 pending and nobody attached: a warning, not a green "running".
    assert pills(tr) == {"no-client": "3 pending, no client attached"}, pills(tr)
    assert re.fullmatch(r"\d+ s", field(tr, "oldest")), field(tr, "oldest")
    idle = row(browser, "consumer-row", name="shipping-labels")
    assert idle and pills(idle) == {"ok": "running"} and field(idle, "oldest") == "–"
    shot(browser, "consumers")

    tr.find_element(By.CSS_SELECTOR, '[data-test="consumer-link"]').click()
    wait(browser, "the consumer page", lambda d: visible(d, "page-consumer") and visible(d, "consumer-pause"))
    assert text(browser, "consumer-name") == "billing-invoices"
    wait(browser, "its pending events", lambda d: len(d.find_elements(By.CSS_SELECTOR, '[data-test="pending-row"]')) == 3)
    assert "no client attached" in text(browser, "consumer-warnings")

    # Cancel changes nothing.
    by_id(browser, "consumer-pause").click()
    wait(browser, "the confirmation dialog", lambda d: visible(d, "modal"))
    assert "billing-invoices" in text(browser, "modal-text")
    by_id(browser, "modal-cancel").click()
    wait(browser, "the dialog to close", lambda d: not visible(d, "modal"))
    assert broker.consumer("billing-invoices")["paused"] is False

    confirm(browser, by_id(browser, "consumer-pause"), "Pause consumer")
    wait(browser, "paused", lambda d: text(d, "consumer-state") == "paused" and visible(d, "consumer-resume"))
    assert broker.consumer("billing-invoices")["paused"] is True
    assert not visible(browser, "consumer-pause")
    shot(browser, "consumer")
    by_id(browser, "consumer-back").click()
    wait(browser, "paused in the list", lambda d: "paused" in pills(row(d, "consumer-row", name="billing-invoices")))
    row(browser, "consumer-row", name="billing-invoices").find_element(
        By.CSS_SELECTOR, '[data-test="consumer-link"]').click()
    wait(browser, "the consumer page", lambda d: visible(d, "consumer-resume"))

    confirm(browser, by_id(browser, "consumer-resume"), "Resume consumer")
    wait(browser, "running", lambda d: text(d, "consumer-state") == "running" and visible(d, "consumer-pause"))
    assert broker.consumer("billing-invoices")["paused"] is False
    no_error_banner(browser)


class Refuse(http.server.BaseHTTPRequestHandler):
    """A push endpoint that answers every event 404: the broker dead-letters at once."""

    def do_POST(self) -> None:  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_redrive_a_dead_letter(broker: Broker, browser: WebDriver) -> None:
    endpoint = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{endpoint.server_address[1]}/"
        broker.api("POST", "/admin/eventbus/consumers",
                   {"name": "billing-push", "channels": ["payments.>"], "max_attempts": 1, "push": {"url": url}})
        event = broker.publish("payments.settled", {"invoice": 7})
        eventually("a dead letter", lambda: (lambda c: c["dead_lettered"] == 1 and c["redrivable"] == 1)(
            broker.consumer("billing-push")))

        browser.get(broker.http + "/ui/#/consumers/billing-push")
        wait(browser, "the consumer page", lambda d: visible(d, "page-consumer"))
        tr = wait(browser, "the dead letter", lambda d: row(d, "deadletter-row", event_id=event))
        assert "payments.settled" in tr.text and "404" in tr.text
        wait(browser, "redrivable 1", lambda d: text(d, "consumer-redrivable") == "1")
        assert visible(browser, "deadletters-redrive-all")
        shot(browser, "deadletters")

        button = tr.find_element(By.CSS_SELECTOR, '[data-test="redrive"]')
        assert button.get_attribute("data-event-id") == event
        confirm(browser, button, event)
        wait(browser, "the redrive's answer", lambda d: visible(d, "banner") and "Redriven 1" in text(d, "banner-text"))
        assert broker.consumer("billing-push")["redriven"] == 1
        no_error_banner(browser)
    finally:
        endpoint.shutdown()
        endpoint.server_close()


class PoisonOrBusy(http.server.BaseHTTPRequestHandler):
    """A push endpoint that refuses a "poison" event for good (404: dead-lettered at
    once) and answers the others 503 with Retry-After: 600 (they stay pending)."""

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(404 if b"poison" in body else 503)
        self.send_header("retry-after", "600")
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_overview_and_consumer_list_show_backlogs_and_dead_letters(broker: Broker, browser: WebDriver) -> None:
    endpoint = http.server.ThreadingHTTPServer(("127.0.0.1", 0), PoisonOrBusy)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    publisher = Publisher(broker, "clicks.page")
    try:
        url = f"http://127.0.0.1:{endpoint.server_address[1]}/"
        # A pull consumer nobody works, a push consumer with a backlog and a dead letter,
        # and one with nothing to do.
        broker.api("POST", "/admin/eventbus/consumers", {"name": "billing-invoices", "channels": ["orders.>"]})
        broker.api("POST", "/admin/eventbus/consumers", {"name": "payments-webhook", "channels": ["payments.>"],
                                                          "push": {"url": url}})
        broker.api("POST", "/admin/eventbus/consumers", {"name": "shipping-labels", "channels": ["shipping.>"]})
        for n in range(4):
            broker.publish("orders.created", {"order": n})
        broker.publish("payments.settled", {"invoice": "poison"})
        for n in range(2):
            broker.publish("payments.settled", {"invoice": n})
        eventually("the push consumer's dead letter and backlog", lambda: (lambda c: c["redrivable"] == 1 and c["pending"] == 2)(
            broker.consumer("payments-webhook")))
        publisher.start()  # live traffic nobody subscribes to: published, not delivered

        browser.get(broker.http + "/ui/#/overview")
        wait(browser, "the overview", lambda d: visible(d, "page-overview"))
        wait(browser, "the durable backlog", lambda d: text(d, "stat-backlog") == "6")
        detail = text(browser, "stat-backlog-detail")
        assert "3 consumers" in detail and "1 with no client attached" in detail and "1 dead letter" in detail, detail
        assert by_id(browser, "stat-backlog").get_attribute("data-state") == "warn"
        billing = wait(browser, "the unattended consumer", lambda d: row(d, "overview-consumer-row", name="billing-invoices"))
        assert pills(billing) == {"no-client": "4 pending, no client attached"}, pills(billing)
        webhook = row(browser, "overview-consumer-row", name="payments-webhook")
        assert webhook and pills(webhook) == {"dead-letters": "1 dead letter"}, pills(webhook)
        assert field(webhook, "redrivable") == "1" and re.fullmatch(r"\d+ s", field(webhook, "oldest"))
        assert pills(row(browser, "overview-consumer-row", name="shipping-labels")) == {"ok": "running"}

        # Published and delivered differ; the page says why.
        wait(browser, "published > delivered", lambda d: (number(text(d, "stat-published")) or 0) > (number(text(d, "stat-delivered")) or 0) + 7)
        explained = text(browser, "delivery-explained")
        assert "delivered to nobody" in explained and "not a loss" in explained, explained
        assert "copies to live subscriptions" in by_id(browser, "page-overview").text
        # The rate chart's axes: events per second against time.
        chart = by_id(browser, "rate-chart")
        wait(browser, "4 points on the chart", lambda d: int(by_id(d, "rate-chart").get_attribute("data-points") or 0) >= 4)
        assert chart.get_attribute("data-y-unit") == "events/s"
        assert chart.get_attribute("data-x-ticks") == "−2 min,−90 s,−1 min,−30 s,now"
        y_ticks = chart.get_attribute("data-y-ticks").split(",")
        assert y_ticks[0] == "0" and number(y_ticks[-1]) >= number(text(browser, "rate-published")), y_ticks
        assert "events per second" in text(browser, "rate-chart-caption")
        assert "events per second" in chart.get_attribute("aria-label")
        no_error_banner(browser)
        full_shot(browser, "overview-backlog")

        by_id(browser, "nav-consumers").click()
        wait(browser, "the consumers page", lambda d: visible(d, "page-consumers"))
        webhook = wait(browser, "the push consumer", lambda d: row(d, "consumer-row", name="payments-webhook"))
        assert pills(webhook) == {"dead-letters": "1 dead letter"}, pills(webhook)
        redrivable = webhook.find_element(By.CSS_SELECTOR, '[data-field="redrivable"]')
        assert redrivable.text == "1" and redrivable.get_attribute("data-state") == "warn"
        assert field(webhook, "pending") == "2" and re.fullmatch(r"\d+ s", field(webhook, "oldest"))
        billing = row(browser, "consumer-row", name="billing-invoices")
        assert pills(billing) == {"no-client": "4 pending, no client attached"}, pills(billing)
        assert pills(row(browser, "consumer-row", name="shipping-labels")) == {"ok": "running"}
        no_error_banner(browser)
        shot(browser, "consumers-backlog")
    finally:
        publisher.halt.set()
        publisher.join(timeout=TIMEOUT)
        endpoint.shutdown()
        endpoint.server_close()


def new_token(name: str) -> Tuple[str, str]:
    """(token, its SHA-256) from `eventbus auth new-token NAME`."""
    if not EVENTBUS.exists():
        pytest.fail(f"{EVENTBUS} not found: cargo build -p eventbus-cli --bin eventbus")
    out = subprocess.run([str(EVENTBUS), "auth", "new-token", name], check=True, capture_output=True,
                         text=True, timeout=TIMEOUT).stdout
    token = out.split()[0]
    digest = re.search(r"token_sha256:\s*([0-9a-f]{64})", out)
    assert token and digest, out
    return token, digest.group(1)


def sign_in(browser: WebDriver, token: str) -> None:
    wait(browser, "the login form", lambda d: visible(d, "login-token"))
    by_id(browser, "login-token").send_keys(token)
    by_id(browser, "login-submit").click()


def test_auth_login_and_rights(tmp_path: Path, browser: WebDriver) -> None:
    admin, admin_sha = new_token("ops")
    billing, billing_sha = new_token("billing")
    principals = tmp_path / "principals.yaml"
    principals.write_text(f"""principals:
  - name: ops
    token_sha256: {admin_sha}
    permissions:
      publish: {{ allow: [">"] }}
      subscribe: {{ allow: [">"] }}
      consumers: {{ allow: ["*"] }}
      manage_consumers: ["*"]
      admin: true
  - name: billing
    token_sha256: {billing_sha}
    permissions:
      consumers: {{ allow: ["billing*"] }}
""")
    # Session tokens last 2 s: the live tail must outlive its first one.
    broker = Broker(tmp_path, {"EVENTBUS__AUTH__ENABLED": "true",
                               "EVENTBUS__AUTH__PRINCIPALS_FILE": str(principals),
                               "EVENTBUS__AUTH__SESSION_TOKENS__TTL_MS": "2000"}).start()
    try:
        broker.token = admin
        broker.api("POST", "/admin/eventbus/consumers", {"name": "billing-invoices", "channels": ["orders.>"]})
        broker.api("POST", "/admin/eventbus/consumers", {"name": "shipping-labels", "channels": ["orders.>"]})
        assert broker.request("GET", "/v1/whoami", token="")[0] == 401

        browser.get(broker.http + "/ui/")
        wait(browser, "the login form", lambda d: visible(d, "page-login"))
        assert not visible(browser, "nav") and not visible(browser, "logout")
        shot(browser, "login")

        # A wrong token: refused, in the banner, still on the form.
        sign_in(browser, "ebt_" + "0" * 64)
        wait(browser, "the refusal", lambda d: visible(d, "banner") and "Sign-in refused" in text(d, "banner-text"))
        assert visible(browser, "page-login")

        sign_in(browser, admin)
        wait(browser, "the overview", lambda d: visible(d, "page-overview"))
        wait(browser, "stats", lambda d: number(text(d, "stat-published")) is not None)
        assert text(browser, "whoami") == "ops · admin"
        assert visible(browser, "nav-overview") and visible(browser, "logout")
        shot(browser, "overview-admin")

        # The live tail with a session token in the URL (EventSource sends no header).
        browser.get(broker.http + "/ui/#/tail?channel=orders.%3E")
        wait(browser, "the stream to start", lambda d: text(d, "tail-status") == "live")
        event = broker.publish("orders.created", {"order": 1})
        wait(browser, "the event in the tail", lambda d: row(d, "tail-row", event_id=event))
        # The token expires, the broker ends the stream, the page mints another and
        # reconnects from the last event.
        wait(browser, "a reconnection", lambda d: int(by_id(d, "tail-status").get_attribute("data-connections") or 0) >= 2)
        wait(browser, "live again", lambda d: text(d, "tail-status") == "live")
        later = broker.publish("orders.created", {"order": 2})
        wait(browser, "an event after the reconnection", lambda d: row(d, "tail-row", event_id=later))
        assert len(browser.find_elements(By.CSS_SELECTOR, '[data-test="tail-row"]')) == 2, "no repeats"
        no_error_banner(browser)
        by_id(browser, "tail-stop").click()

        by_id(browser, "logout").click()
        wait(browser, "the login form", lambda d: visible(d, "page-login"))
        assert browser.execute_script("return sessionStorage.length") == 0

        # Consumer rights only: Consumers (those it may read) and Live tail; no buttons.
        sign_in(browser, billing)
        wait(browser, "the consumers page", lambda d: visible(d, "page-consumers"))
        assert text(browser, "whoami") == "billing"
        assert not visible(browser, "nav-overview") and not visible(browser, "nav-channels")
        assert not visible(browser, "nav-subscriptions")
        assert visible(browser, "nav-consumers") and visible(browser, "nav-tail")
        wait(browser, "its consumer", lambda d: row(d, "consumer-row", name="billing-invoices"))
        assert row(browser, "consumer-row", name="shipping-labels") is None
        browser.execute_script("location.hash = '#/overview'")
        wait(browser, "sent back to consumers", lambda d: d.current_url.endswith("#/consumers"))
        assert not visible(browser, "page-overview")
        row(browser, "consumer-row", name="billing-invoices").find_element(
            By.CSS_SELECTOR, '[data-test="consumer-link"]').click()
        wait(browser, "the consumer page", lambda d: text(d, "consumer-state") == "running")
        assert not visible(browser, "consumer-pause") and not visible(browser, "consumer-resume")
        no_error_banner(browser)
        shot(browser, "consumer-readonly")
    finally:
        browser.get("about:blank")
        broker.stop()
