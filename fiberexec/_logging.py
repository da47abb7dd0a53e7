"""`enable_logging`: show what the ``fiberexec`` logger reports, in one call.

Until then the logger prints nothing: the package gives it a `logging.NullHandler` (see
``fiberexec/__init__.py``), so warnings are not written to stderr behind the application's back.
"""

from __future__ import annotations

import logging
import sys
from typing import TextIO

LOGGER = "fiberexec"
FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
_MARK = "_fiberexec_enable_logging"


def enable_logging(
    level: int | str = logging.INFO, *, stream: TextIO | None = None
) -> logging.Logger:
    """Print the ``fiberexec`` logger's records (worker starts, losses, replacements, retries).

    Calling it again changes the level without adding a second handler. Applications that
    configure `logging` themselves need not call it: the records propagate as usual.

    Args:
        level: a `logging` level, as a number or a name such as ``"DEBUG"``.
        stream: where to write (default: ``sys.stderr``).

    Returns:
        the ``fiberexec`` logger.

    Example:
        >>> enable_logging("INFO")  # doctest: +SKIP
    """
    if isinstance(level, str):
        named = logging.getLevelName(level.upper())
        if not isinstance(named, int):
            raise ValueError(f"level must be a logging level such as 'INFO', got {level!r}")
        level = named
    logger = logging.getLogger(LOGGER)
    logger.setLevel(level)
    handler = next((h for h in logger.handlers if getattr(h, _MARK, False)), None)
    if handler is None:
        handler = logging.StreamHandler(stream or sys.stderr)
        handler.setFormatter(logging.Formatter(FORMAT))
        setattr(handler, _MARK, True)
        logger.addHandler(handler)
    handler.setLevel(level)
    return logger
