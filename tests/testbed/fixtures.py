"""Fixtures for tests on the multi-host test bed (imported by the conftest files that use it).

``lab``: the run's `Lab` (built once per session through the ssh backend's test kit, which
fails loudly when it cannot be built). ``healthy_links`` (autouse where imported): every link
is up, lossless, unshaped and undelayed again after each test, also after a failure.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.backend_ssh import SSHKit
from tests.support.kit import BackendKit
from tests.testbed.session import Lab


@pytest.fixture(scope="session")
def lab(kit: BackendKit) -> Lab:
    if not isinstance(kit, SSHKit) or kit.lab is None:
        pytest.fail("the test bed runs under FIBEREXEC_TEST_BACKEND=ssh (tox -e ssh)")
    return kit.lab


@pytest.fixture(autouse=True)
def healthy_links(lab: Lab) -> Iterator[None]:
    yield
    lab.reset()
