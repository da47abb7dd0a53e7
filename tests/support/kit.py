"""The contract between the behaviour suite and a backend's test support module."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fiberexec.backend import Backend


@dataclass
class BackendKit:
    name: str
    make_backend: Callable[[], Backend]
    leaks: Callable[[], list[str]]
    executor_kwargs: dict[str, Any] = field(default_factory=dict)
