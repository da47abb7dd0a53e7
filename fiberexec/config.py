"""Settings as a `FiberExecutor` resolves them, for tools that show or pass them on.

``resolve({"max_workers": 8})`` applies the rule every executor follows (explicit arguments,
then ``FIBEREXEC_*`` environment variables, then the config file, then defaults) and returns the
immutable
`ExecutorConfig`; ``describe`` lists each setting with its value and where it came from, as
``fiberexec info`` prints it, and ``rows`` gives the same with the values as plain data (what
``fiberexec info --json`` prints). ``diagnose`` resolves the environment and the config file
finding every bad value (a `Problem` each) instead of raising at the first, and
``unknown_variables`` lists ``FIBEREXEC_*`` variables that are no setting (misspellings), as
``fiberexec info`` shows them.

Fiber's configuration keys read and set here as attributes too (``config.backend``,
``config.cpu_per_job = 2``; see `fiberexec.init`), and ``get_dict()`` lists them.
"""

from __future__ import annotations

import sys

from fiberexec._config import (
    CONFIG_FILE,
    ENV_PREFIX,
    ExecutorConfig,
    Problem,
    Row,
    describe,
    diagnose,
    resolve,
    rows,
    unknown_variables,
)
from fiberexec._fiber import ConfigModule, get_dict

__all__ = [
    "CONFIG_FILE",
    "ENV_PREFIX",
    "ExecutorConfig",
    "Problem",
    "Row",
    "describe",
    "diagnose",
    "get_dict",
    "resolve",
    "rows",
    "unknown_variables",
]

sys.modules[__name__].__class__ = ConfigModule
