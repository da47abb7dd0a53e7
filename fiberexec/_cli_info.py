"""``fiberexec info``: the resolved configuration, and which backends are usable here.

Each backend answers for itself through its `Backend.probe` capability; a backend that offers
none is listed as registered.
"""

from __future__ import annotations

import platform

from fiberexec.backend import CapabilityError, Probe, backend_class, first_line
from fiberexec.config import ExecutorConfig, describe


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



def report(config: ExecutorConfig, usable: list[Probe], version: str) -> str:
    """What ``fiberexec info`` prints."""
    lines = [f"fiberexec {version} (Python {platform.python_version()})",
             f"config file: {config.config_file or 'none'}", "", "configuration:"]
    rows = describe(config)
    width = max(len(k) for k, _, _ in rows)
    lines += [f"  {k:<{width}}  {v:<24} ({source})" for k, v, source in rows]
    lines += ["", "backends:"]
    lines += [f"  {u.backend:<11} {'usable' if u.usable else 'unusable':<9} {u.detail}"
              for u in usable]
    return "\n".join(lines)


def as_json(config: ExecutorConfig, usable: list[Probe]) -> dict[str, object]:
    return {
        "config_file": config.config_file,
        "configuration": {k: {"value": v, "source": s} for k, v, s in describe(config)},
        "backends": {u.backend: {"usable": u.usable, "detail": u.detail} for u in usable},
    }
