"""The module under test: the standard library's `multiprocessing` or ours, same tests."""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
from collections.abc import Iterator
from types import ModuleType

import pytest

from tests.conftest import BACKEND
from tests.support.kit import BackendKit

MODULES = ["multiprocessing", "fiberexec.multiprocessing"]
# The stdlib's runs are the reference, and use no backend: they run once, in the local env.
UNDER_TEST = MODULES if BACKEND == "local" else MODULES[1:]
# How many processes a loop that looks for a leak or a race starts one after another: a
# start on a remote backend (a container, a pod, an ssh session) takes most of a second.
STARTS = 20 if BACKEND == "local" else 6


@pytest.fixture(params=UNDER_TEST)
def mpm(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    """Each test runs once per module; the stdlib's children are cleaned up like ours
    (those the test started: not, say, the workers of loky's reusable executor)."""
    module = importlib.import_module(request.param)
    before = set(multiprocessing.active_children())
    yield module
    if module is multiprocessing:
        for child in set(multiprocessing.active_children()) - before:
            child.kill()
            child.join(10)


@contextlib.contextmanager
def links_shaped(kit: BackendKit, rate: str) -> Iterator[bool]:
    """On the ssh test bed, every host's link shaped to ``rate`` (``"20mbit"``) while
    inside, and True; on other backends nothing to shape, and False."""
    lab = getattr(kit, "lab", None)
    if lab is None:
        yield False
        return
    for short in lab.bed.hosts:
        lab.bed.rate(short, rate)
    try:
        yield True
    finally:
        lab.bed.reset()
