"""Pickling for queues, pipes, processes and managers: pickle 5, cloudpickle when needed."""

from __future__ import annotations

import pickle
from typing import Any

import cloudpickle

from fiberexec._errors import SerializationError

PROTOCOL = 5


def dumps(obj: Any, *, what: str = "object") -> bytes:
    """Pickle ``obj`` by reference when possible, by value (cloudpickle) otherwise."""
    try:
        data = pickle.dumps(obj, protocol=PROTOCOL)
        if b"__main__" not in data:
            return data
    except Exception:
        pass
    try:
        return bytes(cloudpickle.dumps(obj, protocol=PROTOCOL))
    except Exception as exc:
        raise SerializationError(
            f"cannot pickle the {what}: {type(exc).__name__}: {exc}; "
            "send picklable objects (module-level functions and classes, plain data)"
        ) from exc


def loads(data: bytes | memoryview, *, what: str = "object") -> Any:
    """Unpickle bytes that came from an authenticated peer."""
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise SerializationError(
            f"cannot unpickle the {what}: {type(exc).__name__}: {exc}"
        ) from exc
