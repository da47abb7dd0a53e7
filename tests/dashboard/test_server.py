"""The dashboard's server over real HTTP, against an in-memory source: the token guards every
request, the JSON is what the source holds, and stopping leaves nothing behind."""

from __future__ import annotations

import base64
import hashlib
import http.client
import logging
import re
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from fiberexec import ConfigurationError, TLSOptions
from fiberexec._dashboard import split, start
from fiberexec._dashboard.server import HEADERS
from tests.behaviour.test_tls import _certificate
from tests.dashboard.conftest import Reply, Served, request
from tests.dashboard.fakes import FakeSource, busy_source, span, worker

PATHS = [("GET", "/"), ("GET", "/api/state"), ("GET", "/metrics"),
         ("POST", "/api/workers/w0/stack"), ("GET", "/no/such/page")]


@pytest.mark.parametrize(("method", "path"), PATHS)
def test_every_request_without_the_token_is_refused(
    served: Served, method: str, path: str
) -> None:
    served.source.stacks["w0"] = "a stack"
    assert request(served.bare(path), method=method).status == 403
    wrong = "x" * len(served.token)
    assert request(served.bare(path) + f"?token={wrong}", method=method).status == 403
    assert request(served.bare(path), method=method,
                   headers={"Authorization": f"Bearer {wrong}"}).status == 403
    assert request(served.bare(path), method=method,
                   headers={"Authorization": f"Basic {served.token}"}).status == 403


@pytest.mark.parametrize(("method", "path"), PATHS[:4])
def test_the_token_opens_every_path_by_bearer_header(
    served: Served, method: str, path: str
) -> None:
    served.source.stacks["w0"] = "a stack"
    reply = request(served.bare(path), method=method,
                    headers={"Authorization": f"Bearer {served.token}"})
    assert reply.status == 200
    assert reply.headers["Cache-Control"] == "no-store"
    assert reply.headers["Referrer-Policy"] == "no-referrer"


@pytest.mark.parametrize("path", [path for method, path in PATHS[:4] if method == "GET"])
def test_the_token_in_the_address_opens_what_only_reads(served: Served, path: str) -> None:
    assert request(served.url(path)).status == 200
    assert request(served.url(path), method="HEAD").status == 200


def test_a_post_with_the_token_only_in_the_address_is_refused(served: Served) -> None:
    """Another site can make a browser send a form (with the token in its address, had it
    leaked), never an Authorization header: a stack dump needs the header."""
    served.source.stacks["w0"] = "a stack"
    reply = request(served.url("/api/workers/w0/stack"), method="POST")
    assert reply.status == 403
    assert b"needs the token in an 'Authorization: Bearer <token>' header" in reply.body


def test_an_unknown_path_with_the_token_is_not_found(served: Served) -> None:
    assert request(served.url("/no/such/page")).status == 404
    assert request(served.url("/api/workers/w0/stack")).status == 405  # a dump is a POST


def test_refusals_and_errors_carry_the_same_headers(served: Served) -> None:
    """Never cached, never framed: every response, not only those that succeed."""
    for reply in (request(served.bare("/metrics")),  # no token: 403
                  request(served.url("/no/such/page")),  # 404
                  request(served.url("/api/workers/w0/stack"))):  # 405
        assert reply.status in (403, 404, 405)
        for name, value in HEADERS.items():
            assert reply.headers[name] == value, (reply.status, name)


def test_the_page_allows_exactly_its_own_script_and_style(served: Served) -> None:
    reply = request(served.url("/"))
    html = reply.body.decode()
    policy = reply.headers["Content-Security-Policy"]
    script = re.search(r"<script>(.*)</script>", html, re.S)
    style = re.search(r"<style>(.*)</style>", html, re.S)
    assert script and style and "/*SCRIPT*/" not in html
    for text, directive in ((script[1], "script-src"), (style[1], "style-src")):
        digest = base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()
        assert f"{directive} 'sha256-{digest}';" in policy
    assert "default-src 'none'" in policy and "connect-src 'self'" in policy


def test_state_carries_workers_spans_failures_and_stats(served: Served) -> None:
    now = time.time()
    served.source.worker_list = [worker(0, "running", function="simulate", now=now),
                                 worker(1, "idle", now=now)]
    served.source.spans = [span(i, "w1", "simulate", now - 10 + i) for i in range(5)]
    served.source.failure_list = busy_source(2, now).failure_list
    state = request(served.url(f"/api/state?since={now - 7.5}")).json()
    workers = _objects(state["columns"]["workers"], state["workers"])
    assert [w["id"] for w in workers] == ["w0", "w1"]
    running = workers[0]
    task = dict(zip(state["columns"]["task"], running["task"], strict=True))
    assert running["state"] == "running" and task["function"] == "simulate"
    assert task["arguments"] == "0" and running["rss"] == 50 << 20
    assert task["started"] == round(now, 3) and running["heard"] == round(now - 0.2, 3)
    assert workers[1]["task"] is None
    assert served.source.asked_since[-1] == pytest.approx(now - 7.5)
    spans = _objects(state["columns"]["spans"], state["spans"])
    assert [(s["task"], s["worker"], s["ok"]) for s in spans] == [(3, "w1", True), (4, "w1", True)]
    assert state["failures"][0]["traceback"].startswith("Traceback")
    assert state["stats"]["workers"] == 0 and abs(state["now"] - time.time()) < 60


def test_a_huge_stream_is_cut_to_the_newest_spans(served: Served) -> None:
    from fiberexec._dashboard.source import MAX_SPANS

    now = time.time()
    served.source.spans = [span(i, "w0", "f", now - 1 + i * 1e-6) for i in range(MAX_SPANS + 7)]
    state = request(served.url("/api/state")).json()
    assert len(state["spans"]) == MAX_SPANS and state["spans_left_out"] is True
    assert state["spans"][-1][0] == MAX_SPANS + 6  # the newest kept


def _objects(columns: list[str], rows: list[list[Any]]) -> list[dict[str, Any]]:
    return [dict(zip(columns, row, strict=True)) for row in rows]


def test_since_must_be_a_number(served: Served) -> None:
    reply = request(served.url("/api/state?since=yesterday"))
    assert reply.status == 400 and b"'yesterday'" in reply.body


def test_stack_dump_answers_with_the_workers_stack_or_says_why_not(served: Served) -> None:
    served.source.stacks["w3"] = 'File "job.py", line 7, in blocked_here'
    bearer = {"Authorization": f"Bearer {served.token}"}

    def dump(worker: str) -> Reply:
        return request(served.bare(f"/api/workers/{worker}/stack"), method="POST",
                       headers=bearer)

    reply = dump("w3")
    assert reply.json() == {"worker": "w3", "stack": 'File "job.py", line 7, in blocked_here'}
    missing = dump("w9")
    assert missing.status == 404 and missing.body.decode() == "no worker 'w9' in this source"
    served.source.stack_error = TimeoutError("no answer within 5 s")
    reply = dump("w3")
    assert reply.status == 504 and b"no answer within 5 s" in reply.body
    served.source.stack_error = RuntimeError("worker w3 is idle")
    reply = dump("w3")
    assert reply.status == 409 and b"worker w3 is idle" in reply.body


@pytest.mark.parametrize("announce", [True, False])
def test_the_address_is_logged_and_printed_when_announced(
    announce: bool, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="fiberexec"):
        dashboard = start("127.0.0.1:0", FakeSource(), None, announce=announce)
    dashboard.stop()
    assert [r.getMessage() for r in caplog.records] == [f"dashboard at {dashboard.url}"]
    printed = capsys.readouterr().err
    assert printed == (f"fiberexec: dashboard at {dashboard.url}\n" if announce else "")


def _dashboard_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "fiberexec-dashboard"]


def test_stop_closes_the_port_and_ends_the_thread() -> None:
    dashboard = start("127.0.0.1:0", FakeSource(), None)
    host, port = split(dashboard.url.split("/")[2])
    client = http.client.HTTPConnection(host, port, timeout=10)  # keeps its connection open
    try:
        client.request("GET", "/" + dashboard.url.split("/")[3])
        assert client.getresponse().read().startswith(b"<!doctype html>")
        assert _dashboard_threads()
        dashboard.stop()
    finally:
        client.close()
    assert not _dashboard_threads()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, port), timeout=10).close()


def test_a_taken_port_is_an_error_naming_the_address_and_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigurationError, match=rf"cannot listen on {address}.*'on'"):
            start(address, FakeSource(), None)
    assert not _dashboard_threads()


def test_with_tls_it_serves_https_with_the_executors_certificate(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path, "executor")
    dashboard = start("127.0.0.1:0", FakeSource(), TLSOptions(cert, key))
    try:
        assert dashboard.url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        assert request(dashboard.url, context=trusted).status == 200
        plain = dashboard.url.replace("https://", "http://")
        with pytest.raises(ConnectionError):
            request(plain)
    finally:
        dashboard.stop()
