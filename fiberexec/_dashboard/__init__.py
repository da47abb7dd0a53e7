"""The opt-in web dashboard and Prometheus ``/metrics`` of one executor.

    FiberExecutor(dashboard=...)  --validate--> check_installed()         (in __init__)
    first use (the pool is made) --> start() --> DashboardServer thread   (listens)
                                                 its address: logged, and printed when the
                                                 environment or a file turned it on
    the pool closes              --> Dashboard.stop()                     (nothing left)

The server (``server.py``, aiohttp) reads the executor through the small `Source` protocol
(``source.py``), so it is tested against an in-memory source as well as a real executor.
aiohttp and prometheus_client are the ``dashboard`` extra, imported only when a dashboard
starts.
"""

from __future__ import annotations

import importlib.util
import logging
import secrets
import socket
import ssl
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fiberexec._dashboard.source import Source
from fiberexec._errors import ConfigurationError
from fiberexec._tls import TLSOptions

if TYPE_CHECKING:
    from fiberexec._dashboard.server import DashboardServer

log = logging.getLogger("fiberexec")
NEEDS = ("aiohttp", "prometheus_client")
INSTALL_HINT = "pip install 'fiberexec[dashboard]'"
ANY_ADDRESS = ("0.0.0.0", "::", "")


def check_installed() -> None:
    """Fail at construction, not at the first task, when the extra is missing."""
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigurationError(
            f"dashboard= needs {' and '.join(missing)}, which "
            f"{'are' if len(missing) > 1 else 'is'} not installed; {INSTALL_HINT}"
        )


def split(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6]:port"`` (as the config keeps it) as host and port."""
    host, _, port = address.rpartition(":")
    return host.removeprefix("[").removesuffix("]"), int(port)


@dataclass
class Dashboard:
    """A running dashboard: its full address (with the token) and how to stop it."""

    url: str
    server: DashboardServer
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True
        self.server.stop()


def start(address: str, source: Source, tls: TLSOptions | None, *,
          announce: bool = False) -> Dashboard:
    """Listen on ``address`` (``"host:port"``) and serve ``source``; HTTPS when ``tls``.

    The address with its token is logged at INFO on the ``fiberexec`` logger; with
    ``announce`` it is also printed to stderr, in one line: for a dashboard that the
    environment or a config file turned on, in a program that does not know to print
    `FiberExecutor.dashboard_url`.

    Raises:
        ConfigurationError: nothing can listen there (the port is taken, the host is not
            this machine's).
    """
    try:
        from fiberexec._dashboard.server import DashboardServer
    except ImportError as exc:
        raise ImportError(f"the dashboard needs {exc.name}: {INSTALL_HINT}") from exc
    host, port = split(address)
    token = secrets.token_urlsafe(32)
    server = DashboardServer(source, host=host, port=port, token=token,
                             ssl_context=_ssl_context(tls))
    try:
        port = server.start()
    except OSError as exc:
        raise ConfigurationError(
            f"dashboard cannot listen on {address}: {exc}; choose another host:port, or "
            "dashboard='on' for a free port on loopback"
        ) from exc
    dashboard = Dashboard(_url(host, port, token, tls is not None), server)
    log.info("dashboard at %s", dashboard.url)
    if announce:
        print(f"fiberexec: dashboard at {dashboard.url}", file=sys.stderr, flush=True)
    return dashboard


def _ssl_context(tls: TLSOptions | None) -> ssl.SSLContext | None:
    """The executor's own certificate and key, as its workers' connections use."""
    if tls is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tls.cert_file, tls.key_file)
    return context


def _url(host: str, port: int, token: str, secure: bool) -> str:
    shown = socket.getfqdn() if host in ANY_ADDRESS else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"{'https' if secure else 'http'}://{shown}:{port}/?token={token}"


__all__ = ["Dashboard", "Source", "check_installed", "split", "start"]
