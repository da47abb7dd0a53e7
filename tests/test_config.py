"""Configuration: arguments > FIBEREXEC_* environment > config file > defaults, validated."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fiberexec import ConfigurationError, FiberExecutor, RetryPolicy
from fiberexec._config import ExecutorConfig, describe, resolve


def _resolve(
    tmp_path: Path, environ: dict[str, str] | None = None, **kwargs: Any
) -> ExecutorConfig:
    return resolve(kwargs, environ=environ or {}, cwd=tmp_path)


def test_defaults_without_environment_or_file(tmp_path: Path) -> None:
    config = _resolve(tmp_path)
    assert config.backend == "local"
    assert config.max_workers == (os.cpu_count() or 1) == config.min_workers
    assert config.heartbeat == 1.0 and config.max_task_retries == 2 and config.image is None
    assert config.config_file is None
    assert set(config.sources.values()) == {"default"}
    # one shard at any size: shards share one interpreter lock (benchmarks/README.md)
    assert config.shards == 1 == _resolve(tmp_path, max_workers=4096).shards


def test_environment_sets_what_arguments_leave_open(tmp_path: Path) -> None:
    env = {"FIBEREXEC_BACKEND": "docker", "FIBEREXEC_MAX_WORKERS": "3",
           "FIBEREXEC_IMAGE": "me/app:1", "FIBEREXEC_HEARTBEAT": "0.5",
           "FIBEREXEC_MEMORY": "512Mi", "FIBEREXEC_CPU": "0.5", "FIBEREXEC_GPU": "1",
           "FIBEREXEC_LABELS": "team=ml, run=7", "FIBEREXEC_IDLE_TIMEOUT": "none",
           "FIBEREXEC_BACKEND_OPTIONS": '{"ipc_host": false}',
           "FIBEREXEC_ADDRESS": "tcp://ignored:1"}  # the worker contract's: not a setting
    config = _resolve(tmp_path, env)
    assert (config.backend, config.max_workers, config.min_workers) == ("docker", 3, 3)
    assert config.image == "me/app:1" and config.heartbeat == 0.5 and config.idle_timeout is None
    assert (config.resources.memory, config.resources.cpu, config.resources.gpu) == (2**29, 0.5, 1)
    assert config.labels == {"team": "ml", "run": "7"}
    assert config.backend_options == {"ipc_host": False}
    assert config.sources["backend"] == "environment variable FIBEREXEC_BACKEND"


def test_arguments_beat_environment(tmp_path: Path) -> None:
    env = {"FIBEREXEC_BACKEND": "docker", "FIBEREXEC_MAX_WORKERS": "3",
           "FIBEREXEC_MAX_TASK_RETRIES": "5", "FIBEREXEC_HEARTBEAT": "0.5"}
    config = _resolve(tmp_path, env, backend="local", max_workers=2, max_task_retries=0,
                      heartbeat=3.0)
    assert (config.backend, config.max_workers, config.max_task_retries) == ("local", 2, 0)
    assert config.heartbeat == 3.0
    assert config.sources["max_workers"] == "argument"


def test_pyproject_table_is_read(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.fiberexec]\nmax_workers = 4\nimage = "me/es:2"\n'
        'labels = { team = "rl" }\nstart_retry = { attempts = 3, deadline = 10.0 }\n'
    )
    config = _resolve(tmp_path, {"FIBEREXEC_IMAGE": "from-env"})
    assert config.max_workers == 4 and config.image == "from-env"
    assert config.labels == {"team": "rl"}
    assert config.start_retry == RetryPolicy(attempts=3, deadline=10.0)
    assert config.sources["max_workers"] == f"{tmp_path / 'pyproject.toml'} [tool.fiberexec]"
    assert config.config_file == str(tmp_path / "pyproject.toml")


def test_pyproject_without_table_is_no_config_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert _resolve(tmp_path).config_file is None


def test_dot_file_wins_over_pyproject_and_fiberexec_config_names_another(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.fiberexec]\nmax_workers = 4\n")
    (tmp_path / ".fiberexec.toml").write_text("max_workers = 5\nbackend = 'kubernetes'\n")
    config = _resolve(tmp_path)
    assert (config.max_workers, config.backend) == (5, "kubernetes")
    (tmp_path / "other.toml").write_text("max_workers = 6\n")
    assert _resolve(tmp_path, {"FIBEREXEC_CONFIG": "other.toml"}).max_workers == 6


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FIBEREXEC_MAX_WORKERS": "lots"},
         "max_workers must be an integer greater than 0, got 'lots' "
         "(from environment variable FIBEREXEC_MAX_WORKERS)"),
        ({"FIBEREXEC_MAX_WORKERS": "0"}, "max_workers must be greater than 0, got '0'"),
        ({"FIBEREXEC_HEARTBEAT": "-1"},
         "heartbeat must be a number of seconds > 0, got '-1' (from environment variable"),
        ({"FIBEREXEC_MEMORY": "heaps"}, "memory must be bytes > 0 or a quantity like '512Mi'"),
        ({"FIBEREXEC_LABELS": "team"}, "labels must be comma-separated key=value pairs"),
        ({"FIBEREXEC_BACKEND_OPTIONS": "{"}, "backend_options must be a JSON object"),
        ({"FIBEREXEC_BACKEND": "dokcer"},
         "unknown backend 'dokcer' (from environment variable FIBEREXEC_BACKEND); did you mean "
         "'docker'? known backends: docker, kubernetes, local, slurm, ssh"),
        ({"FIBEREXEC_MAX_WORKERS": "2", "FIBEREXEC_MIN_WORKERS": "3"},
         "min_workers must be between 0 and max_workers=2, got 3 "
         "(from environment variable FIBEREXEC_MIN_WORKERS)"),
        ({"FIBEREXEC_CONFIG": "missing.toml"}, "FIBEREXEC_CONFIG must name an existing TOML file"),
    ],
)
def test_bad_environment_names_key_source_value_and_rule(
    tmp_path: Path, env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        _resolve(tmp_path, env)
    assert message in str(info.value)


def test_bad_file_values_and_unknown_keys(tmp_path: Path) -> None:
    (tmp_path / ".fiberexec.toml").write_text("max_workers = 'four'\n")
    with pytest.raises(ConfigurationError, match=r"max_workers must be an integer greater than 0, "
                       r"got 'four' \(from .*\.fiberexec\.toml top level\)"):
        _resolve(tmp_path)
    (tmp_path / ".fiberexec.toml").write_text("max_wrokers = 4\n")
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['max_wrokers'\] in .*"
                       r"allowed: \[.*'backend', 'backend_options'"):
        _resolve(tmp_path)
    (tmp_path / ".fiberexec.toml").write_text("max_workers = \n")
    with pytest.raises(ConfigurationError, match="cannot read config file"):
        _resolve(tmp_path)


def test_bad_arguments_keep_the_stdlib_wording(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_workers must be greater than 0"):
        _resolve(tmp_path, max_workers=0)
    with pytest.raises(ConfigurationError, match="shards must be between 1 and max_workers=2"):
        _resolve(tmp_path, max_workers=2, shards=3)


def test_describe_lists_every_setting_with_its_source(tmp_path: Path) -> None:
    rows = {k: (v, s) for k, v, s in describe(_resolve(tmp_path, {"FIBEREXEC_GPU": "2"}))}
    assert rows["gpu"] == ("2", "environment variable FIBEREXEC_GPU")
    assert rows["image"] == ("none", "default")
    assert rows["memory"] == ("none (no limit)", "default")


def test_workdir_default_is_shown_as_the_current_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    rows = {k: (v, s) for k, v, s in describe(_resolve(tmp_path))}
    assert rows["workdir"] == (f"{tmp_path} (the current directory)", "default")
    given = {k: (v, s) for k, v, s in describe(_resolve(tmp_path, workdir="/srv/job"))}
    assert given["workdir"] == ("/srv/job", "argument")


def test_rows_hold_typed_values(tmp_path: Path) -> None:
    from fiberexec.config import rows as config_rows

    env = {"FIBEREXEC_MAX_WORKERS": "3", "FIBEREXEC_HEARTBEAT": "0.5", "FIBEREXEC_MEMORY": "1Ki",
           "FIBEREXEC_PORTS": "40000-40009", "FIBEREXEC_LABELS": "team=ml"}
    rows = {row.key: row for row in config_rows(_resolve(tmp_path, env), cwd="/here")}
    assert rows["max_workers"].value == 3 and rows["heartbeat"].value == 0.5
    assert rows["memory"].value == 1024 and rows["ports"].value == [40000, 40009]
    assert rows["labels"].value == {"team": "ml"} and rows["image"].value is None
    assert rows["start_retry"].value["attempts"] == RetryPolicy().attempts
    assert (rows["cpu"].value, rows["cpu"].note) == (None, "no limit")
    assert (rows["workdir"].value, rows["workdir"].note) == ("/here", "the current directory")


# -- backend names are checked at construction, whatever their source --------------------------
KNOWN = "known backends: docker, kubernetes, local, slurm, ssh"


def test_misspelt_backend_argument_fails_at_construction_with_a_suggestion() -> None:
    with pytest.raises(ValueError) as info:
        FiberExecutor(1, backend="dokcer")  # not at the first submit
    assert str(info.value).startswith(
        f"unknown backend 'dokcer' (from the backend= argument); did you mean 'docker'? {KNOWN}")
    with pytest.raises(ConfigurationError, match="did you mean 'kubernetes'"):
        FiberExecutor(1, backend="Kubernetes")
    with pytest.raises(ConfigurationError, match=rf"unknown backend 'zzz' \(from the backend= "
                       rf"argument\); {KNOWN} \(or register"):
        FiberExecutor(1, backend="zzz")


def test_misspelt_backend_from_any_source_gets_the_same_message(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".fiberexec.toml").write_text("backend = 'slrum'\n")
    with pytest.raises(ValueError) as info:
        FiberExecutor(1)
    assert str(info.value).startswith(
        f"unknown backend 'slrum' (from {tmp_path / '.fiberexec.toml'} top level); "
        f"did you mean 'slurm'? {KNOWN}")
    monkeypatch.setenv("FIBEREXEC_BACKEND", "dokcer")
    with pytest.raises(ValueError, match=r"unknown backend 'dokcer' \(from environment "
                       r"variable FIBEREXEC_BACKEND\); did you mean 'docker'\?"):
        FiberExecutor(1)


def test_a_backend_instance_needs_no_registered_name(tmp_path: Path) -> None:
    from fiberexec.backends.local import LocalBackend

    class Mine(LocalBackend):
        name = "mine"

    with Mine() as backend:
        config = _resolve(tmp_path, backend=backend)
        assert (config.backend, config.sources["backend"]) == ("mine", "argument")


def test_backend_name_check_imports_no_backend() -> None:
    program = ("import sys\nfrom fiberexec import FiberExecutor\n"
               "FiberExecutor(1, backend='docker').shutdown()\n"
               "print(sorted(m for m in sys.modules if m.startswith(('docker', "
               "'fiberexec.backends'))))\n")
    out = subprocess.run([sys.executable, "-c", program], text=True, capture_output=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


# -- max_workers keeps the standard library's words, then says where the value came from ---------
@pytest.mark.parametrize("bad", [0, -1])
def test_max_workers_message_starts_with_the_stdlib_text(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: int) -> None:
    monkeypatch.chdir(tmp_path)
    stdlib = "max_workers must be greater than 0"
    with pytest.raises(ValueError) as info:
        FiberExecutor(bad)
    assert str(info.value) == f"{stdlib}, got {bad} (from the max_workers= argument)"
    monkeypatch.setenv("FIBEREXEC_MAX_WORKERS", str(bad))
    with pytest.raises(ValueError) as info:
        FiberExecutor()
    assert str(info.value).startswith(stdlib)
    assert str(info.value).endswith("(from environment variable FIBEREXEC_MAX_WORKERS)")
    monkeypatch.delenv("FIBEREXEC_MAX_WORKERS")
    (tmp_path / ".fiberexec.toml").write_text(f"max_workers = {bad}\n")
    with pytest.raises(ValueError) as info:
        FiberExecutor()
    assert str(info.value).startswith(f"{stdlib}, got {bad} (from {tmp_path}")


def test_executor_reads_environment_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FIBEREXEC_MAX_WORKERS", "3")
    monkeypatch.setenv("FIBEREXEC_BACKEND", "kubernetes")
    ex = FiberExecutor()  # no I/O before the first submit, so no cluster is needed
    monkeypatch.setenv("FIBEREXEC_MAX_WORKERS", "5")
    assert ex.max_workers == 3 and ex._config.backend == "kubernetes"
    ex.shutdown()


def test_backend_switches_by_environment_with_no_code_change(tmp_path: Path) -> None:
    program = (
        "from fiberexec import FiberExecutor\n"
        "with FiberExecutor() as ex:\n"
        "    print(ex._config.backend, ex.max_workers, ex.submit(abs, -7).result())\n"
    )
    env = {**os.environ, "FIBEREXEC_BACKEND": "local", "FIBEREXEC_MAX_WORKERS": "1"}
    out = subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path, text=True,
                         capture_output=True, timeout=60, check=True).stdout
    assert out.split() == ["local", "1", "7"]


# ------------------------------------------------------------------ one source per setting

def test_the_executor_signature_takes_every_setting_and_nothing_unlisted() -> None:
    import inspect

    from fiberexec._config import BY_KEY, NOT_SETTINGS

    params = inspect.signature(FiberExecutor.__init__).parameters
    extras = {"self", "progress", "mp_context", *NOT_SETTINGS}
    assert set(params) - extras == set(BY_KEY)
    for key, setting in BY_KEY.items():
        default = params[key].default
        assert any(default is u or default == u for u in setting.unset), (
            f"{key}={default!r} by default would count as given and hide the environment"
        )


def test_config_defaults_and_docstring_come_from_the_settings_table() -> None:
    import dataclasses

    from fiberexec._config import SETTINGS

    fields = {f.name: f for f in dataclasses.fields(ExecutorConfig)}
    doc = " ".join((FiberExecutor.__doc__ or "").split())
    for s in SETTINGS:
        assert " ".join(f"{s.key}: {s.doc}".split()) in doc
        if s.key in ("cpu", "memory", "gpu"):
            assert getattr(ExecutorConfig.__dataclass_fields__["resources"].default_factory(),
                           s.key) == s.default
            continue
        field = fields[s.key]
        if field.default_factory is not dataclasses.MISSING:
            assert field.default_factory() == s.default, s.key
        elif field.default is not dataclasses.MISSING and s.default is not None:
            assert field.default == s.default, s.key
    assert "\n\n    Options left as ``None``" in (FiberExecutor.__doc__ or "")  # Args: not cut


@pytest.mark.parametrize(("argument", "value", "rule"), [
    ("image", 5, "image must be a non-empty string"),
    ("memory", "lots", "memory must be bytes > 0 or a quantity like '512Mi'"),
    ("gpu", -1, "gpu must be >= 0"),
    ("labels", {1: "x"}, "labels must be a table of strings"),
    ("backend_options", ["x"], "backend_options must be a table"),
])
def test_arguments_obey_the_rules_the_environment_does(
    argument: str, value: Any, rule: str
) -> None:
    with pytest.raises(ConfigurationError, match=f"{rule}.*from the {argument}= argument"):
        FiberExecutor(2, **{argument: value})


def test_resolve_refuses_a_key_that_is_no_setting(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown settings \\['heartbeats'\\]"):
        _resolve(tmp_path, heartbeats=1.0)


def test_the_readme_table_lists_every_setting_with_its_variable() -> None:
    from fiberexec._config import SETTINGS

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    rows = [line for line in readme.splitlines() if line.startswith("| `")]
    for s in SETTINGS:
        assert any(f"`{s.key}`" in row.split("|")[1] and f"`{s.env}`" in row for row in rows), (
            f"README's configuration table has no row for {s.key} ({s.env})"
        )


@pytest.mark.parametrize(("given", "expected"), [
    (True, "127.0.0.1:0"), ("on", "127.0.0.1:0"), (" ON ", "127.0.0.1:0"), ("1", "127.0.0.1:0"),
    (False, None), ("off", None), ("", None), ("none", None),
    ("0.0.0.0:8265", "0.0.0.0:8265"), ("localhost:0", "localhost:0"),
    ("[::1]:8265", "[::1]:8265"),
])
def test_dashboard_is_on_off_or_an_address(tmp_path: Path, given: Any, expected: str) -> None:
    env = {"FIBEREXEC_DASHBOARD": given} if isinstance(given, str) else None
    config = _resolve(tmp_path, env) if env else _resolve(tmp_path, dashboard=given)
    assert config.dashboard == expected


def test_dashboard_defaults_to_off_and_an_argument_beats_the_environment(
    tmp_path: Path,
) -> None:
    assert _resolve(tmp_path).dashboard is None
    assert _resolve(tmp_path, {"FIBEREXEC_DASHBOARD": "on"}, dashboard=False).dashboard is None
    (tmp_path / ".fiberexec.toml").write_text("dashboard = '127.0.0.1:8265'\n")
    assert _resolve(tmp_path).dashboard == "127.0.0.1:8265"


@pytest.mark.parametrize("bad", ["8265", "host:", ":8265", "host:http", "host:70000", "maybe"])
def test_a_bad_dashboard_value_names_what_is_allowed(tmp_path: Path, bad: str) -> None:
    with pytest.raises(ConfigurationError, match=(
            rf"dashboard must be on, off, or host:port such as 127.0.0.1:8265 .*got '{bad}' "
            r"\(from environment variable FIBEREXEC_DASHBOARD\)")):
        _resolve(tmp_path, {"FIBEREXEC_DASHBOARD": bad})
    with pytest.raises(ConfigurationError, match=r"got 8265 \(from the dashboard= argument\)"):
        _resolve(tmp_path, dashboard=8265)
