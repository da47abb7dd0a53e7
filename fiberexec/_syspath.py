"""The parent's import path (and ``sys.argv``), handed to the processes it starts.

The standard library's ``spawn`` start method gives a child its parent's ``sys.path``, and a
forked child has it anyway; so a script that imports a module beside it, run from another
directory, works in its children. Workers and processes here are fresh interpreters, often
started in another directory, so the parent's path travels in `ENV_SYS_PATH` (JSON, each
entry made absolute against the parent's working directory, with the parent's
``sys.prefix``), and the child takes the entries that exist where it runs:

- run by the same Python installation (same ``sys.prefix``): in the parent's order, before
  its own, as a spawned child;
- by another (a container's, another host's): after its own, so its own packages win over
  same-named ones of the parent's installation (built for another Python, perhaps) that a
  shared directory makes visible.

``sys.argv`` travels with it: a child gets its parent's, as a forked or spawned one does; and
where the parent's main module came from (its file, or the module ``-m`` ran), which a
worker's ``__main__`` names (`fiberexec._mainspace`) so that a stdlib ``spawn`` child of a
task finds the script as a spawned child of the script would.
"""

from __future__ import annotations

import json
import os
import sys

from fiberexec._contract import ENV_SYS_PATH

__all__ = ["ENV_SYS_PATH", "adopt", "export"]


def export() -> str:
    """This process's ``sys.path``, ``sys.prefix``, ``sys.argv`` and main module's origin,
    for `adopt` in a child."""
    cwd = os.getcwd()
    path = [os.path.join(cwd, p) if p else cwd for p in sys.path if isinstance(p, str)]
    return json.dumps({"prefix": sys.prefix, "path": path, "argv": sys.argv,
                       "main": main_origin()})


def main_origin() -> dict[str, str]:
    """``{"name": module}`` for a program run with ``python -m module``, ``{"path": file}``
    for a script, ``{}`` for neither (an interactive session)."""
    main = sys.modules.get("__main__")
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if isinstance(name, str) and name and name != "__main__":
        return {"name": name}
    path = getattr(main, "__file__", None)
    return {"path": os.path.abspath(path)} if isinstance(path, str) and path else {}


def script_dir() -> str | None:
    """The directory of this program's main script (None: ``-m``, or interactive)."""
    path = main_origin().get("path")
    return os.path.dirname(path) if path else None


def adopt(value: str | None) -> dict[str, str]:
    """Add the parent's path entries (`export`) that exist here to ``sys.path``; take its
    ``sys.argv``; return its main module's origin (`main_origin`)."""
    if not value:
        return {}
    try:
        sent = json.loads(value)
    except ValueError:
        return {}
    if not isinstance(sent, dict):
        return {}
    argv = sent.get("argv")
    if isinstance(argv, list) and all(isinstance(a, str) for a in argv):
        sys.argv[:] = argv
    entries = sent.get("path")
    if isinstance(entries, list):
        _extend(entries, sent.get("prefix") == sys.prefix)
    origin = sent.get("main")
    if not isinstance(origin, dict):
        return {}
    return {k: v for k, v in origin.items() if k in ("name", "path") and isinstance(v, str)}


def _extend(entries: list[object], same_python: bool) -> None:
    parent = [p for p in entries if isinstance(p, str) and os.path.exists(p)]
    if same_python:
        sys.path[:] = list(dict.fromkeys([*parent, *sys.path]))
    else:
        sys.path[:] = list(dict.fromkeys([*sys.path, *parent]))
