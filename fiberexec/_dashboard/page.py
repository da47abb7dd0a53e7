"""The dashboard's one page: ``static/index.html`` with its style and script put inline.

Inline, so the page is one response that the token guards like every other, and the
Content-Security-Policy allows exactly that style and that script (by their hashes) and
requests to this server alone.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from importlib import resources

STYLE, SCRIPT = "/*STYLE*/", "/*SCRIPT*/"


@dataclass(frozen=True)
class Page:
    html: bytes
    policy: str  # the Content-Security-Policy header


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def load() -> Page:
    static = resources.files("fiberexec._dashboard").joinpath("static")
    style = static.joinpath("dashboard.css").read_text(encoding="utf-8")
    script = static.joinpath("dashboard.js").read_text(encoding="utf-8")
    html = static.joinpath("index.html").read_text(encoding="utf-8")
    policy = (f"default-src 'none'; script-src {_sha256(script)}; style-src {_sha256(style)}; "
              "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; "
              "frame-ancestors 'none'")
    html = html.replace(STYLE, style).replace(SCRIPT, script)
    return Page(html.encode(), policy)
