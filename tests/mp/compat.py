"""The module under test: the standard library's `multiprocessing` or ours, same tests."""

from __future__ import annotations

import importlib
import multiprocessing
from collections.abc import Iterator
from types import ModuleType

import pytest

MODULES = ["multiprocessing", "fiberexec.multiprocessing"]


@pytest.fixture(params=MODULES)
def mpm(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """Each test runs once per module; the stdlib's children are cleaned up like ours."""
    module = importlib.import_module(request.param)
    yield module
    if module is multiprocessing:
        for child in multiprocessing.active_children():
            child.kill()
            child.join(10)
