"""Settings as a `FiberExecutor` resolves them, for tools that show or pass them on.

``resolve({"max_workers": 8})`` applies the rule every executor follows (explicit arguments,
then ``FIBEREXEC_*`` environment variables, then the config file, then defaults) and returns the
immutable
`ExecutorConfig`; ``describe`` lists each setting with its value and where it came from, as
``fiberexec info`` prints it, and ``rows`` gives the same with the values as plain data (what
``fiberexec info --json`` prints).
"""

from __future__ import annotations

from fiberexec._config import ENV_PREFIX, ExecutorConfig, Row, describe, resolve, rows

__all__ = ["ENV_PREFIX", "ExecutorConfig", "Row", "describe", "resolve", "rows"]
