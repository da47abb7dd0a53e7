"""Fixtures of the dashboard's tests: a served fake source, a plain HTTP client, Chromium.

These tests run in the ``dashboard`` tox env (see tests/conftest.py), which installs
Chromium and its driver: there, a missing browser fails the tests instead of skipping them.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fiberexec._dashboard import Dashboard, start
from tests.dashboard.fakes import FakeSource

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
ARTIFACTS_ENV = "FIBEREXEC_DASHBOARD_ARTIFACTS"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def request(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
            context: ssl.SSLContext | None = None) -> Reply:
    """One HTTP request; an error status is a reply, not an exception."""
    req = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            return Reply(r.status, dict(r.headers), r.read())
    except urllib.error.HTTPError as exc:
        with exc:
            return Reply(exc.code, dict(exc.headers), exc.read())


@dataclass
class Served:
    """A dashboard serving ``source``: ``url(path)`` adds the token, ``bare(path)`` does not."""

    source: FakeSource
    dashboard: Dashboard

    @property
    def token(self) -> str:
        return urllib.parse.parse_qs(urllib.parse.urlsplit(self.dashboard.url).query)["token"][0]

    def bare(self, path: str = "/") -> str:
        parts = urllib.parse.urlsplit(self.dashboard.url)
        return f"{parts.scheme}://{parts.netloc}{path}"

    def url(self, path: str = "/") -> str:
        joiner = "&" if "?" in path else "?"
        return f"{self.bare(path)}{joiner}token={self.token}"


@pytest.fixture
def served() -> Iterator[Served]:
    source = FakeSource()
    dashboard = start("127.0.0.1:0", source, None)
    try:
        yield Served(source, dashboard)
    finally:
        dashboard.stop()


@pytest.fixture(scope="session")
def artifacts(
    tmp_path_factory: pytest.TempPathFactory, pytestconfig: pytest.Config
) -> Path:
    """Where screenshots go: ``$FIBEREXEC_DASHBOARD_ARTIFACTS``, else under pytest's tmp."""
    named = os.environ.get(ARTIFACTS_ENV)
    path = Path(named) if named else tmp_path_factory.mktemp("dashboard-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    capture = pytestconfig.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(f"\ndashboard screenshots: {path} (set {ARTIFACTS_ENV} to choose)")
    return path


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium driven by Debian's chromedriver; nothing is downloaded."""
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if shutil.which(p) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the browser tests need Debian's "
                    "chromium and chromium-driver (bash scripts/chromium.sh installs them)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1400,1100", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    driver.set_page_load_timeout(30)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


# Resolves once `check()` is true: checked now and at each change of the page (a
# MutationObserver), so nothing polls; false after the timeout.
_UNTIL = """
const [source, timeout, done] = arguments;
const check = new Function(source);
let timer = null;
const observer = new MutationObserver(() => { if (check()) finish(true); });
function finish(ok) { observer.disconnect(); clearTimeout(timer); done(ok); }
if (check()) { done(true); } else {
  observer.observe(document, {subtree: true, childList: true, characterData: true,
                              attributes: true});
  timer = setTimeout(() => finish(check()), timeout * 1000);
}
"""


def until(browser: Any, check: str, timeout: float = 30.0) -> None:
    """Wait until the JavaScript ``check`` (a function body returning a boolean) holds on the
    page; fail naming it after ``timeout`` seconds."""
    browser.set_script_timeout(timeout + 10)
    assert browser.execute_async_script(_UNTIL, check, timeout), (
        f"the page never showed: {check}")
