"""CPython's suite keeps a pool for a whole test class (made in ``setUpClass``): what it
leaves behind is checked once the module has run, not after each test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import _shm_files
from tests.support.backend_local import _leaks


@pytest.fixture(autouse=True)
def _no_leaks() -> None:
    """Replaces the per-test check (see `_no_leaks_after_the_suite`)."""


@pytest.fixture(scope="module", autouse=True)
def _no_leaks_after_the_suite() -> Iterator[None]:
    shm_before = _shm_files()
    yield
    import fiberexec.multiprocessing as mp

    mp.set_default_backend(None)  # closes the processes' backend, as at exit
    leaked = _leaks()
    assert not leaked, f"the suite left these running: {leaked}"
    stray = _shm_files() - shm_before
    assert not stray, f"the suite left shared-memory files in /dev/shm: {sorted(stray)}"
