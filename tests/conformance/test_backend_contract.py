"""The backend seam's contract (`fiberexec.testing`), run against the backend under test.

Every backend env runs this folder; a backend's ``tests/support/backend_X.py`` says in its
`BackendKit.contract` how (which parts apply, how to reach its strays).
"""

from __future__ import annotations

import pytest

from fiberexec.testing import CHECKS
from tests.support.kit import BackendKit


@pytest.mark.parametrize("check", list(CHECKS))
def test_backend_keeps_the_contract(kit: BackendKit, check: str) -> None:
    CHECKS[check](kit.contract)
