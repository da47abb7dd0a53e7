"""``python -m fiberexec``: the ``fiberexec`` command (see `fiberexec._cli`)."""

from __future__ import annotations

import sys

from fiberexec._cli import main

if __name__ == "__main__":
    sys.exit(main())
