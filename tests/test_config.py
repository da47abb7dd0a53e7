"""Configuration: arguments > FIBEREXEC_* environment > config file > defaults, validated."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fiberexec import ConfigurationError, FiberExecutor, RetryPolicy, _config
from fiberexec._config import ExecutorConfig, describe, diagnose, resolve
from fiberexec._errors import ConfigurationTypeError
from tests.conftest import ExecutorFactory


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
           "FIBEREXEC_ENV": "OMP_NUM_THREADS=1, MY_FLAG=on",
           "FIBEREXEC_ADDRESS": "tcp://ignored:1"}  # the worker contract's: not a setting
    config = _resolve(tmp_path, env)
    assert (config.backend, config.max_workers, config.min_workers) == ("docker", 3, 3)
    assert config.image == "me/app:1" and config.heartbeat == 0.5 and config.idle_timeout is None
    assert (config.resources.memory, config.resources.cpu, config.resources.gpu) == (2**29, 0.5, 1)
    assert config.labels == {"team": "ml", "run": "7"}
    assert config.backend_options == {"ipc_host": False}
    assert config.env == {"OMP_NUM_THREADS": "1", "MY_FLAG": "on"}
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


def test_a_config_file_changed_between_executors_is_read_afresh(tmp_path: Path) -> None:
    """The parse of a config file is kept (an executor per generation does not parse a
    long pyproject.toml each time), but never outlives the file's content: a rewrite of
    the same size an instant later is read, and a value taken from it is the caller's."""
    path = tmp_path / "pyproject.toml"
    path.write_text('[tool.fiberexec]\nmax_workers = 4\nlabels = { team = "rl" }\n')
    first = _resolve(tmp_path)
    assert (first.max_workers, first.labels) == (4, {"team": "rl"})
    path.write_text('[tool.fiberexec]\nmax_workers = 5\nlabels = { team = "ml" }\n')
    second = _resolve(tmp_path)
    assert (second.max_workers, second.labels) == (5, {"team": "ml"})
    raw = _config.file_values(path, "[tool.fiberexec]")
    raw["labels"]["team"] = "changed by its reader"
    assert _config.file_values(path, "[tool.fiberexec]")["labels"] == {"team": "ml"}


def test_pyproject_without_table_is_no_config_file(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert _resolve(tmp_path).config_file is None


def test_a_pyproject_others_cannot_read_either_is_theirs_to_fix(tmp_path: Path) -> None:
    """A TOML error in a pyproject.toml without our table is the other tools' business: no
    executor fails for it. With our table in it, the error is ours to say."""
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = 1.0.0\n')
    assert _resolve(tmp_path).config_file is None
    (tmp_path / "pyproject.toml").write_text('[project]\nversion = 1.0.0\n\n'
                                             '[tool.fiberexec]\nmax_workers = 4\n')
    with pytest.raises(ConfigurationError, match="cannot read config file .*pyproject.toml"):
        _resolve(tmp_path)


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
         "heartbeat must be a number of seconds >= 0.01, got '-1' (from environment variable"),
        ({"FIBEREXEC_MEMORY": "heaps"}, "memory must be bytes > 0 or a quantity like '512Mi'"),
        ({"FIBEREXEC_LABELS": "team"}, "labels must be comma-separated key=value pairs"),
        ({"FIBEREXEC_BACKEND_OPTIONS": "{"}, "backend_options must be a JSON object"),
        ({"FIBEREXEC_ENV": "FIBEREXEC_SECRET=x"},
         "env must be environment variable names, without '=' and not the executor's own "
         "FIBEREXEC_* ones; 'FIBEREXEC_SECRET' is not one"),
        ({"FIBEREXEC_ENV": "novalue"}, "env must be a dict of names to strings (argument)"),
        ({"FIBEREXEC_SILENCE_TIMEOUT": "1"},
         "silence_timeout must be at least twice the heartbeat, 2.0s, got 1.0 (from "
         "environment variable FIBEREXEC_SILENCE_TIMEOUT; heartbeat=1.0 from default)"),
        ({"FIBEREXEC_HEARTBEAT": "0.000001"}, "heartbeat must be at least 0.01 seconds"),
        ({"FIBEREXEC_START_RETRY": '{"attempts": "3"}'},
         "retry attempts must be a whole number >= 1, got '3'"),
        ({"FIBEREXEC_START_RETRY": '{"initial": -1}'},
         "retry initial must be a number of seconds >= 0, got -1"),
        ({"FIBEREXEC_START_RETRY": '{"deadline": "nan"}'},
         "retry deadline must be a number of seconds > 0, got 'nan'"),
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
                       r"did you mean 'max_wrokers' -> 'max_workers'\? "
                       r"allowed: \[.*'backend', 'backend_options'"):
        _resolve(tmp_path)
    (tmp_path / ".fiberexec.toml").write_text("[tool.fiberexec]\nmax_workers = 4\n")
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['tool'\] .* a "
                       r"\[tool.fiberexec\] table belongs in pyproject.toml"):
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

    env = {"FIBEREXEC_MAX_WORKERS": "3", "FIBEREXEC_HEARTBEAT": "0.5", "FIBEREXEC_MEMORY": "64Mi",
           "FIBEREXEC_PORTS": "40000-40009", "FIBEREXEC_LABELS": "team=ml"}
    rows = {row.key: row for row in config_rows(_resolve(tmp_path, env), cwd="/here")}
    assert rows["max_workers"].value == 3 and rows["heartbeat"].value == 0.5
    assert rows["memory"].value == 64 << 20 and rows["ports"].value == [40000, 40009]
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
    ("memory", 100, "memory must be at least 16Mi per worker, as bytes or a quantity like "
                    r"'512Mi' \(a bare number is bytes: for 100 MiB write '100Mi'\), got 100"),
    ("memory", "8M", "memory must be at least 16Mi per worker, as bytes or a quantity like "
                     "'512Mi', got '8M'"),
    ("gpu", -1, "gpu must be >= 0"),
    ("labels", {1: "x"}, r"labels must be a dict of strings \(argument\)"),
    ("backend_options", ["x"], r"backend_options must be a dict \(argument\)"),
    ("backend_options", 5, r"backend_options must be a dict \(argument\)"),
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
    (False, None), ("off", None), ("", None), ("none", None), (1, "127.0.0.1:0"), (0, None),
    ("0.0.0.0:8265", "0.0.0.0:8265"), ("localhost:0", "localhost:0"),
    ("[::1]:8265", "[::1]:8265"),
])
def test_dashboard_is_on_off_or_an_address(tmp_path: Path, given: Any, expected: str) -> None:
    env = {"FIBEREXEC_DASHBOARD": given} if isinstance(given, str) else None
    config = _resolve(tmp_path, env) if env else _resolve(tmp_path, dashboard=given)
    assert config.dashboard == expected


@pytest.mark.parametrize(("given", "expected"), [(True, True), (1, True), (0, False)])
def test_a_flag_argument_takes_1_and_0_as_its_rule_says(
        tmp_path: Path, given: Any, expected: bool) -> None:
    assert _resolve(tmp_path, observe=given).observe is expected
    with pytest.raises(ConfigurationError,
                       match=r"observe must be true or false \(or 1/0, yes/no, on/off\), got 2"):
        _resolve(tmp_path, observe=2)


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


# -- an argument is the value itself; a string is text only the environment and file give ------
@pytest.mark.parametrize("executor", [ProcessPoolExecutor, ThreadPoolExecutor, FiberExecutor])
def test_max_workers_as_a_string_is_a_type_error_as_in_the_stdlib(
        executor: type[Executor], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError):
        executor("2")  # type: ignore[call-arg]


def test_a_string_argument_is_refused_while_the_environment_is_parsed(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationTypeError) as info:
        _resolve(tmp_path, max_workers="2")
    assert str(info.value) == (
        "max_workers must be an int, got '2' (str, from the max_workers= argument); text is "
        "parsed only from FIBEREXEC_MAX_WORKERS or the config file")
    with pytest.raises(ConfigurationTypeError, match=r"heartbeat must be a number \(int or "
                       r"float\), got '1' \(str, from the heartbeat= argument\)"):
        _resolve(tmp_path, heartbeat="1")
    assert _resolve(tmp_path, {"FIBEREXEC_MAX_WORKERS": " 2 "}).max_workers == 2
    assert _resolve(tmp_path, heartbeat=2).heartbeat == 2.0  # an int is a number


def test_a_backend_of_the_wrong_type_names_its_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationTypeError, match=re.escape(
            "backend must be a backend name (str) or a Backend instance, got 5 (int, from the "
            "backend= argument)")):
        _resolve(tmp_path, backend=5)


def test_the_executor_names_a_bad_backends_source() -> None:
    with pytest.raises(ConfigurationTypeError,
                       match=re.escape("(int, from the backend= argument)")):
        FiberExecutor(1, backend=5)  # type: ignore[arg-type]


def test_a_port_out_of_range_is_said_to_be(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(
            "got '127.0.0.1:99999' (from the dashboard= argument); port 99999 is out of "
            "range: a port is 0-65535")):
        _resolve(tmp_path, dashboard="127.0.0.1:99999")


@pytest.mark.parametrize(("given", "message"), [
    ({"attempts": 0},
     "start_retry: retry attempts must be >= 1, got 0 (from the start_retry= argument)"),
    ({"attempt": 3},
     "start_retry must be a RetryPolicy, or a dict, table or JSON object of its fields "
     "(attempts, deadline, initial, maximum, jitter, deadline_without_workers), got "
     "{'attempt': 3} (from the start_retry= argument); 'attempt' is no field of RetryPolicy; "
     "did you mean 'attempts'?"),
])
def test_a_bad_retry_policy_is_said_once(tmp_path: Path, given: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        _resolve(tmp_path, start_retry=given)
    assert str(info.value) == message


# -- FIBEREXEC_* variables that are no setting ---------------------------------------------------
#: Names this repository uses on purpose as misspellings (the checks below, and the docs).
MISSPELT = {"FIBEREXEC_MAX_WORKER", "FIBEREXEC_WORKERS", "FIBEREXEC_HEARTBEATS",
            "FIBEREXEC_NOTHING_LIKE_IT"}


@pytest.fixture
def warned(monkeypatch: pytest.MonkeyPatch,
           caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    """The ``fiberexec`` logger's warnings (``.messages``), as if in a fresh process."""
    monkeypatch.setattr(_config, "_warned", set())
    caplog.set_level(logging.WARNING, logger="fiberexec")
    return caplog


def test_a_misspelt_variable_is_a_warning_naming_the_nearest_setting(
        tmp_path: Path, warned: pytest.LogCaptureFixture) -> None:
    env = {"FIBEREXEC_MAX_WORKER": "2", "FIBEREXEC_WORKERS": "3",
           "FIBEREXEC_NOTHING_LIKE_IT": "1"}
    config = _resolve(tmp_path, env)
    assert config.max_workers == (os.cpu_count() or 1)  # ignored, as before: but said
    advice = "`fiberexec info` lists the settings and their variables"
    assert warned.messages == [
        f"environment variable FIBEREXEC_MAX_WORKER is no fiberexec setting and is ignored; "
        f"did you mean FIBEREXEC_MAX_WORKERS? {advice}",
        f"environment variable FIBEREXEC_NOTHING_LIKE_IT is no fiberexec setting and is "
        f"ignored; {advice}",
        f"environment variable FIBEREXEC_WORKERS is no fiberexec setting and is ignored; "
        f"did you mean FIBEREXEC_MAX_WORKERS or FIBEREXEC_MIN_WORKERS? {advice}",
    ]
    _resolve(tmp_path, env)
    _resolve(tmp_path, {"FIBEREXEC_HEARTBEATS": "1"})
    assert len(warned.messages) == 4  # once per name in a process


def unknown_here() -> tuple[list[str], dict[str, list[str]]]:
    """In a worker: its FIBEREXEC_* variables, and those an executor made there warns of."""
    mine = sorted(k for k in os.environ if k.startswith("FIBEREXEC_"))
    return mine, _config.unknown_variables(os.environ)


def test_a_workers_own_variables_are_never_warned_about(
        make_executor: ExecutorFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A task that makes an executor in a worker (or a launcher's child) resolves there."""
    monkeypatch.setenv("FIBEREXEC_HEARTBEAT", "0.5")  # a setting, and the worker's too
    ex = make_executor(2, max_tasks_per_child=1)  # the second task: a fresh worker
    for _ in range(2):
        names, unknown = ex.submit(unknown_here).result(timeout=60)
        assert {"FIBEREXEC_ADDRESS", "FIBEREXEC_SECRET", "FIBEREXEC_WORKER_ID"} <= set(names)
        assert unknown == {}


def test_every_fiberexec_variable_in_the_repository_is_known() -> None:
    """A name fiberexec, its backends, tests or scripts set or read is a setting's or an
    internal one: a worker, launcher or ``fiberexec run`` never warns of its own."""
    root = Path(__file__).resolve().parents[1]
    places = [root / d for d in ("fiberexec", "backends", "tests", "scripts", "benchmarks",
                                 "examples", "docs", ".ci")]
    files = [p for d in places if d.is_dir() for p in d.rglob("*") if p.is_file()]
    files += [root / n for n in ("tox.ini", "Dockerfile", "pyproject.toml", "README.md")]
    used = {name for path in files if path.suffix not in (".pyc", ".png")
            for name in re.findall(r"FIBEREXEC_[A-Z0-9_]*[A-Z0-9](?![A-Za-z0-9_{])",
                                   path.read_text(errors="replace"))}  # not a prefix
    assert len(used) > 40  # the scan found the repository's names
    unknown = set(_config.unknown_variables(dict.fromkeys(used, ""))) - MISSPELT
    assert not unknown, f"add these to fiberexec._config.INTERNAL_VARIABLES: {sorted(unknown)}"


# -- diagnose: every bad value, not the first ----------------------------------------------------
def test_diagnose_flags_every_bad_value_and_keeps_the_rest(tmp_path: Path) -> None:
    (tmp_path / ".fiberexec.toml").write_text("image = 'me/app:1'\nshards = 99\n")
    env = {"FIBEREXEC_MAX_WORKERS": "lots", "FIBEREXEC_HEARTBEAT": "soon",
           "FIBEREXEC_BACKEND": "dokcer", "FIBEREXEC_GPU": "1"}
    config, problems = diagnose(env, tmp_path)
    assert {p.key: (p.value, p.source) for p in problems} == {
        "max_workers": ("lots", "environment variable FIBEREXEC_MAX_WORKERS"),
        "heartbeat": ("soon", "environment variable FIBEREXEC_HEARTBEAT"),
        "backend": ("dokcer", "environment variable FIBEREXEC_BACKEND"),
        "shards": (99, f"{tmp_path / '.fiberexec.toml'} top level"),
    }
    for problem in problems:  # each as resolve says it
        if problem.key != "shards":
            with pytest.raises(ConfigurationError) as info:
                _resolve(tmp_path, {problem.source.split()[-1]: str(problem.value)})
            assert str(info.value) == problem.message
    assert (config.max_workers, config.heartbeat, config.backend, config.shards) == (
        os.cpu_count() or 1, 1.0, "local", 1)
    assert (config.image, config.resources.gpu) == ("me/app:1", 1)
    assert config.sources["max_workers"] == "default"


def test_diagnose_reads_past_a_bad_config_file(tmp_path: Path) -> None:
    config, problems = diagnose({"FIBEREXEC_CONFIG": "missing.toml", "FIBEREXEC_GPU": "2"},
                                tmp_path)
    [problem] = problems
    assert (problem.key, problem.value) == ("config file", "missing.toml")
    assert "FIBEREXEC_CONFIG must name an existing TOML file" in problem.message
    assert config.resources.gpu == 2 and config.config_file is None


def test_a_backend_option_the_backend_does_not_take_is_named_with_the_nearest() -> None:
    from fiberexec import FiberExecutor

    ex = FiberExecutor(1, backend_options={"capture_outpt": True})
    with pytest.raises(ConfigurationError, match=(
            r"backend_options has 'capture_outpt', which the 'local' backend does not take; "
            r"did you mean 'capture_output'\? it takes capture_output, launcher, python")):
        ex.submit(abs, -1)
    ex.shutdown()
