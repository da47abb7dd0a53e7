"""``fiberexec info``: the resolved configuration, and which backends are usable here.

Each backend answers for itself through its `Backend.probe` capability; a backend that offers
none is listed as registered. Each also says how it applies the resource settings (cpu, memory,
gpu) through `Backend.resource_limits`, so a limit that a backend ignores is shown as such.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from fiberexec.backend import CapabilityError, Probe, backend_class, first_line
from fiberexec.config import ExecutorConfig, rows

RESOURCES = ("cpu", "memory", "gpu")


@dataclass(frozen=True)
class Limit:
    """How one resource setting applies on one backend: ``how`` is None where it does not."""

    resource: str
    backend: str
    how: str | None

    def text(self) -> str:
        return self.how or f"not enforced on {self.backend}"


def probe(name: str) -> Probe:
    """What the backend registered as ``name`` says about itself (never raises)."""
    try:
        return backend_class(name).probe()
    except CapabilityError:
        return Probe(name, True, "registered by entry point (it offers no probe)")
    except Exception as exc:  # a backend that cannot even be imported is not usable
        return Probe(name, False, f"cannot load it: {first_line(exc)}")


def probe_all(names: list[str]) -> list[Probe]:
    return [probe(n) for n in names]


def limits(name: str) -> list[Limit]:
    """How the backend ``name`` applies cpu, memory and gpu (empty if it cannot be loaded)."""
    try:
        cls = backend_class(name)
    except Exception:  # already reported by its probe
        return []
    declared = dict(cls.resource_limits)
    if not declared and cls.enforces_resources:
        declared = dict.fromkeys(RESOURCES, "enforced (the backend does not say how)")
    return [Limit(r, name, declared.get(r)) for r in RESOURCES]


def report(config: ExecutorConfig, usable: list[Probe], version: str) -> str:
    """What ``fiberexec info`` prints."""
    lines = [f"fiberexec {version} (Python {platform.python_version()})",
             f"config file: {config.config_file or 'none'}", "", "configuration:"]
    settings = rows(config)
    width = max(len(row.key) for row in settings)
    lines += [f"  {row.key:<{width}}  {row.text():<24} ({row.source})" for row in settings]
    lines += ["", "backends:"]
    for u in usable:
        lines.append(f"  {u.backend:<11} {'usable' if u.usable else 'unusable':<9} {u.detail}")
        lines += [f"  {'':<11} {limit.resource + ':':<9} {limit.text()}"
                  for limit in limits(u.backend)]
    return "\n".join(lines)


def as_json(config: ExecutorConfig, usable: list[Probe]) -> dict[str, object]:
    """What ``fiberexec info --json`` prints: values as JSON types (numbers, booleans, null)."""
    return {
        "config_file": config.config_file,
        "configuration": {row.key: _setting(row.value, row.source, row.note)
                          for row in rows(config)},
        "backends": {u.backend: {"usable": u.usable, "detail": u.detail,
                                 "resources": _resources(u.backend)} for u in usable},
    }


def _setting(value: object, source: str, note: str | None) -> dict[str, object]:
    entry = {"value": value, "source": source}
    return {**entry, "note": note} if note else entry


def _resources(name: str) -> dict[str, object]:
    return {limit.resource: {"enforced": limit.how is not None, "how": limit.how}
            for limit in limits(name)}
