"""The public surface is curated, the core never imports a concrete backend, adapters and the
CLI go through the public seam, and the README's set-up is what CI runs."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

import fiberexec
from fiberexec.backend import (
    Backend,
    CapabilityError,
    MasterRequest,
    Sweep,
    available_backends,
)

ROOT = Path(fiberexec.__file__).parent
REPO = Path(__file__).resolve().parents[1]
SEAM = "fiberexec.backend"
SDKS = ("docker", "kubernetes")


def test_all_is_sorted_and_complete() -> None:
    assert fiberexec.__all__ == sorted(fiberexec.__all__) == sorted(fiberexec._EXPORTS)
    for name in fiberexec.__all__:
        assert getattr(fiberexec, name) is not None
    public = {n for n in dir(fiberexec) if not n.startswith("_") and n[0].isupper()}
    assert public <= set(fiberexec.__all__)  # plus lowercase aliases such as cpu_count


def test_worker_program_does_not_load_the_executor() -> None:
    assert _loaded_by("import fiberexec.worker", ["fiberexec._executor", "tenacity"]) == []


def test_worker_program_defers_what_only_rarer_paths_need() -> None:
    """A worker is a new interpreter on every backend but the local launcher's forks: what it
    needs only to unpickle by value, to report a failure, or for TLS is imported there."""
    deferred = ["cloudpickle", "concurrent.futures.process", "dataclasses", "inspect",
                "secrets", "ssl", "pynng", "fiberexec._inherit", "fiberexec._tls"]
    assert _loaded_by("import fiberexec.worker", deferred) == []


def _loaded_by(imports: str, modules: list[str]) -> list[str]:
    """Those of ``modules`` that a fresh interpreter holds after ``imports``."""
    import json
    import subprocess
    import sys

    code = (f"import sys; {imports}; import json; "  # (json loads none of those checked)
            f"print(json.dumps([m for m in {modules!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60).stdout
    found: list[str] = json.loads(out)
    return found


def test_core_never_imports_a_concrete_backend() -> None:
    offenders = []
    for path in ROOT.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.name}: {n}" for n in names if n.startswith("fiberexec.backends")]
    assert not offenders


def test_the_scheduler_parts_point_one_way() -> None:
    """Shards know their `Session`, `Lifecycle` and `Link`s, never the pool or supervisor that
    made them (so a shard is built in a unit test with fakes); the supervisor never imports
    the pool."""
    below = {"_shard.py": ("_pool", "pool", "_supervisor", "TaskPool", "WorkerSupervisor",
                           "_executor"),
             "_conn.py": ("_pool", "_supervisor", "_shard", "TaskPool"),
             "_events.py": ("_pool", "_supervisor", "TaskPool"),
             "_session.py": ("_pool", "_supervisor", "_shard", "TaskPool"),
             "_supervisor.py": ("_pool", "TaskPool", "_executor")}
    offenders = []
    for name, banned in below.items():
        tree = ast.parse((ROOT / name).read_text())
        words = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        words |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        words |= {m.rsplit(".", 1)[-1] for _, m in _imports(ROOT / name)}
        offenders += [f"{name} names {b}" for b in banned if b in words]
    assert not offenders


def test_builtin_backends_are_registered_by_entry_point() -> None:
    assert {"local", "docker", "kubernetes"} <= set(available_backends())


def test_a_builtin_backend_name_needs_no_scan_and_cannot_be_taken_over(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A first submit must not read every installed distribution's metadata to find
    'local'; another distribution's entry point named 'local' does not replace it."""
    import importlib.metadata
    from importlib.metadata import EntryPoint

    from fiberexec import _registry
    from fiberexec._errors import ConfigurationError

    scans: list[str] = []

    def entry_points(group: str) -> list[EntryPoint]:
        scans.append(group)
        return [EntryPoint("local", "elsewhere:Hijack", group),
                EntryPoint("extra", "elsewhere:Extra", group)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)  # read at a scan
    _registry._scanned.cache_clear()
    try:
        assert _registry.backend_class("local").__name__ == "LocalBackend"
        _registry.check_backend_name("docker", "a test")
        assert scans == []
        with pytest.raises(ConfigurationError, match="unknown backend 'dokcer'.*'docker'"):
            _registry.check_backend_name("dokcer", "a test")
        assert scans == [_registry.GROUP]
        assert _registry.available_backends().count("local") == 1
        assert "extra" in _registry.available_backends()
        assert _registry._target("local") == "fiberexec.backends.local:LocalBackend"
    finally:
        _registry._scanned.cache_clear()


_TIME_NAME = re.compile(r"(TIMEOUT|WAIT|HOLD|SLICE|HEARTBEAT|REQUERY|GRACE)$")
_TIME_KEYWORDS = ("timeout", "grace")


def _number(node: ast.expr) -> bool:
    """A number written in the code, or a tuple of them."""
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_number(elt) for elt in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not (
        isinstance(node.value, bool))


def _time_limits_outside_timing(path: Path) -> list[str]:
    """Module-level time constants, timeouts or waits written as number literals, and
    names bound to the layer's `Timing` value (a copy a test could not replace)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and _number(node.value) and any(
                isinstance(t, ast.Name) and _TIME_NAME.search(t.id) for t in node.targets):
            found.append(f"{path.name}:{node.lineno} constant")
        if isinstance(node, ast.ImportFrom) and any(a.name == "TIMING" for a in node.names):
            found.append(f"{path.name}:{node.lineno} a copy of TIMING")
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
                isinstance(d, ast.Attribute) and isinstance(d.value, ast.Attribute)
                and d.value.attr == "TIMING"
                for d in [*node.args.defaults, *node.args.kw_defaults]):
            found.append(f"{path.name}:{node.lineno} a default read at import")
        if isinstance(node, ast.Call):
            literal = [k.arg for k in node.keywords
                       if k.arg in _TIME_KEYWORDS and _number(k.value) and not (
                           isinstance(k.value, ast.Constant) and k.value.value == 0)]
            if isinstance(node.func, ast.Attribute) and node.func.attr in (
                    "wait", "join", "settimeout") and node.args and _number(node.args[0]):
                literal.append(node.func.attr)
            if isinstance(node.func, ast.Name) and node.func.id == "min" and any(
                    _number(arg) and not isinstance(arg, ast.Tuple) for arg in node.args) and any(
                    isinstance(arg, ast.Name) and arg.id in ("left", "timeout")
                    for arg in node.args):
                literal.append("min")
            found += [f"{path.name}:{node.lineno} {what}=literal" for what in literal]
    return found


def test_multiprocessing_time_limits_live_in_one_timing_value(tmp_path: Path) -> None:
    folder = ROOT / "multiprocessing"
    offenders = [hit for path in sorted(folder.glob("*.py")) if path.name != "_timing.py"
                 for hit in _time_limits_outside_timing(path)]
    assert not offenders, f"time limits outside _timing.Timing: {offenders}"
    bad = tmp_path / "bad.py"
    bad.write_text("CALL_TIMEOUT = 120.0\nREQUERY = (0.02, 1.0)\nev.wait(1.0)\n"
                   "ep.call('x', timeout=5.0)\nb.stop(h, grace=0.5)\nc.wait(min(left, 1.0))\n"
                   "from fiberexec.multiprocessing._timing import TIMING\n"
                   "def f(t: float = _timing.TIMING.call) -> None: ...\n")
    assert len(_time_limits_outside_timing(bad)) == 8  # the check sees what it looks for


def test_importing_the_executor_and_the_multiprocessing_layer_defers_rarer_needs() -> None:
    """A program pays for an import before it does anything: retries (tenacity), a scan of
    the installed distributions for other backends (importlib.metadata) and a config file's
    parser (tomllib) are imported when first used (15-25 ms of a 90-140 ms import)."""
    deferred = ["tenacity", "importlib.metadata", "tomllib"]
    imports = "from fiberexec import FiberExecutor; import fiberexec.multiprocessing"
    assert _loaded_by(imports, deferred) == []


def test_chunk_runners_do_not_load_the_executor() -> None:
    imports = "import fiberexec.worker, fiberexec._chunks"
    assert _loaded_by(imports, ["fiberexec._executor", "tenacity"]) == []


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every module a file imports, including ``from X import name``
    (``X.name``: it may be a module) and ``importlib.import_module("X")`` with a literal."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(
                node.func, "id", None)) in ("import_module", "__import__") and node.args
              and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            yield node.lineno, node.args[0].value


def _private_fiberexec(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "fiberexec" and any(
        p.startswith("_") and not p.startswith("__") for p in parts[1:])


def _seam_offenders(path: Path, own_prefix: str) -> list[str]:
    """Private fiberexec modules ``path`` imports other than its own (``own_prefix``)."""
    return [f"{path.relative_to(REPO)}:{line} imports {module}"
            for line, module in _imports(path)
            if _private_fiberexec(module) and not module.startswith(own_prefix)]


ADAPTERS = sorted((REPO / "backends").glob("*.py"))
CLI = sorted(ROOT.glob("_cli*.py"))


def test_adapters_import_fiberexec_only_through_the_seam() -> None:
    """Backends import `fiberexec.backend` (and their own private modules), nothing private
    of the core: what they need is re-exported there."""
    assert len(ADAPTERS) >= 5
    offenders = [o for path in ADAPTERS for o in _seam_offenders(path, "fiberexec.backends._")]
    assert not offenders, f"import these through {SEAM} instead: {offenders}"


#: What the base class held for watching before adapters composed `ExitWatch`.
WATCH_INTERNALS = ("_register", "_report_exit", "_watched", "_watch_lock", "_listeners",
                   "_poll_loop", "_watch_key")


def _inherited_watch_internals(path: Path, root: Path = REPO) -> list[str]:
    """``self.X``/``super().X`` for an X of `WATCH_INTERNALS` that the file does not define."""
    tree = ast.parse(path.read_text())
    own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    own |= {t.attr for n in ast.walk(tree) if isinstance(n, ast.Assign | ast.AnnAssign)
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute)}
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or node.attr not in WATCH_INTERNALS:
            continue
        on_self = isinstance(node.value, ast.Name) and node.value.id == "self"
        on_super = (isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                    and node.value.func.id == "super")
        if on_super or (on_self and node.attr not in own):
            found.append((node.lineno, node.col_offset, node.attr))
    return [f"{path.relative_to(root)}:{line} uses {attr}" for line, _, attr in sorted(found)]


def test_adapters_compose_exit_watch_and_the_base_holds_no_state() -> None:
    """Adapters keep their watch in an `ExitWatch` of their own, not in the base class, which
    is only the interface: no ``__init__``, no attribute set on ``self``."""
    offenders = [o for path in ADAPTERS for o in _inherited_watch_internals(path)]
    assert not offenders, f"compose fiberexec.backend.ExitWatch instead: {offenders}"
    assert Backend.__init__ is object.__init__
    source = (ROOT / "_backend.py").read_text()
    [base] = [n for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.ClassDef) and n.name == "Backend"]
    stored = [f"_backend.py:{n.lineno}" for n in ast.walk(base)
              if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
              and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")]
    assert not stored, f"Backend stores state: {stored}"
    adapters = [p for p in ADAPTERS if "(Backend):" in p.read_text()]
    assert len(adapters) >= 5 and all("ExitWatch()" in p.read_text() or "ExitWatch(key="
                                      in p.read_text() for p in adapters)


def test_the_watch_internals_check_catches_what_it_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("class B(Base):\n"
                   "    def watch(self, h, f):\n"
                   "        self._register(h, f)\n"
                   "        with self._watch_lock:\n"
                   "            super()._report_exit(h, None)\n"
                   "    def _watch_key(self, h):\n"  # defined here: its own, allowed
                   "        return self._watch_key(h)\n")
    found = [o.split(" uses ")[1] for o in _inherited_watch_internals(bad, root=tmp_path)]
    assert found == ["_register", "_watch_lock", "_report_exit"]


def test_cli_imports_fiberexec_only_through_public_modules_and_no_sdk() -> None:
    """The ``fiberexec`` command reaches backends through their capabilities: no Docker or
    Kubernetes client code, no private core module (its own _cli* modules aside)."""
    assert len(CLI) >= 4
    offenders = [o for path in CLI for o in _seam_offenders(path, "fiberexec._cli")]
    sdk = [f"{path.name}:{line} imports {module}" for path in CLI
           for line, module in _imports(path) if module.split(".")[0] in SDKS]
    assert not offenders, f"import these through {SEAM} or fiberexec.config: {offenders}"
    assert not sdk, f"move SDK code into the backend's capabilities: {sdk}"


def test_the_seam_checks_catch_what_they_should(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import docker\nfrom fiberexec._errors import ConfigurationError\n"
                   "from fiberexec import _registry, __version__\n"
                   "import importlib\nimportlib.import_module('kubernetes.client')\n")
    modules = [m for _, m in _imports(bad)]
    assert {"docker", "fiberexec._errors", "fiberexec._registry",
            "kubernetes.client"} <= set(modules)
    assert [m for m in modules if _private_fiberexec(m)] == [
        "fiberexec._errors", "fiberexec._errors.ConfigurationError", "fiberexec._registry"]


@pytest.mark.parametrize("capability", ["launch_master", "probe", "remove_stray"])
def test_missing_capability_names_the_backend_and_the_capability(capability: str) -> None:
    class Plain(Backend):  # a third-party backend that offers no capability
        name = "plain"

    call = {"launch_master": lambda: Plain.launch_master(MasterRequest(("true",), "plain")),
            "probe": Plain.probe, "remove_stray": lambda: Plain.remove_stray(Sweep())}[capability]
    with pytest.raises(CapabilityError, match=rf"the 'plain' backend does not support "
                                              rf"fiberexec \w+ \(it does not implement "
                                              rf"Backend\.{capability}\)"):
        call()


def test_builtin_backends_offer_every_capability() -> None:
    from fiberexec.backend import backend_class

    for name in ("local", "docker", "kubernetes"):
        cls = backend_class(name)
        for capability in ("launch_master", "probe", "remove_stray"):
            assert getattr(cls, capability).__func__ is not getattr(
                Backend, capability).__func__, f"{name} lacks {capability}"


def test_resource_enforcement_is_a_capability_of_the_backend_class(
        caplog: pytest.LogCaptureFixture) -> None:
    """Containers, pods and Slurm jobs get the spec's limits; local processes and SSH hosts
    (only where systemd-run works) may not, and the multiprocessing layer says so, by name."""
    import logging

    from fiberexec.backend import Resources, backend_class
    from fiberexec.backends.local import LocalBackend
    from fiberexec.multiprocessing._backends import note_unenforced

    assert Backend.enforces_resources is False
    assert {n: backend_class(n).enforces_resources for n in available_backends()}.items() >= {
        "docker": True, "kubernetes": True, "slurm": True, "local": False, "ssh": True}.items()

    class Limited(LocalBackend):
        name = "limited"
        enforces_resources = True

    class ThirdParty(LocalBackend):  # any backend that does not declare it
        name = "third-party"

    with Limited() as limited, ThirdParty() as other, caplog.at_level(logging.INFO):
        note_unenforced(other, Resources())
        note_unenforced(limited, Resources(cpu=1, memory=2**30))
        assert caplog.text == ""
        note_unenforced(other, Resources(memory=2**30))  # local's address-space limit holds
        assert caplog.text == ""
        note_unenforced(other, Resources(cpu=2, memory=2**30))
    assert "the third-party backend does not enforce cpu=2;" in caplog.text


# -- set-up as the README says, and what CI runs -------------------------------------------------
def _quick_start() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"## Quick start.*?```bash\n(.*?)```", text, re.DOTALL)
    assert block is not None, "the README lost its Quick start block"
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line]


def test_quick_start_uses_a_virtual_environment() -> None:
    install, tests = _quick_start()
    for command in (install, tests):
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install "), command
        assert "python3 -m pip" not in command  # PEP 668 distributions refuse system pip
    assert install.endswith(".venv/bin/python -m fiberexec.demo")
    assert tests.endswith(".venv/bin/tox")


def test_ci_runs_exactly_the_readme_test_command() -> None:
    script = (REPO / ".ci" / "run").read_text().splitlines()
    commands = [line for line in script if line and not line.startswith(("#", "set ", "cd "))]
    assert commands == [_quick_start()[1]]


def test_setup_check_runs_the_readme_commands_in_ci() -> None:
    tox = (REPO / "tox.ini").read_text()
    assert re.search(r"envlist = .*\bsetup\b", tox)
    assert "commands = bash scripts/check-setup.sh" in tox
    script = (REPO / "scripts" / "check-setup.sh").read_text()
    assert "## Quick start" in script and "--base-only" in script


def test_readme_comparison_has_one_row_per_workload_matching_the_results() -> None:
    import json

    text = (REPO / "README.md").read_text()
    table = text[text.index("## How it compares"):text.index("## Benchmarks")]
    rows = [line.split("|")[1].strip() for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| workload")]
    repeated = sorted({r for r in rows if rows.count(r) > 1})
    assert not repeated, f"the comparison table repeats rows: {repeated}"
    results = json.loads((REPO / "benchmarks" / "results.json").read_text())
    [serves] = [line for line in table.splitlines() if line.startswith("| workers one executor")]
    for shards in (1, 4):
        rate = results["results"][f"simulated_{shards}"]["fiberexec"]["tasks_per_s"]
        assert f"{rate / 1000:.1f}k tasks/s with {shards} shard" in serves, serves


def test_backend_envs_run_whole_folders() -> None:
    """Each backend env runs tests/behaviour, tests/mp and tests/conformance whole: a new
    behaviour test cannot end up running on the local backend only."""
    import configparser

    tox = configparser.ConfigParser(interpolation=None)
    tox.read(REPO / "tox.ini")
    for env in ("k8s", "docker"):
        commands = tox[f"testenv:{env}"]["commands"]
        assert "tests/behaviour tests/mp tests/conformance" in commands, env
        assert not re.search(r"tests/(behaviour|mp|conformance)/\S", commands), (
            f"{env} lists single files of a folder every backend runs whole")
    behaviour = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert not behaviour & {"test_executor.py", "test_failures.py", "test_tls.py"}


def test_every_package_of_the_source_tree_is_in_the_distribution() -> None:
    """Tests import the source tree; users import what pip installed. A package missing from
    ``[tool.setuptools] packages`` passes every test and is absent after ``pip install``."""
    import tomllib

    repo = ROOT.parent
    config = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]
    shipped = set(config["packages"])
    found = {".".join(init.parent.relative_to(repo).parts)
             for init in ROOT.rglob("__init__.py") if "__pycache__" not in init.parts}
    found |= {name for name, where in config.get("package-dir", {}).items()
              if (repo / where / "__init__.py").exists()}
    assert found - shipped == set(), "add these to [tool.setuptools] packages"
