"""The contract between the behaviour suite and a backend's test support module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fiberexec.backend import Backend
from fiberexec.testing import Harness


@dataclass
class BackendKit:
    name: str
    make_backend: Callable[[], Backend]
    leaks: Callable[[], list[str]]
    contract: Harness  # how tests/conformance runs fiberexec.testing's checks on this backend
    executor_kwargs: dict[str, Any] = field(default_factory=dict)
    # every process of the backend runs on this host and shares its /dev/shm (the
    # multiprocessing layer's "same host" features then work, see the README)
    same_host: bool = True
    # the FIBEREXEC_* variables that select and configure this backend by name, as a user
    # sets them (no object: what the configuration alone must carry to every facade)
    settings: dict[str, str] = field(default_factory=dict)
