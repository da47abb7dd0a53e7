"""The dashboard's HTTP server: aiohttp on an event loop in a thread of its own.

    browser / Prometheus --HTTP(S)--> guard (token) --> page | /api/state | /api/.../stack
                                                         | /metrics
    handlers --(snapshots on the loop's thread; stack dumps in a worker thread)--> Source

Every request must carry the token, as ``?token=`` or ``Authorization: Bearer``; one that
does not is refused with 403 before any route is looked at. A request that changes anything
(a POST: a stack dump) must carry it in the header: a page of another site can make a browser
send a form, with the token in its address if it ever leaked, but not an ``Authorization``
header (that takes a CORS preflight, refused here). Snapshots (state, metrics) are
read on the loop's thread: they take milliseconds and never wait. A stack dump waits for its
worker, so it runs in another thread and never holds up another request.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import logging
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client.exposition import choose_encoder

from fiberexec._dashboard import metrics, page
from fiberexec._dashboard.source import Source, state

log = logging.getLogger("fiberexec")
STACK_TIMEOUT = 5.0  # seconds a stack dump may take the worker
SHUTDOWN_GRACE = 1.0  # seconds open requests get when the server stops
HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",  # the token is in the page's address
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
READ_ONLY = ("GET", "HEAD")  # methods that may carry the token in the address


async def _with_headers(_: web.Request, response: web.StreamResponse) -> None:
    response.headers.update(HEADERS)


class DashboardServer:
    """Serves the page, its JSON and ``/metrics`` for one `Source` until `stop`.

    Args:
        host, port: where to listen (port 0: any free port).
        token: what every request must present.
        ssl_context: serve HTTPS with it (None: HTTP).
    """

    def __init__(self, source: Source, *, host: str, port: int, token: str,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.source = source
        self.host, self.port = host, port
        self.token = token.encode()
        self.ssl_context = ssl_context
        self.page = page.load()
        self.registry = metrics.registry(source)
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None

    # ------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 10.0) -> int:
        """Listen; return the port. Raises `OSError` if it cannot listen there."""
        bound: concurrent.futures.Future[int] = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(bound,),
                                        name="fiberexec-dashboard", daemon=True)
        self._thread.start()
        try:
            self.port = bound.result(timeout)
        except BaseException:
            self.stop()
            raise
        return self.port

    def stop(self, timeout: float = 10.0) -> None:
        """Close the socket and every connection, and end the thread."""
        loop, stopping, thread = self._loop, self._stopping, self._thread
        if loop is not None and stopping is not None:
            try:
                loop.call_soon_threadsafe(stopping.set)
            except RuntimeError:  # the loop has already closed
                pass
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            if thread.is_alive():
                log.warning("the dashboard's thread did not end within %.0f s", timeout)

    def _run(self, bound: concurrent.futures.Future[int]) -> None:
        asyncio.run(self._serve(bound))

    async def _serve(self, bound: concurrent.futures.Future[int]) -> None:
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        runner = web.AppRunner(self._app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE)
        try:
            await runner.setup()
            site = web.TCPSite(runner, self.host, self.port, ssl_context=self.ssl_context)
            await site.start()
            bound.set_result(runner.addresses[0][1])
        except BaseException as exc:
            bound.set_exception(exc)
            await runner.cleanup()
            return
        await self._stopping.wait()
        await runner.cleanup()

    # ------------------------------------------------------------ the application

    def _app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app.on_response_prepare.append(_with_headers)  # every response: refusals, errors too
        app.router.add_get("/", self._page)
        app.router.add_get("/api/state", self._state)
        app.router.add_post("/api/workers/{worker_id}/stack", self._stack)
        app.router.add_get("/metrics", self._metrics)
        return app

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.authorized(request):
            return web.Response(status=403, text=_refusal(request))
        return await handler(request)

    def authorized(self, request: web.Request) -> bool:
        """The token in an ``Authorization: Bearer`` header; for a GET (or HEAD), which
        changes nothing, in ``?token=`` too."""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            if request.method not in READ_ONLY:
                return False
            given = request.query.get("token", "")
        return hmac.compare_digest(given.strip().encode(), self.token)

    async def _page(self, request: web.Request) -> web.Response:
        response = web.Response(body=self.page.html, content_type="text/html", charset="utf-8")
        response.headers["Content-Security-Policy"] = self.page.policy
        return response

    async def _state(self, request: web.Request) -> web.Response:
        try:
            since = float(request.query.get("since", "0"))
        except ValueError:
            raise web.HTTPBadRequest(text="since must be a number of seconds (a time.time() "
                                     f"value), got {request.query['since']!r}") from None
        # Read on the loop's own thread: a snapshot takes milliseconds and never waits, and a
        # hop to another thread would cost the executor's threads more switches of the GIL.
        body = _state_json(self.source, since)
        return web.Response(body=body, content_type="application/json")

    async def _stack(self, request: web.Request) -> web.Response:
        worker_id = request.match_info["worker_id"]
        try:
            text = await _off_loop(self.source.dump_stack, worker_id, STACK_TIMEOUT)
        except LookupError as exc:  # its message names the worker and those there are
            raise web.HTTPNotFound(text=str(exc.args[0]) if exc.args else
                                   f"no worker {worker_id!r}") from None
        except TimeoutError as exc:
            raise web.HTTPGatewayTimeout(text=f"worker {worker_id!r} did not answer: {exc}") \
                from None
        except Exception as exc:  # shown to the user who asked, as the page shows any error
            raise web.HTTPConflict(text=f"cannot dump worker {worker_id!r}'s stack: {exc}") \
                from None
        return web.json_response({"worker": worker_id, "stack": text})

    async def _metrics(self, request: web.Request) -> web.Response:
        # The format the scraper asks for (Accept): OpenMetrics, or Prometheus text 0.0.4
        encode, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encode(self.registry)  # as a snapshot: on the loop's thread
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response


def _refusal(request: web.Request) -> str:
    if request.method not in READ_ONLY and "token" in request.query:
        return (f"403 Forbidden: a {request.method} needs the token in an 'Authorization: "
                "Bearer <token>' header, not in the address (the page sends it so)\n")
    return ("403 Forbidden: this address needs its token (open the address "
            "FiberExecutor.dashboard_url gives)\n")


def _state_json(source: Source, since: float) -> bytes:
    return json.dumps(state(source, since, time.time()), separators=(",", ":")).encode()


async def _off_loop(fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(None, fn, *args)
