"""Executor configuration: resolved once into an immutable value that is passed down.

Each setting comes from the first of these that gives it::

    explicit argument  >  FIBEREXEC_<KEY> environment variable  >  config file  >  default

The config file is the one ``FIBEREXEC_CONFIG`` names, else ``.fiberexec.toml`` (top-level
keys), else the ``[tool.fiberexec]`` table of ``pyproject.toml``, all in the current directory.
Every value is validated where it enters; an error names the key, where the value came from,
the value and what is allowed. Nothing below reads the environment after `resolve` returns.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import difflib
import json
import logging
import os
import textwrap
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiberexec import _contract, _fiber_keys
from fiberexec._backend import Backend, Resources, parse_memory
from fiberexec._errors import ConfigurationError, ConfigurationTypeError
from fiberexec._protocol import MAX_MESSAGE
from fiberexec._registry import check_backend_name
from fiberexec._retry import RetryPolicy
from fiberexec._tls import TLSOptions

log = logging.getLogger("fiberexec")
ENV_PREFIX = "FIBEREXEC_"
ENV_BACKEND = "FIBEREXEC_BACKEND"
ENV_CONFIG = "FIBEREXEC_CONFIG"
FILE_NAME = ".fiberexec.toml"
DEFAULT_MAX_MESSAGE = MAX_MESSAGE
ARGUMENT, DEFAULT = "argument", "default"
CURRENT_DIRECTORY = "the current directory"


@dataclass(frozen=True)
class ExecutorConfig:
    max_workers: int
    min_workers: int
    backend: str
    initializer: Callable[..., object] | None = None
    initargs: tuple[Any, ...] = ()
    max_tasks_per_child: int | None = None
    max_task_retries: int = 2
    idle_timeout: float | None = None
    shards: int = 1
    image: str | None = None
    workdir: str | None = None
    resources: Resources = field(default_factory=Resources)
    labels: Mapping[str, str] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)  # set in each worker's environment
    heartbeat: float = 1.0
    silence_timeout: float = 30.0
    start_timeout: float = 120.0
    start_retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_message_size: int = DEFAULT_MAX_MESSAGE
    backend_options: Mapping[str, Any] = field(default_factory=dict)
    tls: TLSOptions | None = None
    ports: tuple[int, int] | None = None  # the range worker channels listen in (inclusive)
    arg_cache: int = 256 << 20  # bytes of large arguments each worker keeps; 0: none
    output: str | None = None  # "forward", "inherit", "off", a directory; None: by backend
    observe: bool = False  # serve snapshots to `fiberexec top` on a loopback endpoint
    dashboard: str | None = None  # "host:port" (port 0: any free one) the dashboard serves on
    #: setting -> where its value came from ("argument", "default", an env var, a file)
    sources: Mapping[str, str] = field(default_factory=dict, compare=False)
    config_file: str | None = field(default=None, compare=False)


class _Invalid(Exception):
    """A value broke a rule; ``rule`` says what is allowed, ``hint`` (if any) what is wrong
    with this value. ``whole``: the rule is a complete sentence that already shows the value
    (a `RetryPolicy`'s own check)."""

    def __init__(self, rule: str, *, hint: str = "", whole: bool = False) -> None:
        super().__init__(rule)
        self.rule, self.hint, self.whole = rule, hint, whole


Parser = Callable[[object], Any]


def _int(minimum: int, rule: str | None = None) -> Parser:
    def parse(value: object) -> int:
        if isinstance(value, str):
            try:
                value = int(value.strip())
            except ValueError:
                raise _Invalid(f"an integer {rule or f'>= {minimum}'}") from None
        if not isinstance(value, int) or isinstance(value, bool):
            raise _Invalid(f"an integer {rule or f'>= {minimum}'}")
        if value < minimum:
            raise _Invalid(rule or f">= {minimum}")
        return value

    return parse


def _seconds(value: object) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise _Invalid("a number of seconds > 0") from None
    if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
        raise _Invalid("a number of seconds > 0")
    return float(value)


def _heartbeat(value: object) -> float:
    try:
        return _seconds(value)
    except _Invalid:  # (the rule `_check_heartbeat` holds it to, said at once)
        raise _Invalid(f"a number of seconds >= {HEARTBEAT_MIN}") from None


def _cpu(value: object) -> float:
    try:
        return _seconds(value)
    except _Invalid:
        raise _Invalid("a number of CPUs > 0, e.g. 1 or 0.5") from None


def _memory(value: object) -> int | None:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if not isinstance(value, int | str) or isinstance(value, bool):
        raise _Invalid("bytes or a quantity like '512Mi' or '2G'")
    try:
        return parse_memory(value)
    except ConfigurationError:
        raise _Invalid("bytes > 0 or a quantity like '512Mi' or '2G'") from None


MIN_WORKER_MEMORY = 16 << 20  # no worker's interpreter runs in less, on any backend


def _worker_memory(value: object) -> int | None:
    size = _memory(value)
    if size is not None and size < MIN_WORKER_MEMORY:
        number = value if isinstance(value, int) else str(value).strip()
        hint = (f" (a bare number is bytes: for {number} MiB write '{number}Mi')"
                if str(number).isdigit() else "")
        raise _Invalid(f"at least 16Mi per worker, as bytes or a quantity like '512Mi'{hint}")
    return size


def _cache_size(value: object) -> int:
    if value in (0, "0"):
        return 0
    try:
        size = _memory(value)
    except _Invalid:
        raise _Invalid("0 (off), bytes, or a quantity like '256Mi'") from None
    return int(size or 0)


def _ports(value: object) -> tuple[int, int]:
    rule = "a port like 40000 or a range like 40000-40999, within 1-65535"
    if isinstance(value, int) and not isinstance(value, bool):
        low = high = value
    elif isinstance(value, tuple) and len(value) == 2:
        low, high = value
    elif isinstance(value, str):
        first, _, last = value.strip().partition("-")
        try:
            low, high = int(first), int(last or first)
        except ValueError:
            raise _Invalid(rule) from None
    else:
        raise _Invalid(rule)
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 65535):
        raise _Invalid(rule)
    return low, high


OUTPUT_MODES = ("forward", "inherit", "off")


def _output(value: object) -> str:
    rule = (f"one of {', '.join(map(repr, OUTPUT_MODES))} or a directory path containing "
            f"'/' (e.g. './worker-output')")
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise _Invalid(rule)
    value = value.strip()
    if value.lower() in OUTPUT_MODES:
        return value.lower()
    if "/" not in value:
        raise _Invalid(rule)
    if os.path.exists(value) and not os.path.isdir(value):
        raise _Invalid(f"{rule}; {value!r} exists and is not a directory")
    return value


def _flag(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if type(value) is int and value in (0, 1):  # (``observe=1``, as the rule says)
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _FLAGS:
        return _FLAGS[value.strip().lower()]
    raise _Invalid("true or false (or 1/0, yes/no, on/off)")


_FLAGS = {"1": True, "true": True, "yes": True, "on": True,
          "0": False, "false": False, "no": False, "off": False}


DASHBOARD_LOOPBACK = "127.0.0.1:0"


def _dashboard(value: object) -> str | None:
    """On (loopback, any free port), off, or ``host:port``; kept as ``host:port``."""
    rule = ("on, off, or host:port such as 127.0.0.1:8265 or [::1]:8265 (port 0: any free "
            "port)")
    if isinstance(value, bool) or (type(value) is int and value in (0, 1)):
        return DASHBOARD_LOOPBACK if value else None
    if not isinstance(value, str):
        raise _Invalid(rule)
    text = value.strip()
    if text.lower() in ("", "none"):
        return None
    if text.lower() in _FLAGS:
        return DASHBOARD_LOOPBACK if _FLAGS[text.lower()] else None
    host, sep, port = text.rpartition(":")
    host = host.strip().removeprefix("[").removesuffix("]")
    if not sep or not host or not port.strip().isdigit():
        raise _Invalid(rule)
    if int(port) > 65535:
        raise _Invalid(rule, hint=f"port {int(port)} is out of range: a port is 0-65535")
    return f"[{host}]:{int(port)}" if ":" in host else f"{host}:{int(port)}"


def _text(value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _Invalid("a non-empty string")
    return value.strip()


def _backend(value: object) -> str:
    """A backend's name; an instance (given as an argument) stands for its own name."""
    if isinstance(value, Backend):
        return value.name
    try:
        return _text(value)
    except _Invalid:
        raise _Invalid("a backend name such as 'local' or a Backend instance") from None


def _labels(value: object) -> dict[str, str]:
    if isinstance(value, str):  # from the environment: "team=ml,run=7"
        pairs = [p.partition("=") for p in value.split(",") if p.strip()]
        if any(not sep or not k.strip() for k, sep, _ in pairs):
            raise _Invalid("comma-separated key=value pairs, e.g. 'team=ml,run=7'")
        return {k.strip(): v.strip() for k, _, v in pairs}
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return {k: str(v) for k, v in value.items()}
    raise _Invalid("a dict of strings (argument), a table of strings (config file) or "
                   "'key=value,...' (environment)")


def _environment(value: object) -> dict[str, str]:
    try:
        pairs = _labels(value)
    except _Invalid:
        raise _Invalid("a dict of names to strings (argument), a table (config file) or "
                       "'NAME=value,...' (environment)") from None
    for name in pairs:
        if not name or "=" in name or "\0" in name or name.startswith(ENV_PREFIX):
            raise _Invalid(f"environment variable names, without '=' and not the executor's "
                           f"own {ENV_PREFIX}* ones; {name!r} is not one")
    return pairs


def _options(value: object) -> dict[str, Any]:
    if isinstance(value, str):  # from the environment: a JSON object
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise _Invalid("a JSON object, e.g. '{\"namespace\": \"ml\"}'") from None
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return dict(value)
    raise _Invalid("a dict (argument), a table (config file) or a JSON object (environment)")


RETRY_FIELDS = tuple(f.name for f in dataclasses.fields(RetryPolicy))


def _retry(value: object) -> RetryPolicy:
    if isinstance(value, RetryPolicy):
        return value
    rule = ("a RetryPolicy, or a dict, table or JSON object of its fields "
            f"({', '.join(RETRY_FIELDS)})")
    try:
        options = _options(value)
    except _Invalid:
        raise _Invalid(rule) from None
    unknown = sorted(set(options) - set(RETRY_FIELDS))
    if unknown:
        close = difflib.get_close_matches(unknown[0], RETRY_FIELDS, n=1)
        guess = f"; did you mean {close[0]!r}?" if close else ""
        raise _Invalid(rule, hint=f"{unknown[0]!r} is no field of RetryPolicy{guess}")
    try:
        return RetryPolicy(**options)
    except (TypeError, ConfigurationError) as exc:  # its own check: "retry attempts must ..."
        raise _Invalid(str(exc), whole=True) from None


def _optional(parse: Parser) -> Parser:
    def parse_optional(value: object) -> Any:
        if isinstance(value, str) and value.strip().lower() in ("", "none"):
            return None
        return parse(value)

    return parse_optional


@dataclass(frozen=True)
class Setting:
    """One key that arguments, the environment and the config file may set.

    This table is the one place a setting is described: its parser (the rule every source is
    checked against), its default and its documentation, from which `FiberExecutor`'s
    docstring and ``fiberexec info`` are written; `tests/test_config.py` checks that the
    executor's signature and `ExecutorConfig` agree with it.
    """

    key: str
    parse: Parser
    default: Any
    doc: str
    # What an explicit argument equal to this means "not given" (the executor's own default).
    unset: tuple[Any, ...] = (None,)
    # What a value of None stands for, as ``fiberexec info`` says it ("no limit").
    none_means: str | None = None
    # The types an argument (other than None) must have; empty: whatever the parser takes. A
    # string is text only the environment and the file give: `FiberExecutor(max_workers="2")`
    # is a TypeError, as it is for the standard library's executors.
    types: tuple[type, ...] = ()

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.key.upper()


INTEGER, NUMBER, BACKEND = (int,), (int, float), (str, Backend)
_KINDS: dict[tuple[type, ...], str] = {
    INTEGER: "an int", NUMBER: "a number (int or float)",
    BACKEND: "a backend name (str) or a Backend instance",
}
SETTINGS: tuple[Setting, ...] = (
    Setting("backend", _backend, "local",
            '``"local"`` (default), ``"docker"``, ``"kubernetes"``, ``"ssh"``, ``"slurm"``, '
            "any name registered under the ``fiberexec.backends`` entry points, or a "
            "`Backend` instance.", types=BACKEND),
    Setting("max_workers", _int(1, "greater than 0"), None,
            "most workers at once (default: this machine's CPU count).", types=INTEGER),
    Setting("min_workers", _int(0), None,
            "workers kept even when idle (default: ``max_workers``); more are started while "
            "tasks wait, up to ``max_workers``.", types=INTEGER),
    Setting("shards", _int(1), 1,
            "scheduling threads, each serving its own share of the workers (default 1: they "
            "share one interpreter lock, and more were slower at every size measured).",
            types=INTEGER),
    Setting("max_task_retries", _int(0), 2,
            "how many times a task whose worker died is sent again (default 2).",
            types=INTEGER),
    Setting("max_tasks_per_child", _optional(_int(1)), None,
            "replace a worker after it has run this many tasks.", none_means="no limit",
            types=INTEGER),
    Setting("idle_timeout", _optional(_seconds), None,
            "seconds after which an idle worker above ``min_workers`` is stopped.",
            none_means="never", types=NUMBER),
    Setting("heartbeat", _heartbeat, 1.0,
            "seconds between liveness messages when nothing else is sent (default 1).",
            types=NUMBER),
    Setting("silence_timeout", _seconds, 30.0,
            "seconds a connected peer may stay silent before it is declared gone (default "
            "30). A peer that dies closes its connection and is noticed at once; silence "
            "matters only where a network can be cut, and a busy or starved machine is slow, "
            "not dead, so keep it generous.", types=NUMBER),
    Setting("start_timeout", _seconds, 120.0,
            "seconds a worker may take to connect after it was started (default 120).",
            types=NUMBER),
    Setting("image", _optional(_text), None,
            "the container image of each worker (Docker, Kubernetes)."),
    Setting("workdir", _optional(_text), None,
            "each worker's working directory (default: the current directory).",
            none_means=CURRENT_DIRECTORY),
    Setting("cpu", _optional(_cpu), None,
            "CPUs reserved or allowed per worker, where the backend can honour it.",
            none_means="no limit", types=NUMBER),
    Setting("memory", _optional(_worker_memory), None,
            "memory per worker (at least ``\"16Mi\"``), as bytes or a quantity like "
            "``\"512Mi\"``, where the "
            "backend can honour it; on the local backend it limits each worker process's "
            "address space (``RLIMIT_AS``, virtual memory: leave room for the interpreter "
            "and imports), and a task that allocates past it raises `MemoryError`.",
            none_means="no limit"),
    Setting("gpu", _int(0), 0, "GPUs per worker (default 0).", types=INTEGER),
    Setting("labels", _labels, {}, "labels put on each worker's job, container or pod.",
            unset=(None, {})),
    Setting("env", _environment, {},
            "environment variables set in each worker, as ``{\"OMP_NUM_THREADS\": \"1\"}`` "
            "(the executor's own ``FIBEREXEC_*`` ones are refused).", unset=(None, {})),
    Setting("backend_options", _options, {},
            "keyword arguments for the backend named by ``backend``.", unset=(None, {})),
    Setting("start_retry", _retry, RetryPolicy(),
            "a `RetryPolicy`: how starting a worker is retried on transient backend errors.",
            unset=(None, RetryPolicy())),
    Setting("arg_cache", _cache_size, 256 << 20,
            "bytes of large task arguments (1 MiB and more) each worker keeps, so an argument "
            "many tasks share (a parameter vector) reaches each worker once; ``0`` turns it "
            "off (default ``\"256Mi\"``, of which a worker holds only what its recent tasks "
            "used). A bytes-for-memory trade: see the guarantees page."),
    Setting("ports", _optional(_ports), None,
            "the port, or range ``\"40000-40999\"``, the executor listens in for its "
            "workers (one port per worker; default: any free port), for firewalls and "
            "Services.", none_means="any free port"),
    Setting("output", _optional(_output), None,
            "where tasks' stdout and stderr go: ``\"forward\"`` (to this process's, each "
            "line prefixed ``[w12 host] ``), ``\"inherit\"`` (the worker's own, unprefixed), "
            "``\"off\"`` (discarded) or a directory (one ``<worker>.out`` and ``.err`` file "
            "per worker). Default: ``\"inherit\"`` where workers share this host (local), "
            "else ``\"forward\"``.",
            none_means="inherit where workers share this host, else forward"),
    Setting("observe", _flag, False,
            "serve snapshots of the workers to ``fiberexec top`` on a loopback endpoint, "
            "guarded by a token in a file only this user can read (default: false)."),
    Setting("dashboard", _dashboard, None,
            "serve a web dashboard and Prometheus ``/metrics`` from this process: ``True`` "
            "or ``\"on\"`` for loopback on a free port, ``\"host:port\"`` to choose "
            "(needs ``fiberexec[dashboard]``; see `dashboard_url`).", none_means="off"),
)
BY_KEY = {s.key: s for s in SETTINGS}


def _bad(key: str, source: str, value: object, broken: _Invalid) -> ConfigurationError:
    if broken.whole:
        return ConfigurationError(f"{key}: {broken.rule} (from {source})")
    hint = f"; {broken.hint}" if broken.hint else ""
    return ConfigurationError(f"{key} must be {broken.rule}, got {value!r} (from {source}){hint}")


def _parse(setting: Setting, value: object, source: str) -> Any:
    try:
        return setting.parse(value)
    except _Invalid as exc:
        raise _bad(setting.key, source, value, exc) from None


def _check_type(setting: Setting, value: object, source: str) -> None:
    """An argument must be the value itself, not text to parse (see `Setting.types`)."""
    kinds = setting.types
    if not kinds or value is None or (isinstance(value, kinds) and not isinstance(value, bool)):
        return
    kind = _KINDS[kinds]
    text = (f"; text is parsed only from {setting.env} or the config file"
            if isinstance(value, str) else "")
    raise ConfigurationTypeError(
        f"{setting.key} must be {kind}, got {value!r} ({type(value).__name__}, from {source})"
        f"{text}")


# ------------------------------------------------------------------ where values come from


def find_config_file(environ: Mapping[str, str], cwd: Path) -> tuple[Path, str] | None:
    """The config file in use and the name of its table, or None."""
    named = environ.get(ENV_CONFIG)
    if named:
        path = cwd / named
        if not path.is_file():
            raise ConfigurationError(
                f"{ENV_CONFIG} must name an existing TOML file, got {named!r} "
                f"(from environment variable {ENV_CONFIG})"
            )
        return path, "[tool.fiberexec]" if path.name == "pyproject.toml" else "top level"
    if (cwd / FILE_NAME).is_file():
        return cwd / FILE_NAME, "top level"
    pyproject = cwd / "pyproject.toml"
    if pyproject.is_file() and _names_us(pyproject):
        return pyproject, "[tool.fiberexec]"
    return None


def _names_us(pyproject: Path) -> bool:
    """Whether ``pyproject`` has a ``[tool.fiberexec]`` table. One that does not is other
    tools' file: what they would reject (a TOML error) is theirs to say, so it is read as
    ours only when its text names the table."""
    try:
        return "fiberexec" in _read_toml(pyproject).get("tool", {})
    except ConfigurationError:
        with contextlib.suppress(OSError):
            if b"tool.fiberexec" not in pyproject.read_bytes().replace(b" ", b""):
                return False
        raise


_PARSED_KEPT = 8  # config files whose parse is kept (`_read_toml`)
_parsed: dict[Path, tuple[bytes, dict[str, Any]]] = {}


def _read_toml(path: Path) -> dict[str, Any]:
    """``path`` parsed, read only. The file is read each time, and parsed again only if its
    bytes changed: a program that makes an executor per generation in a project with a
    long ``pyproject.toml`` parses it once (1-2 ms each time), not per executor."""
    import tomllib  # (only where a config file exists)

    try:
        text = path.read_bytes()
        kept = _parsed.get(path)
        if kept is not None and kept[0] == text:
            return kept[1]
        data = tomllib.loads(text.decode())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigurationError(f"cannot read config file {path}: {exc}") from exc
    if len(_parsed) >= _PARSED_KEPT:
        _parsed.clear()
    _parsed[path] = (text, data)
    return data


def file_values(path: Path, table: str) -> dict[str, Any]:
    """The settings a config file gives; an unknown key is an error that lists the known."""
    data = _read_toml(path)
    if table != "top level":
        data = data.get("tool", {}).get("fiberexec", {})
    data = copy.deepcopy(data)  # (the parse is kept: `_read_toml`)
    unknown = sorted(set(data) - set(BY_KEY))
    if unknown:
        guesses = [f"{key!r} -> {near[0]!r}" for key in unknown
                   if (near := difflib.get_close_matches(key, BY_KEY, n=1, cutoff=0.6))]
        if table == "top level" and "tool" in unknown:
            guesses.append("a [tool.fiberexec] table belongs in pyproject.toml; in "
                           ".fiberexec.toml the keys stand at the top level")
        hint = f"did you mean {', '.join(guesses)}? " if guesses else ""
        raise ConfigurationError(
            f"unknown key(s) {unknown} in {path} {table}; {hint}allowed: {sorted(BY_KEY)}"
        )
    return data


@dataclass(frozen=True)
class Problem:
    """A bad value `diagnose` found: the setting (or ``"config file"``), the value as given,
    where it came from, and the error `resolve` raises for it."""

    key: str
    value: object
    source: str
    message: str


CONFIG_FILE = "config file"  # the key of a `Problem` with the config file itself


def _keep(problems: list[Problem] | None, problem: Problem, exc: ConfigurationError) -> None:
    """Raise ``exc`` (`resolve`), or note ``problem`` and go on (`diagnose`)."""
    if problems is None:
        raise exc
    problems.append(problem)


def _config_file(
    environ: Mapping[str, str], cwd: Path, problems: list[Problem] | None
) -> tuple[tuple[Path, str] | None, dict[str, Any]]:
    """The config file in use and its settings; a bad one is noted and skipped by `diagnose`."""
    found = None
    try:
        found = find_config_file(environ, cwd)
        return found, (file_values(*found) if found else {})
    except ConfigurationError as exc:
        named = ENV_CONFIG in environ
        source = f"environment variable {ENV_CONFIG}" if named else CURRENT_DIRECTORY
        path = str(found[0]) if found else environ.get(ENV_CONFIG)
        _keep(problems, Problem(CONFIG_FILE, path, source, str(exc)), exc)
        return None, {}


def gather(
    explicit: Mapping[str, Any], environ: Mapping[str, str], cwd: Path,
    problems: list[Problem] | None = None,
) -> tuple[dict[str, Any], dict[str, str], str | None]:
    """Each setting's parsed value and its source, by precedence; and the config file used.

    With ``problems`` (`diagnose`), a bad value is noted there and its setting keeps its
    default, instead of raising.
    """
    found, from_file = _config_file(environ, cwd, problems)
    from_fiber = _fiber_keys.from_environment(environ)
    fiber_file = _fiber_file(cwd, problems)
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for s in SETTINGS:
        given = explicit.get(s.key)
        values[s.key], sources[s.key] = s.default, DEFAULT
        if not any(given is u or (given == u and type(given) is type(u)) for u in s.unset):
            values[s.key], sources[s.key] = given, ARGUMENT
            continue
        fiber_key = None  # where Fiber's key gave it, in Fiber's units
        if s.env in environ:
            raw, source = environ[s.env], f"environment variable {s.env}"
        elif s.key in from_fiber:
            fiber_key, raw, source = from_fiber[s.key]
        elif found and s.key in from_file:
            raw, source = from_file[s.key], f"{found[0]} {found[1]}"
        elif s.key in fiber_file:
            fiber_key, raw, source = fiber_file[s.key]
        else:
            continue
        try:
            text = raw if fiber_key is None else _fiber_keys.written(fiber_key, raw, source)
            values[s.key], sources[s.key] = _parse(s, text, source), source
        except ConfigurationError as exc:
            _keep(problems, Problem(s.key, raw, source, str(exc)), exc)
    return values, sources, str(found[0]) if found else None


def _fiber_file(cwd: Path, problems: list[Problem] | None) -> dict[str, _fiber_keys.Given]:
    """What a ``.fiberconfig`` in ``cwd`` sets; a bad one is noted and skipped by `diagnose`."""
    try:
        return _fiber_keys.from_file(cwd)
    except ConfigurationError as exc:
        _keep(problems, Problem(CONFIG_FILE, str(cwd / _fiber_keys.FILE_NAME),
                                CURRENT_DIRECTORY, str(exc)), exc)
        return {}


# ------------------------------------------------------------------ FIBEREXEC_* variables

# FIBEREXEC_* variables that are no settings and never warned about: fiberexec sets them for
# the processes it starts (workers and their launchers, `fiberexec.multiprocessing`'s
# children, ssh wrappers), and its own tests and CI scripts read theirs.
# `tests/test_config.py` checks that every such name in the repository is a setting's or here.
INTERNAL_VARIABLES = frozenset({
    *(value for name, value in vars(_contract).items() if name.startswith("ENV_")),
    "FIBEREXEC_PRELOAD",  # fiberexec._launcher
    "FIBEREXEC_TRACKER_FD",  # fiberexec._procstate
    "FIBEREXEC_EXECUTOR_PID", "FIBEREXEC_SSH_WORKER",  # the local and ssh backends
    "FIBEREXEC_MP_PROCESS", "FIBEREXEC_MP_SECRET", "FIBEREXEC_MP_PARENT", "FIBEREXEC_MP_LOG",
    "FIBEREXEC_MP_ADDRESS", "FIBEREXEC_MP_OUTPUT",  # fiberexec.multiprocessing
    # the test suite, tox and scripts/
    "FIBEREXEC_DASHBOARD_ARTIFACTS", "FIBEREXEC_DOCKER_START", "FIBEREXEC_DOCKER_IMAGE",
    "FIBEREXEC_K8S_RUNTIME", "FIBEREXEC_SLURM_START", "FIBEREXEC_SLURM_WAIT",
    "FIBEREXEC_SLURM_PORT", "FIBEREXEC_SLURM_NODES", "FIBEREXEC_SLURM_DIR",
    "FIBEREXEC_SLURM_CPUS", "FIBEREXEC_DOCKERD_LEASE", "FIBEREXEC_DOCKERD_LOG",
    "FIBEREXEC_DOCKERD_PID", "FIBEREXEC_DOCKERD_WAIT", "FIBEREXEC_DEBIAN_MIRROR",
    "FIBEREXEC_IMAGE_CACHE", "FIBEREXEC_SETUP_TIMEOUT",
})
INTERNAL_PREFIX = "FIBEREXEC_TEST_"  # the test suite's own
SETTING_VARIABLES = (ENV_CONFIG, *(s.env for s in SETTINGS))
_warned: set[str] = set()
_warned_lock = threading.Lock()


def unknown_variables(environ: Mapping[str, str]) -> dict[str, list[str]]:
    """Each ``FIBEREXEC_*`` variable of ``environ`` that nothing reads (a misspelt setting,
    most likely), with the setting variables nearest to it (none, one, or a few as near)."""
    return {name: _closest(name) for name in sorted(environ)
            if name.startswith(ENV_PREFIX) and name not in SETTING_VARIABLES
            and name not in INTERNAL_VARIABLES and not name.startswith(INTERNAL_PREFIX)}


def _closest(name: str) -> list[str]:
    """The setting variables nearest ``name``, compared without the common prefix."""
    tail = name.removeprefix(ENV_PREFIX).lower()
    scores = {env: difflib.SequenceMatcher(None, tail, env.removeprefix(ENV_PREFIX).lower())
              .ratio() for env in SETTING_VARIABLES}
    best = max(scores.values())
    return sorted(env for env, score in scores.items() if score == best) if best >= 0.6 else []


def _unknown_variable(name: str, closest: Sequence[str]) -> str:
    guess = f"did you mean {' or '.join(closest)}? " if closest else ""
    return (f"environment variable {name} is no fiberexec setting and is ignored; {guess}"
            "`fiberexec info` lists the settings and their variables")


def _warn_unknown(environ: Mapping[str, str]) -> None:
    """Warn of each unknown ``FIBEREXEC_*`` variable, once per name in this process."""
    for name, closest in unknown_variables(environ).items():
        with _warned_lock:
            if name in _warned:
                continue
            _warned.add(name)
        log.warning("%s", _unknown_variable(name, closest))


# ------------------------------------------------------------------ resolution


def _check_arguments(values: dict[str, Any], sources: Mapping[str, str]) -> None:
    """Arguments obey the rules the environment and the file do."""
    for s in SETTINGS:
        if sources[s.key] == ARGUMENT:
            source = f"the {s.key}= argument"
            _check_type(s, values[s.key], source)
            values[s.key] = _parse(s, values[s.key], source)


def _between(key: str, low: int, top: int, values: Mapping[str, Any],
             sources: Mapping[str, str]) -> None:
    if not low <= values[key] <= top:
        raise ConfigurationError(
            f"{key} must be between {low} and max_workers={top}, "
            f"got {values[key]} (from {_describe(key, sources)})"
        )


def _describe(key: str, sources: Mapping[str, str]) -> str:
    source = sources[key]
    return f"the {key}= argument" if source == ARGUMENT else source


NOT_SETTINGS = ("initializer", "initargs", "tls")  # arguments only: no file or environment


def resolve(
    explicit: Mapping[str, Any] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> ExecutorConfig:
    """Explicit arguments, then ``FIBEREXEC_*`` environment variables, then the config file,
    then defaults; validated into one `ExecutorConfig`.

    A ``FIBEREXEC_*`` variable that is no setting (a misspelling, most likely) is logged as a
    warning on the ``fiberexec`` logger, once per name in a process, with the nearest
    setting's variable.

    Args:
        explicit: arguments by setting key (`SETTINGS`), plus ``initializer``, ``initargs``
            and ``tls``; a value of None (or the setting's "unset" value) is not given.
            ``backend`` may be a `Backend` instance, which is not looked up by name.
        environ, cwd: where to look instead of ``os.environ`` and the current directory.

    Raises:
        ConfigurationError: a value breaks a rule; the message names the key, its source, the
            value and what is allowed.
        TypeError: ``explicit`` has a key that is no setting, or an argument of the wrong type
            (`ConfigurationTypeError`: ``max_workers="2"``).
    """
    return _resolve(explicit, environ, cwd, None)


def diagnose(
    environ: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None
) -> tuple[ExecutorConfig, list[Problem]]:
    """The configuration `resolve` makes from the environment and the config file, with every
    bad value found instead of the first raised: each is left at its default in the config,
    and its `Problem` says what was given, where, and what is wrong (``fiberexec info``)."""
    problems: list[Problem] = []
    return _resolve(None, environ, cwd, problems), problems


def _resolve(
    explicit: Mapping[str, Any] | None, environ: Mapping[str, str] | None,
    cwd: str | os.PathLike[str] | None, problems: list[Problem] | None,
) -> ExecutorConfig:
    explicit = dict(explicit or {})
    unknown = sorted(set(explicit) - set(BY_KEY) - set(NOT_SETTINGS))
    if unknown:
        raise TypeError(f"resolve() got unknown settings {unknown}; known: {sorted(BY_KEY)}")
    options = {k: explicit[k] for k in NOT_SETTINGS if k in explicit}
    environ = os.environ if environ is None else environ
    _warn_unknown(environ)
    values, sources, config_file = gather(explicit, environ, Path(cwd or os.getcwd()), problems)
    _check_arguments(values, sources)

    def check(key: str, fallback: Any, rule: Callable[[], None]) -> None:
        try:
            rule()
        except ConfigurationError as exc:
            _keep(problems, Problem(key, values[key], sources[key], str(exc)), exc)
            values[key], sources[key] = fallback, DEFAULT

    if not isinstance(explicit.get("backend"), Backend):  # an instance needs no registration
        check("backend", BY_KEY["backend"].default,
              lambda: check_backend_name(values["backend"], _describe("backend", sources)))
    if values["max_workers"] is None:
        values["max_workers"] = os.cpu_count() or 1
    top = values["max_workers"]
    if values["min_workers"] is None:
        values["min_workers"] = top
    check("min_workers", top, lambda: _between("min_workers", 0, top, values, sources))
    check("shards", 1, lambda: _between("shards", 1, top, values, sources))
    _check_rest(values, sources, options)
    check("ports", None, lambda: _check_ports(values, sources))
    check("heartbeat", BY_KEY["heartbeat"].default, lambda: _check_heartbeat(values, sources))
    check("silence_timeout", max(BY_KEY["silence_timeout"].default, 2 * values["heartbeat"]),
          lambda: _check_silence(values, sources))
    resources = Resources(
        cpu=values.pop("cpu"), memory=parse_memory(values.pop("memory")), gpu=values.pop("gpu")
    )
    return ExecutorConfig(
        **values,
        initializer=options.get("initializer"),
        initargs=tuple(options.get("initargs", ())),
        tls=options.get("tls"),
        resources=resources,
        sources=sources,
        config_file=config_file,
    )


def _check_rest(
    values: dict[str, Any], sources: Mapping[str, str], options: Mapping[str, Any]
) -> None:
    init = options.get("initializer")
    if init is not None and not callable(init):
        raise ConfigurationTypeError(
            f"initializer must be a callable, got {init!r}; pass a function (or None)")


HEARTBEAT_MIN = 0.01  # seconds: more often, the messages alone keep workers busy


def _check_heartbeat(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    if values["heartbeat"] < HEARTBEAT_MIN:
        raise ConfigurationError(
            f"heartbeat must be at least {HEARTBEAT_MIN} seconds, got {values['heartbeat']} "
            f"(from {_describe('heartbeat', sources)}); at that pace the heartbeats alone "
            f"would keep the executor and every worker busy")


def _check_silence(values: dict[str, Any], sources: Mapping[str, str]) -> None:
    heartbeat, silence = values["heartbeat"], values["silence_timeout"]
    if silence < 2 * heartbeat and sources["silence_timeout"] == DEFAULT:
        values["silence_timeout"] = 2 * heartbeat  # a slow heartbeat given alone: follow it
    elif silence < 2 * heartbeat:
        raise ConfigurationError(
            f"silence_timeout must be at least twice the heartbeat, {2 * heartbeat}s, got "
            f"{silence} (from {_describe('silence_timeout', sources)}; heartbeat={heartbeat} "
            f"from {_describe('heartbeat', sources)}): a peer that says nothing for "
            f"silence_timeout counts as gone, and a healthy one speaks every heartbeat; raise "
            f"silence_timeout or lower heartbeat")


def _check_ports(values: Mapping[str, Any], sources: Mapping[str, str]) -> None:
    ports = values["ports"]
    if ports is None:
        return
    count, need = ports[1] - ports[0] + 1, values["max_workers"]
    if count < need:
        shown = str(ports[0]) if count == 1 else f"{ports[0]}-{ports[1]}"
        raise ConfigurationError(
            f"ports={shown} (from {_describe('ports', sources)}) holds {count} "
            f"port{'' if count == 1 else 's'} but max_workers={need} needs one per worker; "
            f"give a range, e.g. {ports[0]}-{ports[0] + need - 1}, or lower max_workers")


def document(order: Sequence[str], others: Mapping[str, str], indent: str = "        ") -> str:
    """A docstring's ``Args:`` entries for the parameters ``order`` names: settings from
    `SETTINGS`, the rest from ``others``."""
    lines = []
    for name in order:
        doc = BY_KEY[name].doc if name in BY_KEY else others[name]
        lines += textwrap.wrap(f"{name}: {doc}", 95, initial_indent=indent,
                               subsequent_indent=indent + "    ")
    return "\n".join(lines)


@dataclass(frozen=True)
class Row:
    """One setting as ``fiberexec info`` shows it.

    ``value`` is plain data (numbers, booleans, strings, lists, dicts, None) for JSON; ``note``
    says what it stands for where the value alone does not ("the current directory").
    """

    key: str
    value: Any
    source: str
    note: str | None = None

    def text(self) -> str:
        """The value in words: ``none`` for None, ``a=1, b=2`` for a table."""
        shown = "none" if self.value is None else _show(self.value)
        return f"{shown} ({self.note})" if self.note else shown


def rows(config: ExecutorConfig, cwd: str | None = None) -> list[Row]:
    """Every setting's value (as plain data), source and note, in `SETTINGS` order.

    Args:
        cwd: the directory a workdir of None stands for (default: the current one).
    """
    found = []
    for s in SETTINGS:
        value = _plain(_value(config, s.key))
        note = s.none_means if value is None else None
        if s.key in ("arg_cache", "memory") and type(value) is int and value >= 1 << 20:
            note = f"{value / (1 << 20):g} MiB"  # (as it was likely written: "256Mi")
        if value is None and note == CURRENT_DIRECTORY:
            value = cwd or os.getcwd()  # what each worker gets: the executor's directory
        found.append(Row(s.key, value, config.sources.get(s.key, DEFAULT), note))
    return found


def describe(config: ExecutorConfig) -> list[tuple[str, str, str]]:
    """``(key, value, source)`` rows for every setting, the value in words, as ``fiberexec
    info`` prints them."""
    return [(row.key, row.text(), row.source) for row in rows(config)]


def _value(config: ExecutorConfig, key: str) -> Any:
    if key in ("cpu", "memory", "gpu"):
        return getattr(config.resources, key)
    return getattr(config, key)


def _plain(value: Any) -> Any:
    """``value`` as JSON holds it: a policy or table as a dict, a range as a list."""
    if isinstance(value, RetryPolicy):
        return dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items()) or "{}"
    if isinstance(value, list):
        return "-".join(str(v) for v in value)
    return str(value)
