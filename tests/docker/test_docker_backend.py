"""The Docker adapter against a real engine, without the executor: what is Docker's own.

Workers here run plain commands; every container uses host networking. The seam's contract
(exit codes, signals, OOM, unknown handles, stop, close, strays, logs) is checked for every
backend by tests/conformance.
"""

from __future__ import annotations

import gc
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fiberexec.backend import (
    EXECUTOR_LABEL,
    PermanentBackendError,
    Resources,
    TransientBackendError,
    WorkerSpec,
    WorkerState,
)
from fiberexec.backends.docker import DockerBackend, _exit_code, container_name, remove_stray

SpecFactory = Callable[..., WorkerSpec]
SLEEP = ("python", "-c", "import time; time.sleep(120)")


def test_container_settings(
    backend: DockerBackend, make_spec: SpecFactory, client: Any, tmp_path: Any
) -> None:
    script_dir = tmp_path / "project"  # a script run from elsewhere: its modules are there
    script_dir.mkdir()
    spec = make_spec(
        *SLEEP,
        env={"PLAIN": "1"},
        secret_env={"FIBEREXEC_SECRET": "s3cret"},
        labels={"team": "es"},
        workdir=str(tmp_path / "run"),
        script_dir=str(script_dir),
        resources=Resources(cpu=0.5, memory=256 * 2**20),
    )
    (tmp_path / "run").mkdir()
    handle = backend.start_worker(spec)
    info = client.api.inspect_container(handle.ref)
    config, host = info["Config"], info["HostConfig"]
    assert info["Name"] == f"/{container_name(spec)}"
    assert config["Labels"].items() >= spec.all_labels().items()
    assert config["Labels"]["team"] == "es"
    assert {"PLAIN=1", "FIBEREXEC_SECRET=s3cret"} <= set(config["Env"])
    assert config["WorkingDir"] == str(tmp_path / "run")
    assert {f"{tmp_path}/run:{tmp_path}/run:rw", f"{script_dir}:{script_dir}:rw"} <= set(
        host["Binds"])
    assert (host["NetworkMode"], host["IpcMode"], host["AutoRemove"]) == ("host", "host", True)
    assert (host["NanoCpus"], host["Memory"]) == (500_000_000, 256 * 2**20)
    assert backend.status(handle).state is WorkerState.RUNNING


def test_stop_removes_the_container(
    backend: DockerBackend, make_spec: SpecFactory, client: Any
) -> None:
    handle = backend.start_worker(make_spec(*SLEEP))
    started = time.monotonic()
    backend.stop(handle, grace=5)
    assert time.monotonic() - started < 5, "docker-init should pass SIGTERM on at once"
    assert not client.api.containers(all=True, filters={"id": handle.ref})
    assert backend.status(handle).finished
    backend.stop(handle)  # stopping again is a no-op


def test_close_removes_everything_and_stops_the_event_thread(
    image: str, make_spec: SpecFactory, client: Any, executor_id: str
) -> None:
    backend = DockerBackend(image=image)
    for _ in range(3):
        backend.start_worker(make_spec(*SLEEP))
    backend.close()
    assert not client.api.containers(all=True, filters={"label": f"{EXECUTOR_LABEL}={executor_id}"})
    events = backend._events
    assert events is not None
    assert not events._thread.is_alive()


def test_missing_image_is_permanent_and_quick(
    backend: DockerBackend, make_spec: SpecFactory
) -> None:
    started = time.monotonic()
    with pytest.raises(PermanentBackendError, match="fiberexec-no-such-image:0"):
        backend.start_worker(make_spec("true", image="fiberexec-no-such-image:0"))
    assert time.monotonic() - started < 5


def test_unreachable_engine_is_transient(make_spec: SpecFactory) -> None:
    url = "unix:///tmp/fiberexec-no-such-docker.sock"
    with (
        DockerBackend(image="any", base_url=url) as backend,
        pytest.raises(TransientBackendError, match="unreachable") as caught,
    ):
        backend.start_worker(make_spec("true"))
    assert url in str(caught.value)
    # docker-py's unix connection leaks the socket whose connect() failed; finalize it here.
    del caught
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


def test_name_conflict_is_transient(backend: DockerBackend, make_spec: SpecFactory) -> None:
    spec = make_spec(*SLEEP)
    backend.start_worker(spec)
    with pytest.raises(TransientBackendError, match="409") as caught:
        backend.start_worker(spec)
    assert "remove_stray" in str(caught.value)


def test_bad_setting_is_permanent(backend: DockerBackend, make_spec: SpecFactory) -> None:
    with pytest.raises(PermanentBackendError, match="400"):
        backend.start_worker(make_spec("true", resources=Resources(cpu=1000)))


@pytest.fixture
def strays(client: Any, image: str, executor_id: str) -> Iterator[str]:
    """Two containers of another executor (created, never started: no auto-removal)."""
    other = f"{executor_id}-other"
    for n in range(2):
        client.api.create_container(
            image,
            ["true"],
            labels={EXECUTOR_LABEL: other, "fiberexec": "worker"},
            name=f"fiberexec-{other}-{n}",
        )
    yield other
    remove_stray(client, executor_id=other)


def test_remove_stray_removes_one_executors_containers(
    client: Any, strays: str, executor_id: str, backend: DockerBackend, make_spec: SpecFactory
) -> None:
    mine = backend.start_worker(make_spec(*SLEEP))
    assert len(remove_stray(client, executor_id=strays)) == 2
    assert not client.api.containers(all=True, filters={"label": f"{EXECUTOR_LABEL}={strays}"})
    assert backend.status(mine).state is WorkerState.RUNNING
    removed = remove_stray(executor_id=executor_id)  # with its own client: worker and lease
    assert [line.split("(")[1].split()[0] for line in removed] == ["worker", "lease"], removed


@pytest.mark.parametrize(
    ("docker_code", "code"), [(0, 0), (3, 3), (128, 128), (137, -9), (143, -15), (255, 255)]
)
def test_exit_code_mapping(docker_code: int, code: int) -> None:
    assert _exit_code(docker_code) == code


def test_container_name_is_sanitized() -> None:
    spec = WorkerSpec("w/1 2", "ex:é", ("true",))
    assert container_name(spec) == "fiberexec-ex--w-1-2"
