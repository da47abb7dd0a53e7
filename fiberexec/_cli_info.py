"""``fiberexec info``: the resolved configuration, and which backends are usable here.

A diagnostic: every setting is listed even when some are bad (each bad one is flagged with its
error, `fiberexec.config.diagnose`), and so is every ``FIBEREXEC_*`` variable that is no
setting. Each backend answers for itself through its `Backend.probe` capability; a backend
that offers none is made from the configured ``backend_options`` (backends validate in
``__init__`` and do their I/O later), so one that needs options (ssh's hosts) says so, and is
otherwise listed as registered. Each also says how it applies the resource settings (cpu,
memory, gpu) through `Backend.resource_limits`, so a limit that a backend ignores is shown as
such.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fiberexec.backend import Backend, CapabilityError, Probe, backend_class, first_line
from fiberexec.config import CONFIG_FILE, ExecutorConfig, Problem, Row, rows

RESOURCES = ("cpu", "memory", "gpu")


@dataclass(frozen=True)
class Limit:
    """How one resource setting applies on one backend: ``how`` is None where it does not."""

    resource: str
    backend: str
    how: str | None

    def text(self) -> str:
        return self.how or f"not enforced on {self.backend}"


def probe(name: str, config: ExecutorConfig) -> Probe:
    """What the backend registered as ``name`` says about itself (never raises)."""
    try:
        cls = backend_class(name)
    except Exception as exc:  # a backend that cannot even be imported is not usable
        return Probe(name, False, f"cannot load it: {first_line(exc)}")
    try:
        return cls.probe()
    except CapabilityError:
        return _made(cls, dict(config.backend_options) if config.backend == name else {})
    except Exception as exc:
        return Probe(name, False, f"its probe failed: {first_line(exc)}")


def _made(cls: type[Backend], options: Mapping[str, Any]) -> Probe:
    """A backend without a probe: whether it can be made with the configured options."""
    try:
        made = cls(**options)
    except Exception as exc:  # what it needs and was not given here (ssh: its hosts)
        return Probe(cls.name, False, f"registered, but not set up here: {first_line(exc)}")
    made.close()
    return Probe(cls.name, True, "registered by entry point (it offers no probe)")


def probe_all(names: list[str], config: ExecutorConfig) -> list[Probe]:
    return [probe(n, config) for n in names]


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


@dataclass(frozen=True)
class Findings:
    """What ``fiberexec info`` reports on: the configuration, its bad values, the unknown
    ``FIBEREXEC_*`` variables (with the setting variables nearest each), and the backends."""

    config: ExecutorConfig
    problems: list[Problem]
    unknown: Mapping[str, list[str]]
    usable: list[Probe]

    def settings(self) -> list[tuple[Row, str | None]]:
        """Every setting's row, with its error; a bad one shows the value as it was given."""
        bad = {p.key: p for p in self.problems}
        return [(row, None) if row.key not in bad else
                (Row(row.key, bad[row.key].value, bad[row.key].source, "invalid"),
                 bad[row.key].message) for row in rows(self.config)]

    def file_problem(self) -> Problem | None:
        """Why the config file was not read (it was skipped), if it was not."""
        return next((p for p in self.problems if p.key == CONFIG_FILE), None)

    def config_file(self) -> str:
        bad = self.file_problem()
        if bad is not None:
            return f"{bad.value or 'none'} (not read: {bad.message})"
        return self.config.config_file or "none"


def report(found: Findings, version: str) -> str:
    """What ``fiberexec info`` prints."""
    lines = [f"fiberexec {version} (Python {platform.python_version()})",
             f"config file: {found.config_file()}", "", "configuration:"]
    settings = found.settings()
    width = max(len(row.key) for row, _ in settings)
    for row, error in settings:
        lines.append(f"  {row.key:<{width}}  {row.text():<24} ({row.source})")
        lines += [f"  {'':<{width}}  ^ {error}"] if error else []
    if found.unknown:
        lines += ["", "unknown FIBEREXEC_* variables (no setting: ignored):"]
        lines += [f"  {name}" + (f" (did you mean {' or '.join(closest)}?)" if closest else "")
                  for name, closest in found.unknown.items()]
    lines += ["", "backends:"]
    for u in found.usable:
        lines.append(f"  {u.backend:<11} {'usable' if u.usable else 'unusable':<9} {u.detail}")
        lines += [f"  {'':<11} {limit.resource + ':':<9} {limit.text()}"
                  for limit in limits(u.backend)]
    return "\n".join(lines)


def as_json(found: Findings) -> dict[str, object]:
    """What ``fiberexec info --json`` prints: values as JSON types (numbers, booleans, null);
    a bad value as it was given, with its ``error``."""
    data: dict[str, object] = {
        "config_file": found.config.config_file,
        "configuration": {row.key: _setting(row, error) for row, error in found.settings()},
        "unknown_variables": {name: {"did_you_mean": closest}
                              for name, closest in found.unknown.items()},
        "backends": {u.backend: {"usable": u.usable, "detail": u.detail,
                                 "resources": _resources(u.backend)} for u in found.usable},
    }
    bad = found.file_problem()
    return data if bad is None else {**data, "config_file_error": bad.message}


def _setting(row: Row, error: str | None) -> dict[str, object]:
    entry: dict[str, object] = {"value": row.value, "source": row.source}
    if row.note:
        entry["note"] = row.note
    return {**entry, "error": error} if error else entry


def _resources(name: str) -> dict[str, object]:
    return {limit.resource: {"enforced": limit.how is not None, "how": limit.how}
            for limit in limits(name)}
