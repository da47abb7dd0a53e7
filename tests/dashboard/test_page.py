"""The dashboard in a real headless Chromium while a real executor runs real tasks: worker
rows with their states, a running task's function, a failure's remote traceback, the stack of
a blocked task, and 403 without the token. Screenshots go to the artifacts directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ExecutorFactory
from tests.dashboard import dashboard_tasks
from tests.dashboard.conftest import request, until
from tests.dashboard.gate import Gate

BLOCKED = "tests.dashboard.dashboard_tasks.wait_for_release"
STREAM = 500  # 20 ms tasks: seconds of work for two workers, while the page polls


def _text(selector: str) -> str:
    """JavaScript: the text of the first element ``selector`` finds, or ""."""
    return f"((document.querySelector({selector!r}) || {{}}).textContent || '')"


def test_the_page_shows_what_a_real_executor_is_doing(
    make_executor: ExecutorFactory, browser: Any, artifacts: Path
) -> None:
    from selenium.webdriver.common.by import By

    ex = make_executor(3, dashboard=True)
    with pytest.raises(ValueError, match="the model diverged"):
        ex.submit(dashboard_tasks.fail_with, "the model diverged").result(timeout=120)
    url = ex.dashboard_url
    assert url is not None
    bare = url.split("?")[0]
    assert request(bare).status == 403
    browser.get(bare)
    assert "403" in browser.find_element(By.TAG_NAME, "body").text

    with Gate() as gate:
        blocked = ex.submit(dashboard_tasks.wait_for_release, gate.port)
        gate.arrived()  # the task runs on its worker now
        stream = [ex.submit(dashboard_tasks.brief, 0.02) for _ in range(STREAM)]
        browser.get(url)
        until(browser, "return document.querySelectorAll('#workers tr[data-worker]').length"
                       " === 3")
        until(browser, f"return {_text('#workers tr.state-running td.task')}"
                       f".startsWith('{BLOCKED}(')")
        states = {row.get_attribute("data-worker"): row.find_element(
            By.CSS_SELECTOR, "td.state").text
            for row in browser.find_elements(By.CSS_SELECTOR, "#workers tr[data-worker]")}
        assert set(states) == {w.worker_id for w in ex.workers()}
        assert set(states.values()) <= {"starting", "idle", "running"}

        until(browser, f"return {_text('.failure pre.traceback')}.includes('fail_with')")
        failure = browser.find_element(By.CSS_SELECTOR, ".failure")
        assert "ValueError: the model diverged" in failure.text
        assert 'raise ValueError(message)' in failure.find_element(
            By.CSS_SELECTOR, "pre.traceback").text

        running = [row for row in browser.find_elements(By.CSS_SELECTOR, "#workers tr")
                   if BLOCKED in row.text]
        button = running[0].find_element(By.CSS_SELECTOR, "button.stack")
        # centred, so the sticky header cannot be on top of it when clicked
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
        button.click()
        until(browser, f"return {_text('#stack')}.includes('wait_for_release')")
        stack = browser.find_element(By.ID, "stack").text
        assert "conn.recv(1)" in stack or "recv" in stack, stack

        until(browser, "return window.fiberexecDashboard.refreshes() >= 4")  # plots have lines
        _whole_page(browser, artifacts / "dashboard.png")
        gate.release()
        assert blocked.result(timeout=60) == "released"
    assert [f.result(timeout=120) for f in stream] == [0.02] * STREAM


def _whole_page(browser: Any, path: Path) -> None:
    """A screenshot of the whole page, not only the window's height."""
    browser.execute_script("window.scrollTo(0, 0)")
    size = browser.get_window_size()
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(size["width"], height + 120)  # + the browser's own frame
    try:
        browser.save_screenshot(str(path))
    finally:
        browser.set_window_size(size["width"], size["height"])
