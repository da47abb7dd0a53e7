"""Worker hosts for the ssh backend: from a list, from an inventory file, and their placement.

A host is ``"user@name"`` (any destination ``ssh`` accepts, including ``Host`` aliases of
your ``~/.ssh/config``) or a table::

    {"host": "me@gpu1", "port": 2222, "slots": 4, "python": "/opt/venv/bin/python",
     "ssh_options": ["-o", "ProxyJump=gate"]}

An inventory file is TOML (``hosts = [...]`` with the same entries, or ``[[hosts]]`` tables)
or plain text, one host per line with optional ``key=value`` fields::

    # name            fields
    me@gpu1           slots=4 python=/opt/venv/bin/python
    me@gpu2:2222      slots=2
"""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiberexec import ConfigurationError
from fiberexec.backend import TransientBackendError

_KEYS = ("host", "port", "slots", "python", "ssh_options")


@dataclass(frozen=True)
class SSHHost:
    """One worker host: where to log in, how many workers it takes, which Python runs them."""

    target: str
    port: int | None = None
    slots: int | None = None  # None: no limit
    python: str = "python3"
    ssh_options: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.target or self.target.startswith("-") or any(c.isspace() for c in self.target):
            raise ConfigurationError(
                f"ssh host must be a destination like 'user@name', got {self.target!r}")
        if self.port is not None and not 0 < self.port < 65536:
            raise ConfigurationError(f"ssh port of {self.target} must be 1-65535, got {self.port}")
        if self.slots is not None and self.slots < 1:
            raise ConfigurationError(
                f"slots of {self.target} must be >= 1, got {self.slots}; leave it out for no limit")

    @property
    def label(self) -> str:
        """How messages name the host: ``user@name`` or ``user@name:port``."""
        return f"{self.target}:{self.port}" if self.port else self.target


def _from_text(entry: str, python: str, slots: int | None) -> SSHHost:
    name, *fields = entry.split()
    options: dict[str, Any] = dict(f.partition("=")[::2] for f in fields)
    if ":" in name and name.count(":") == 1 and name.rsplit(":", 1)[1].isdigit():
        name, port = name.rsplit(":", 1)
        options.setdefault("port", port)
    return _from_table({"host": name, **options}, python, slots)


def _from_table(entry: Mapping[str, Any], python: str, slots: int | None) -> SSHHost:
    unknown = sorted(set(entry) - set(_KEYS))
    if unknown or "host" not in entry:
        raise ConfigurationError(
            f"ssh host entry {dict(entry)!r} must have 'host' and only keys {list(_KEYS)}"
            + (f"; unknown: {unknown}" if unknown else ""))
    try:
        port = int(entry["port"]) if entry.get("port") is not None else None
        limit = int(entry["slots"]) if entry.get("slots") is not None else slots
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"port and slots of ssh host {entry['host']!r} must be integers, got "
            f"port={entry.get('port')!r} slots={entry.get('slots')!r}") from None
    options = entry.get("ssh_options") or ()
    if isinstance(options, str):
        options = options.split()
    return SSHHost(str(entry["host"]), port, limit, str(entry.get("python") or python),
                   tuple(str(o) for o in options))


def parse_hosts(hosts: Iterable[str | Mapping[str, Any] | SSHHost], *, python: str,
                slots: int | None) -> list[SSHHost]:
    parsed = []
    for entry in hosts:
        if isinstance(entry, SSHHost):
            parsed.append(entry)
        elif isinstance(entry, str):
            parsed.append(_from_text(entry, python, slots))
        elif isinstance(entry, Mapping):
            parsed.append(_from_table(entry, python, slots))
        else:
            raise ConfigurationError(
                f"ssh hosts must be strings like 'user@name' or tables, got {entry!r}")
    return parsed


def read_inventory(path: str | os.PathLike[str], *, python: str,
                   slots: int | None) -> list[SSHHost]:
    """The hosts an inventory file lists (TOML, or one host per line)."""
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigurationError(f"ssh inventory {str(path)!r} cannot be read: {exc}") from exc
    if file.suffix == ".toml":
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigurationError(f"ssh inventory {path} is not valid TOML: {exc}") from exc
        entries: Sequence[Any] = data.get("hosts", [])
    else:
        lines = (line.split("#", 1)[0].strip() for line in text.splitlines())
        entries = [line for line in lines if line]
    hosts = parse_hosts(entries, python=python, slots=slots)
    if not hosts:
        raise ConfigurationError(f"ssh inventory {path} lists no hosts")
    return hosts


@dataclass
class _Place:
    host: SSHHost
    index: int
    workers: set[str] = field(default_factory=set)
    cooling_until: float = 0.0
    stopping: int = 0  # stops in progress: the host may be unreachable


class Placement:
    """Which host runs each worker: the least loaded host with a free slot, avoiding hosts
    that failed recently (``cooldown`` seconds) or are stopping a worker while others have
    room."""

    def __init__(self, hosts: Sequence[SSHHost], *, cooldown: float,
                 clock: Callable[[], float]) -> None:
        self._places = [_Place(h, i) for i, h in enumerate(hosts)]
        self._cooldown = cooldown
        self._clock = clock
        self._lock = threading.Lock()

    def reserve(self, worker_id: str) -> SSHHost:
        """Take a slot for ``worker_id``; `TransientBackendError` when every slot is taken."""
        with self._lock:
            now = self._clock()
            free = [p for p in self._places if p.host.slots is None
                    or len(p.workers) < p.host.slots]
            if not free:
                total = sum(p.host.slots or 0 for p in self._places)
                raise TransientBackendError(
                    f"cannot place worker {worker_id}: all {total} slots on "
                    f"{len(self._places)} ssh hosts are taken; raise slots= per host, add "
                    "hosts, or lower max_workers")
            best = min(free, key=lambda p: (p.cooling_until > now or p.stopping > 0,
                                            len(p.workers), p.index))
            best.workers.add(worker_id)
            return best.host

    def release(self, worker_id: str) -> None:
        with self._lock:
            for place in self._places:
                place.workers.discard(worker_id)

    def stopping(self, host: SSHHost, worker_id: str) -> None:
        """A stop of ``worker_id`` began: its slot is free now (a replacement need not wait
        for an unreachable host), but the host is avoided until `stopped`."""
        with self._lock:
            for place in self._places:
                place.workers.discard(worker_id)
                if place.host == host:
                    place.stopping += 1

    def stopped(self, host: SSHHost, *, answered: bool) -> None:
        with self._lock:
            for place in self._places:
                if place.host == host:
                    place.stopping -= 1
                    if not answered:
                        place.cooling_until = self._clock() + self._cooldown

    def suspect(self, host: SSHHost) -> None:
        """``host`` just failed: prefer others for a while."""
        with self._lock:
            for place in self._places:
                if place.host == host:
                    place.cooling_until = self._clock() + self._cooldown

    def hosts(self) -> list[SSHHost]:
        return [p.host for p in self._places]

    def load(self) -> dict[str, int]:
        with self._lock:
            return {p.host.label: len(p.workers) for p in self._places}
