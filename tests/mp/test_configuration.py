"""One configuration for every facade: the backend, its options and the image that the
executor's configuration resolves reach `Process`, `Manager`, `Pool` and
`SharedMemoryManager` alike."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest

import fiberexec.multiprocessing as mp
from fiberexec import _registry
from fiberexec._config import SETTINGS
from fiberexec.backend import WorkerHandle, WorkerSpec
from fiberexec.backends.local import LocalBackend
from fiberexec.multiprocessing.managers import SharedMemoryManager
from tests.mp import tasks
from tests.support.kit import BackendKit


class RecordingBackend(LocalBackend):
    """A local backend, registered by name in these tests, that keeps what reached it."""

    name = "recording"
    made: ClassVar[list[dict[str, Any]]] = []  # the options of each instance
    images: ClassVar[list[str | None]] = []  # the image of each spec it started

    def __init__(self, *, tag: str, **options: Any) -> None:
        super().__init__(**options)
        self.made.append({"tag": tag, **options})

    def start_worker(self, spec: WorkerSpec) -> WorkerHandle:
        self.images.append(spec.image)
        return super().start_worker(spec)


def _clean_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for setting in SETTINGS:
        monkeypatch.delenv(setting.env, raising=False)
    monkeypatch.delenv("FIBEREXEC_CONFIG", raising=False)


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """``backend = "recording"``, an image and backend options in a config file."""
    targets = _registry._targets
    monkeypatch.setattr(_registry, "_targets", lambda: {
        **targets(), "recording": f"{__name__}:RecordingBackend"})
    _clean_settings(monkeypatch)
    (tmp_path / ".fiberexec.toml").write_text(
        'backend = "recording"\nimage = "me/app:1"\n\n[backend_options]\ntag = "from-file"\n')
    monkeypatch.chdir(tmp_path)
    RecordingBackend.made.clear()
    RecordingBackend.images.clear()
    mp.set_default_backend(None)  # the configuration decides, read afresh
    yield
    mp.set_default_backend(None)  # closes the shared recording backend


@pytest.mark.usefixtures("configured")
def test_process_runs_on_the_configured_backend_with_its_options_and_image() -> None:
    proc = mp.Process(target=tasks.exit_with, args=(0,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert RecordingBackend.made == [{"tag": "from-file"}]
    assert RecordingBackend.images == ["me/app:1"]


@pytest.mark.usefixtures("configured")
def test_manager_and_pool_run_on_the_configured_backend() -> None:
    with mp.Manager() as manager:
        shared = manager.dict(a=1)
        assert shared["a"] == 1
    with mp.Pool(1) as pool:
        assert pool.apply(tasks.square, (3,)) == 9
    assert {"tag": "from-file"} in RecordingBackend.made
    assert len(RecordingBackend.made) == 2  # the processes' backend, then the pool's own
    assert len(RecordingBackend.images) >= 2
    assert set(RecordingBackend.images) == {"me/app:1"}


@pytest.mark.usefixtures("configured")
def test_backend_named_in_code_takes_the_configured_options_for_that_name() -> None:
    with SharedMemoryManager(backend="recording") as smm:
        segment = smm.SharedMemory(8)
        assert segment.size >= 8
        segment.close()
    assert RecordingBackend.made == [{"tag": "from-file"}]
    assert RecordingBackend.images == ["me/app:1"]


def test_a_backend_set_up_by_environment_alone_runs_every_facade(
        kit: BackendKit, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user does: ``FIBEREXEC_BACKEND=docker FIBEREXEC_IMAGE=...``, no object."""
    assert kit.settings, f"the {kit.name} test kit must say how a user configures it"
    _clean_settings(monkeypatch)
    for key, value in kit.settings.items():
        monkeypatch.setenv(key, value)
    mp.set_default_backend(None)
    try:
        proc = mp.Process(target=tasks.exit_with, args=(3,))
        proc.start()
        proc.join(120)
        assert proc.exitcode == 3
        with mp.Manager() as manager:
            shared = manager.list([1])
            shared.append(2)
            assert list(shared) == [1, 2]
        with mp.Pool(2) as pool:
            assert pool.apply(tasks.add, (2, 3)) == 5
    finally:
        mp.set_default_backend(None)
