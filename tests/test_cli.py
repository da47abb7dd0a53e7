"""The ``fiberexec`` command, run as ``python -m fiberexec`` in a subprocess."""

from __future__ import annotations

import contextlib
import io
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fiberexec import FiberExecutor, _cli, _cli_run
from fiberexec._cli import find_benchmarks
from fiberexec._config import BY_KEY
from fiberexec.backend import MasterRequest, shared_launchers
from fiberexec.backends import _docker_master, _k8s_master, _local_stray
from fiberexec.backends.local import LocalBackend

ROOT = Path(__file__).resolve().parents[1]
# no engine, no cluster: probes must answer fast and say why
OFFLINE = {"DOCKER_HOST": "tcp://127.0.0.1:9", "KUBECONFIG": "/nonexistent/kubeconfig"}


def fiberexec(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FIBEREXEC_")}
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", "fiberexec", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


# ------------------------------------------------------------------ info


def test_a_reader_that_leaves_ends_info_quietly_as_with_cat() -> None:
    """``fiberexec info --json | head``: no traceback, the status of a SIGPIPE."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIBEREXEC_")}
    proc = subprocess.Popen([sys.executable, "-m", "fiberexec", "info", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # gone before it writes
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode, err) == (128 + signal.SIGPIPE, "")


def test_info_shows_configuration_sources_and_backends(tmp_path: Path) -> None:
    (tmp_path / ".fiberexec.toml").write_text('image = "me/app:1"\n')
    result = fiberexec("info", cwd=tmp_path, env={**OFFLINE, "FIBEREXEC_MAX_WORKERS": "3"})
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "max_workers          3" in out and "(environment variable FIBEREXEC_MAX_WORKERS)" in out
    assert f"config file: {tmp_path / '.fiberexec.toml'}" in out
    assert "docker      unusable" in out and "kubernetes  unusable" in out
    assert "local       usable" in out


def test_info_json_and_a_kube_context(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: lab\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: lab, context: {cluster: c, user: u, namespace: ml}}]\n"
    )
    result = fiberexec("info", "--json", cwd=tmp_path,
                       env={**OFFLINE, "KUBECONFIG": str(kubeconfig)})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["configuration"]["backend"] == {"value": "local", "source": "default"}
    assert data["backends"]["local"]["usable"] is True
    assert data["backends"]["docker"]["usable"] is False
    if "missing" not in data["backends"]["kubernetes"]["detail"]:
        kubernetes = data["backends"]["kubernetes"]
        assert (kubernetes["usable"], kubernetes["detail"]) == (
            True, "context 'lab', namespace 'ml' (the API server was not contacted)")


def test_info_shows_the_working_directory_default_and_resource_enforcement(
        tmp_path: Path) -> None:
    result = fiberexec("info", cwd=tmp_path, env=OFFLINE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    [workdir] = [line for line in lines if line.strip().startswith("workdir")]
    assert workdir.split()[1:] == [str(tmp_path), "(the", "current", "directory)", "(default)"]
    local = lines.index(next(line for line in lines if line.startswith("  local ")))
    assert [line.split(":", 1)[0].strip() for line in lines[local + 1:local + 4]] == [
        "cpu", "memory", "gpu"]
    assert lines[local + 1].split() == ["cpu:", "not", "enforced", "on", "local"]
    assert "RLIMIT_AS" in lines[local + 2]
    assert lines[local + 3].split() == ["gpu:", "not", "enforced", "on", "local"]


def test_info_json_values_are_typed(tmp_path: Path) -> None:
    env = {**OFFLINE, "FIBEREXEC_MAX_WORKERS": "3", "FIBEREXEC_HEARTBEAT": "0.5",
           "FIBEREXEC_MEMORY": "2Gi", "FIBEREXEC_PORTS": "40000-40009"}
    result = fiberexec("info", "--json", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)["configuration"]
    assert config["max_workers"] == {"value": 3,
                                     "source": "environment variable FIBEREXEC_MAX_WORKERS"}
    assert config["heartbeat"]["value"] == 0.5 and config["memory"]["value"] == 2 * 2**30
    assert config["ports"]["value"] == [40000, 40009]
    assert config["image"] == {"value": None, "source": "default"}
    assert config["cpu"] == {"value": None, "source": "default", "note": "no limit"}
    assert config["workdir"] == {"value": str(tmp_path), "source": "default",
                                 "note": "the current directory"}
    assert config["labels"]["value"] == {} and config["gpu"]["value"] == 0
    assert config["start_retry"]["value"]["attempts"] == 8
    local = json.loads(result.stdout)["backends"]["local"]["resources"]
    assert local["cpu"] == {"enforced": False, "how": None}
    assert local["memory"]["enforced"] is True


def test_info_lists_every_setting_flags_the_bad_ones_and_exits_2(tmp_path: Path) -> None:
    env = {**OFFLINE, "FIBEREXEC_HEARTBEAT": "soon", "FIBEREXEC_MAX_WORKERS": "lots",
           "FIBEREXEC_GPU": "1"}
    result = fiberexec("info", cwd=tmp_path, env=env)
    assert result.returncode == 2
    errors = ["max_workers must be an integer greater than 0, got 'lots' (from environment "
              "variable FIBEREXEC_MAX_WORKERS)",
              "heartbeat must be a number of seconds >= 0.01, got 'soon' (from environment "
              "variable FIBEREXEC_HEARTBEAT)"]  # in the order of the settings
    assert result.stderr.splitlines() == [f"fiberexec info: {e}" for e in errors]
    lines = result.stdout.splitlines()
    shown = {line.split()[0] for line in lines[lines.index("configuration:") + 1:]
             if line.startswith("  ") and not line.strip().startswith("^")}
    assert shown >= set(BY_KEY)  # every setting, the bad ones too
    bad = next(i for i, line in enumerate(lines) if line.split()[:1] == ["max_workers"])
    assert lines[bad].split()[1:3] == ["lots", "(invalid)"]
    assert lines[bad + 1].strip() == f"^ {errors[0]}"
    assert next(line for line in lines if line.split()[:1] == ["gpu"]).split()[1] == "1"
    assert "local       usable" in result.stdout  # the backends are still probed
    data = json.loads(fiberexec("info", "--json", cwd=tmp_path, env=env).stdout)
    assert data["configuration"]["max_workers"] == {
        "value": "lots", "source": "environment variable FIBEREXEC_MAX_WORKERS",
        "note": "invalid", "error": errors[0]}


def test_info_names_unknown_variables_and_the_nearest_setting(tmp_path: Path) -> None:
    env = {**OFFLINE, "FIBEREXEC_MAX_WORKER": "2", "FIBEREXEC_ADDRESS": "tcp://x:1"}
    result = fiberexec("info", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    at = lines.index("unknown FIBEREXEC_* variables (no setting: ignored):")
    assert lines[at + 1] == "  FIBEREXEC_MAX_WORKER (did you mean FIBEREXEC_MAX_WORKERS?)"
    assert lines[at + 2] == ""  # FIBEREXEC_ADDRESS is the worker contract's: not unknown
    data = json.loads(fiberexec("info", "--json", cwd=tmp_path, env=env).stdout)
    assert data["unknown_variables"] == {
        "FIBEREXEC_MAX_WORKER": {"did_you_mean": ["FIBEREXEC_MAX_WORKERS"]}}


def test_info_says_ssh_has_no_hosts_until_it_is_given_some(tmp_path: Path) -> None:
    result = fiberexec("info", "--json", cwd=tmp_path, env=OFFLINE)
    ssh = json.loads(result.stdout)["backends"]["ssh"]
    assert ssh["usable"] is False
    assert ssh["detail"].startswith("registered, but not set up here: the ssh backend needs "
                                    "hosts=")
    hosts = {**OFFLINE, "FIBEREXEC_BACKEND": "ssh",
             "FIBEREXEC_BACKEND_OPTIONS": '{"hosts": ["me@node1"]}'}
    ssh = json.loads(fiberexec("info", "--json", cwd=tmp_path, env=hosts).stdout)["backends"]
    assert (ssh["ssh"]["usable"], ssh["ssh"]["detail"]) == (
        True, "registered by entry point (it offers no probe)")


# ------------------------------------------------------------------ run


def test_run_local_passes_environment_output_and_exit_code(tmp_path: Path) -> None:
    program = ("import os, sys; print(os.environ['FIBEREXEC_BACKEND'], "
               "os.environ['FIBEREXEC_MAX_WORKERS'], os.environ['EXTRA']); sys.exit(3)")
    result = fiberexec("run", "--backend", "local", "--env", "EXTRA=yes", "--",
                       sys.executable, "-c", program, cwd=tmp_path,
                       env={"FIBEREXEC_MAX_WORKERS": "1"})
    assert (result.returncode, result.stdout.split()) == (3, ["local", "1", "yes"])


def test_run_local_program_uses_the_executor(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "from fiberexec import FiberExecutor\n"
        "with FiberExecutor() as ex:\n"
        "    print(ex.max_workers, sum(ex.map(abs, range(-5, 0))))\n"
    )
    (tmp_path / "pyproject.toml").write_text("[tool.fiberexec]\nmax_workers = 1\n")
    result = fiberexec("run", "--", sys.executable, "train.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "15"]


def test_run_python_means_the_interpreter_fiberexec_is_installed_in(tmp_path: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    for name in ("python", "python3"):  # another interpreter, first on PATH
        (shims / name).write_text("#!/bin/sh\necho the-wrong-python\n")
        (shims / name).chmod(0o755)
    env = {"PATH": f"{shims}{os.pathsep}{os.environ['PATH']}"}
    for name in ("python", "python3"):
        result = fiberexec("run", "--", name, "-c", "import sys; print(sys.executable)",
                           cwd=tmp_path, env=env)
        assert (result.returncode, result.stdout.strip()) == (0, sys.executable), result.stderr
    result = fiberexec("run", "--help")
    assert "the interpreter fiberexec is installed in" in " ".join(result.stdout.split())


def test_with_our_python_replaces_only_a_leading_python() -> None:
    assert _cli_run.with_our_python(["python3", "es.py"]) == (sys.executable, "es.py")
    assert _cli_run.with_our_python(["./es.py", "python"]) == ("./es.py", "python")
    assert _cli_run.with_our_python(["python3.9", "x.py"]) == ("python3.9", "x.py")


def test_run_signal_death_is_128_plus_signal(tmp_path: Path) -> None:
    program = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = fiberexec("run", "--", sys.executable, "-c", program, cwd=tmp_path)
    assert result.returncode == 128 + signal.SIGTERM


def test_run_passes_a_termination_signal_on_to_the_program(tmp_path: Path) -> None:
    """SIGTERM to ``fiberexec run`` reaches the program: it is not left running alone."""
    program = ("import signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))\n"
               "print('ready', flush=True)\n"
               "time.sleep(60)\n")
    with subprocess.Popen([sys.executable, "-m", "fiberexec", "run", "--", sys.executable, "-c",
                           program], cwd=tmp_path, stdout=subprocess.PIPE, text=True) as run:
        assert run.stdout is not None and run.stdout.readline() == "ready\n"
        run.send_signal(signal.SIGTERM)
        assert run.wait(30) == 7  # the program's own status: it got the signal and ended


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--backend", "docker", "--", "python", "x.py"], "the docker backend needs an image"),
        (["--backend", "dokcer", "--", "python", "x.py"],
         "unknown backend 'dokcer' (from the --backend option); did you mean 'docker'?"),
        (["--"], "no program given; name it after --, e.g. fiberexec run -- python train.py"),
        (["--env", "NOEQUALS", "--", "python"], "--env must be KEY=VALUE, got 'NOEQUALS'"),
    ],
)
def test_run_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    result = fiberexec("run", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr
    assert result.stderr.count("fiberexec run") == 1 + message.count("fiberexec run")


def test_docker_master_container_arguments() -> None:
    request = MasterRequest(("python", "train.py"), "docker", image="me/app:1", env={"A": "1"})
    environ = {"FIBEREXEC_MAX_WORKERS": "8", "HOME": "/root", "FIBEREXEC_BACKEND": "local"}
    kwargs = _docker_master.docker_run_kwargs(request, "/src/proj", environ, local_engine=True)
    assert kwargs["image"] == "me/app:1" and kwargs["command"] == ["python", "train.py"]
    assert kwargs["environment"] == {"FIBEREXEC_MAX_WORKERS": "8", "FIBEREXEC_BACKEND": "docker",
                                     "FIBEREXEC_IMAGE": "me/app:1", "A": "1"}
    assert kwargs["network_mode"] == "host" and kwargs["working_dir"] == "/src/proj"
    assert kwargs["volumes"]["/src/proj"] == {"bind": "/src/proj", "mode": "rw"}
    assert _docker_master.DOCKER_SOCKET in kwargs["volumes"]
    assert kwargs["labels"]["fiberexec"] == "master"
    remote = _docker_master.docker_run_kwargs(request, "/src/proj", {}, local_engine=False)
    assert _docker_master.DOCKER_SOCKET not in remote["volumes"]


def test_kubernetes_master_pod_manifest() -> None:
    request = MasterRequest(("python", "es.py", "--gens", "3"), "kubernetes", image="me/es:1")
    pod = _k8s_master.master_pod(request, {"FIBEREXEC_MAX_WORKERS": "64", "PATH": "/bin"}, "m-1")
    assert (pod["apiVersion"], pod["kind"], pod["metadata"]["name"]) == ("v1", "Pod", "m-1")
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["serviceAccountName"] == "fiberexec-executor"
    (container,) = spec["containers"]
    assert container["image"] == "me/es:1"
    assert container["command"] == ["python", "es.py", "--gens", "3"]
    env = {e["name"]: e for e in container["env"]}
    assert env["FIBEREXEC_BACKEND"]["value"] == "kubernetes"
    assert env["FIBEREXEC_IMAGE"]["value"] == "me/es:1"
    assert env["FIBEREXEC_MAX_WORKERS"]["value"] == "64" and "PATH" not in env
    assert env["POD_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_exit_status() -> None:
    assert [_cli_run.exit_status(c) for c in (0, 3, -9)] == [0, 3, 137]


# ------------------------------------------------------------------ cleanup


def _closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: nothing will accept on it
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest.fixture
def stray_worker() -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A real worker process whose executor is gone (nothing listens where it dials)."""
    executor_id = f"gone{secrets.token_hex(3)}"
    env = {**os.environ, "FIBEREXEC_ADDRESS": f"tcp://127.0.0.1:{_closed_port()}",
           "FIBEREXEC_SECRET": secrets.token_hex(32), "FIBEREXEC_EXECUTOR_ID": executor_id,
           "FIBEREXEC_WORKER_ID": "w0", "FIBEREXEC_CONNECT_TIMEOUT": "60",
           "FIBEREXEC_NONCE": secrets.token_hex(16)}
    proc = subprocess.Popen([sys.executable, "-m", "fiberexec.worker"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    yield proc, executor_id
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def test_cleanup_local_stops_a_stray_worker(
    stray_worker: tuple[subprocess.Popen[bytes], str],
) -> None:
    proc, executor_id = stray_worker
    result = fiberexec("cleanup", "--backend", "local", "--executor", executor_id)
    assert result.returncode == 0, result.stderr
    assert f"local: removed worker w0 of executor {executor_id} (pid {proc.pid}" in result.stdout
    assert proc.wait(timeout=10) == -signal.SIGTERM


def test_cleanup_local_spares_live_executors_and_other_programs() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        with FiberExecutor(1, backend=LocalBackend()) as ex:
            assert ex.submit(abs, -1).result(timeout=60) == 1
            mine = [w for w in _local_stray.local_workers() if w.pid in _children()
                    and w.pid not in shared_launchers.pids()]  # (the program's, if any)
            assert len(mine) == 1  # the worker
            assert not any(_local_stray.is_stray(w, _local_stray.listening_ports())
                           for w in mine)
            result = fiberexec("cleanup", "--backend", "local")
            assert result.stdout.strip() == "local: no stray workers"
            assert ex.submit(abs, -2).result(timeout=60) == 2
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait(timeout=10)


def test_a_worker_of_another_backend_connected_here_over_unix_is_not_stray() -> None:
    """A pod of a cluster on this machine, or an ssh worker on this host, names no executor
    pid; connected over the abstract Unix name, its TCP port is neither listened on nor
    connected. It is live while its executor holds that name, stray once it is gone."""
    name = f"fiberexec/{os.getpid()}/{secrets.token_hex(4)}/w0"
    worker = _local_stray.LocalWorker(os.getpid(), "x", "w0",
                                      f"tcp://127.0.0.1:{_closed_port()}",
                                      local_address=name)
    executor_end = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    executor_end.bind("\0" + name)
    executor_end.listen()
    try:
        assert not _local_stray.is_stray(worker, _local_stray.listening_ports())
    finally:
        executor_end.close()
    assert _local_stray.is_stray(worker, _local_stray.listening_ports())


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_worker_command_line_is_recognised_exactly() -> None:
    assert _local_stray.is_worker_cmdline(["/usr/bin/python3.11", "-m", "fiberexec.worker"])
    assert _local_stray.is_worker_cmdline(["python", "-m", "fiberexec.worker", "--launcher", "7"])
    assert not _local_stray.is_worker_cmdline(["python", "-m", "fiberexec.worker", "x"])
    assert not _local_stray.is_worker_cmdline(["vim", "-m", "fiberexec.worker"])
    assert not _local_stray.is_worker_cmdline(["python", "-c", "fiberexec.worker"])
    # the interpreter's own options, as the local backend passes them on
    assert _local_stray.is_worker_cmdline(["python", "-O", "-Werror", "-X", "dev", "-m",
                                           "fiberexec.worker", "--launcher", "7"])
    assert not _local_stray.is_worker_cmdline(["python", "-X", "-m", "fiberexec.worker"])
    assert not _local_stray.is_worker_cmdline(["python", "x.py", "-m", "fiberexec.worker"])
    assert not _local_stray.is_worker_cmdline(["python", "-m", "x", "-m", "fiberexec.worker"])


@contextlib.contextmanager
def strays(*executor_ids: str) -> Iterator[list[subprocess.Popen[bytes]]]:
    """A real worker process of each executor id, whose executor is gone."""
    procs = [subprocess.Popen([sys.executable, "-m", "fiberexec.worker"], env={
        **os.environ, "FIBEREXEC_ADDRESS": f"tcp://127.0.0.1:{_closed_port()}",
        "FIBEREXEC_SECRET": secrets.token_hex(32), "FIBEREXEC_EXECUTOR_ID": executor_id,
        "FIBEREXEC_WORKER_ID": "w0", "FIBEREXEC_CONNECT_TIMEOUT": "60",
        "FIBEREXEC_NONCE": secrets.token_hex(16)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for executor_id in executor_ids]
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)


def test_cleanup_takes_a_unique_start_of_an_executor_id() -> None:
    prefix = f"gone{secrets.token_hex(4)}"
    with strays(f"{prefix}a1", f"{prefix}b2") as (first, second):
        both = fiberexec("cleanup", "--backend", "local", "--executor", prefix)
        assert both.returncode == 2
        assert both.stderr.strip() == (
            f"fiberexec cleanup: --executor {prefix!r} is the start of 2 executors' ids: "
            f"{prefix}a1, {prefix}b2; give more of the id")
        assert first.poll() is None and second.poll() is None  # nothing removed
        one = fiberexec("cleanup", "--backend", "local", "--executor", f"{prefix}b")
        assert one.returncode == 0, one.stderr
        assert f"removed worker w0 of executor {prefix}b2 (pid {second.pid}" in one.stdout
        assert second.wait(timeout=10) == -signal.SIGTERM and first.poll() is None
        assert "no backend here reports" not in one.stderr
    typo = fiberexec("cleanup", "--backend", "local", "--executor", f"{prefix}zz", "--dry-run")
    assert typo.returncode == 0 and typo.stderr == (
        f"no backend here reports workers of an executor whose id is or starts with "
        f"'{prefix}zz'; sweeping for that id as given\n")


def test_cleanup_of_a_named_backend_that_fails_exits_1(tmp_path: Path) -> None:
    """An ssh host that refuses (here: nothing listens on its port) is a failure."""
    hosts = {**OFFLINE, "FIBEREXEC_BACKEND": "ssh",
             "FIBEREXEC_BACKEND_OPTIONS": '{"hosts": ["me@127.0.0.1:9"]}'}
    result = fiberexec("cleanup", "--backend", "ssh", cwd=tmp_path, env=hosts, timeout=120)
    assert result.returncode == 1, (result.stdout, result.stderr)
    assert result.stdout.startswith("ssh: skipped (cannot clean up")


def test_cleanup_refuses_a_live_executor_unless_forced() -> None:
    with FiberExecutor(1, backend=LocalBackend()) as ex:
        assert ex.submit(abs, -1).result(timeout=60) == 1
        executor_id = ex.executor_id
        (worker,) = ex.workers()
        refused = fiberexec("cleanup", "--backend", "local", "--executor", executor_id[:6])
        assert refused.returncode == 2
        assert refused.stderr.strip() == (
            f"fiberexec cleanup: executor {executor_id} is still running (its lease is held): "
            "it would start new workers as soon as these were removed; stop the program that "
            "runs it (Ctrl-C, or end its process), or pass --force to remove its workers anyway")
        assert ex.submit(abs, -2).result(timeout=60) == 2
        assert [w.worker_id for w in ex.workers() if w.state != "lost"] == [worker.worker_id]
        dry = fiberexec("cleanup", "--backend", "local", "--executor", executor_id, "--dry-run")
        assert (dry.returncode, dry.stderr) == (2, refused.stderr)  # as the real one would
        listed = fiberexec("cleanup", "--backend", "local", "--executor", executor_id,
                           "--dry-run", "--force")
        assert listed.returncode == 0 and f"would remove worker {worker.worker_id} of executor " \
            f"{executor_id}" in listed.stdout
        forced = fiberexec("cleanup", "--backend", "local", "--executor", executor_id, "--force")
        assert forced.returncode == 0, forced.stderr
        assert f"removed worker {worker.worker_id} of executor {executor_id}" in forced.stdout


def test_cleanup_all_asks_first_or_needs_yes() -> None:
    offline = {**OFFLINE, "FIBEREXEC_BACKEND": "local"}
    result = subprocess.run([sys.executable, "-m", "fiberexec", "cleanup", "--backend",
                             "docker", "--all"], stdin=subprocess.DEVNULL, capture_output=True,
                            text=True, timeout=60, check=False, env={**os.environ, **offline})
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.strip() == (
        "fiberexec cleanup: --all removes live executors' workers too, and there is no "
        "terminal to ask on; pass --yes to remove them, or --dry-run to list them")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("answer", "removes"), [("n\n", False), ("yes\n", True)])
def test_cleanup_all_on_a_terminal_lists_then_asks(
        answer: str, removes: bool, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "stdin", _Terminal(answer))
    assert _cli.main(["cleanup", "--backend", "docker", "--all"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("--all removes every fiberexec worker, live executors' too; it will "
                        "remove:")
    assert lines[1].startswith("  docker: skipped (")
    assert lines[2].startswith("remove them? [y/N] ")
    if removes:
        assert lines[2].removeprefix("remove them? [y/N] ").startswith("docker: skipped (")
    else:
        assert lines[2:] == ["remove them? [y/N] nothing removed"]


def test_cleanup_skips_a_backend_not_set_up_here(tmp_path: Path) -> None:
    """Without Slurm's commands (or its configuration) there are no jobs to judge."""
    result = fiberexec("cleanup", "--backend", "slurm", env={"PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("slurm: skipped (unreachable: cannot ask Slurm for its "
                                    "partitions: 'sinfo' not found;")


def test_cleanup_unknown_backend_and_unreachable_ones() -> None:
    result = fiberexec("cleanup", "--backend", "nope")
    assert result.returncode == 2
    assert "unknown backend 'nope' (from the --backend option); known backends:" in result.stderr
    result = fiberexec("cleanup", "--backend", "docker", env=OFFLINE)
    assert result.returncode == 0 and result.stdout.startswith("docker: skipped (")


# ------------------------------------------------------------------ bench


def test_bench_help_and_where_it_finds_the_suite(tmp_path: Path) -> None:
    result = fiberexec("bench", "--help")
    assert result.returncode == 0 and "--quick" in result.stdout
    assert find_benchmarks(tmp_path) == ROOT  # not here: the source tree fiberexec runs from


def test_version_and_help() -> None:
    result = fiberexec("--help")
    assert result.returncode == 0
    assert all(cmd in result.stdout for cmd in ("info", "run", "cleanup", "bench"))


@pytest.mark.parametrize(("args", "usage", "error"), [
    (["--verison"], "usage: fiberexec [-h]", "fiberexec: error: unrecognized arguments: --verison"),
    (["info", "--jsn"], "usage: fiberexec info [-h] [--json]",
     "fiberexec info: error: unrecognized arguments: --jsn"),
    ([], "usage: fiberexec [-h]",
     "fiberexec: error: a COMMAND is required: info, run, cleanup, top or bench"),
])
def test_a_mistake_is_named_with_the_usage_of_its_command(
        args: list[str], usage: str, error: str) -> None:
    result = fiberexec(*args)
    assert result.returncode == 2
    assert result.stderr.startswith(usage) and result.stderr.splitlines()[-1] == error
