"""The emulator's etcd: objects, resourceVersions, an event log for watches, label selectors.

Every change bumps one global resourceVersion (as etcd's revision does) and appends an event.
`compact` drops the log up to now: a watch resuming from an older version gets 410 Gone.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

Json = dict[str, Any]


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class SelectorError(ValueError):
    """A label selector the real API server would reject (400)."""


@dataclass(frozen=True)
class _Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!exists"
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present, value = self.key in labels, labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=" and "notin"


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_SET_RE = re.compile(rf"^({_KEY})\s+(in|notin)\s+\(([^)]*)\)$")
_EQ_RE = re.compile(rf"^({_KEY})\s*(==|!=|=)\s*([-A-Za-z0-9_.]*)$")
_EXISTS_RE = re.compile(rf"^(!?)\s*({_KEY})$")


def parse_selector(text: str | None) -> list[_Requirement]:
    """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h`` (commas inside parentheses are values)."""
    requirements = []
    for part in _split_top(text or ""):
        if match := _SET_RE.match(part):
            values = frozenset(v.strip() for v in match.group(4).split(",") if v.strip())
            requirements.append(_Requirement(match.group(1), match.group(3), values))
        elif match := _EQ_RE.match(part):
            op = "!=" if match.group(3) == "!=" else "="
            requirements.append(_Requirement(match.group(1), op, frozenset({match.group(4)})))
        elif match := _EXISTS_RE.match(part):
            requirements.append(_Requirement(match.group(2),
                                             "!exists" if match.group(1) else "exists"))
        else:
            raise SelectorError(f"unable to parse requirement: {part!r}")
    return requirements


def _split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    return parts


def matches(obj: Json, selector: list[_Requirement]) -> bool:
    labels = obj.get("metadata", {}).get("labels") or {}
    return all(req.matches(labels) for req in selector)


@dataclass(frozen=True)
class Event:
    version: int
    resource: str
    namespace: str
    kind: str  # ADDED / MODIFIED / DELETED
    obj: Json


class Conflict(Exception):
    """The object already exists (409 AlreadyExists)."""


class Store:
    """Objects keyed by (resource, namespace, name); all access under one condition."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.version = 1
        self.compacted = 0  # watches resuming from a version below this get 410 Gone
        self.namespaces: set[str] = set()
        self._objects: dict[tuple[str, str, str], Json] = {}
        self.events: list[Event] = []

    def _bump(self, resource: str, namespace: str, kind: str, obj: Json) -> Json:
        self.version += 1
        if kind != "DELETED":
            obj["metadata"]["resourceVersion"] = str(self.version)
        self.events.append(Event(self.version, resource, namespace, kind, copy.deepcopy(obj)))
        self.cond.notify_all()
        return copy.deepcopy(obj)

    def create(self, resource: str, namespace: str, obj: Json) -> Json:
        with self.cond:
            key = (resource, namespace, obj["metadata"]["name"])
            if key in self._objects:
                raise Conflict(key[2])
            meta = obj["metadata"]
            meta.update(namespace=namespace, uid=str(uuid.uuid4()),
                        creationTimestamp=now_iso())
            self._objects[key] = obj
            return self._bump(resource, namespace, "ADDED", obj)

    def get(self, resource: str, namespace: str, name: str) -> Json | None:
        with self.cond:
            obj = self._objects.get((resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def update(self, resource: str, namespace: str, name: str,
               mutate: Callable[[Json], None], *, uid: str | None = None) -> Json | None:
        """Apply ``mutate`` to the stored object (MODIFIED); None if it is gone, or if ``uid``
        is given and the object under that name is another one (a precondition)."""
        with self.cond:
            obj = self._find(resource, namespace, name, uid)
            if obj is None:
                return None
            mutate(obj)
            return self._bump(resource, namespace, "MODIFIED", obj)

    def delete(self, resource: str, namespace: str, name: str, *,
               uid: str | None = None) -> Json | None:
        """Remove the object (DELETED); None if it is gone, or is not ``uid`` (as `update`)."""
        with self.cond:
            if self._find(resource, namespace, name, uid) is None:
                return None
            obj = self._objects.pop((resource, namespace, name))
            self.version += 1
            obj["metadata"]["resourceVersion"] = str(self.version)
            self.version -= 1
            return self._bump(resource, namespace, "DELETED", obj)

    def _find(self, resource: str, namespace: str, name: str, uid: str | None) -> Json | None:
        obj = self._objects.get((resource, namespace, name))
        if obj is None or (uid is not None and obj["metadata"].get("uid") != uid):
            return None
        return obj

    def list(self, resource: str, namespace: str | None,
             selector: list[_Requirement]) -> tuple[list[Json], int]:
        with self.cond:
            items = [copy.deepcopy(obj) for (res, ns, _), obj in sorted(self._objects.items())
                     if res == resource and namespace in (None, ns) and matches(obj, selector)]
            return items, self.version

    def objects(self) -> list[tuple[str, str, str]]:
        """(resource, namespace, name) of every stored object."""
        with self.cond:
            return sorted(self._objects)

    def compact(self) -> None:
        """Forget the event log up to now (etcd compaction)."""
        with self.cond:
            self.compacted = self.version
            self.events.clear()
