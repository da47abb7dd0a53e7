"""Code written for Fiber 0.2.1 runs with ``import fiberexec as fiber``: the launch article's
`AsyncManager` example, ``fiber.init``/``fiber.config``, `Pool.start_workers` and
`SimpleQueuePush`."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import fiberexec as fiber
from fiberexec import ConfigurationError
from fiberexec._config import diagnose, gather, resolve
from tests import fiber_tasks as ft

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _launcher_closed() -> Iterator[None]:
    """Managers start as processes forked by the default backend's launcher, which lives
    as long as that backend (as the stdlib's forkserver lives as long as the program):
    close it after each test, as tests/mp does, so no test leaves it running."""
    yield
    import fiberexec.multiprocessing as mp

    mp.set_default_backend(None)


class EnvManager(fiber.managers.AsyncManager):
    pass


EnvManager.register("Env", ft.Env)


def test_the_launch_articles_async_manager_example_runs() -> None:
    managers = [EnvManager() for _ in range(2)]
    for manager in managers:
        manager.start()
    try:
        envs = [manager.Env() for manager in managers]
        assert [env.reset().get() for env in envs] == [0, 0]
        for step in range(1, 3):
            handles = [env.step(a) for env, a in zip(envs, [1, 2], strict=True)]
            obs = [h.get() for h in handles]
            assert obs == [(step, 1.0, False, {}), (2 * step, 2.0, False, {})]
    finally:
        for manager in managers:
            manager.shutdown()


def test_a_handle_is_a_future_with_async_results_methods() -> None:
    with EnvManager() as manager:
        env = manager.Env()
        handle = env.step(3)
        assert isinstance(handle, Future)
        handle.wait(30)
        assert handle.ready() and handle.successful() and handle.result() == (3, 3.0, False, {})
        failing = env.step(-1)
        with pytest.raises(ValueError, match="not in the action space"):
            failing.get(timeout=30)
        assert not failing.successful()
        slow = env.slow(5.0)
        with pytest.raises(ValueError, match="not ready"):
            slow.successful()
        with pytest.raises(multiprocessing.TimeoutError):  # as AsyncResult.get raises
            slow.get(timeout=0.05)
        assert slow.get(timeout=30) == "slow"


@pytest.fixture
def clean_settings() -> Iterator[None]:
    before = {k: v for k, v in os.environ.items() if k.startswith("FIBEREXEC_")}
    yield
    fiber.reset()  # (what init kept to put back goes too)
    for key in [k for k in os.environ if k.startswith("FIBEREXEC_")]:
        del os.environ[key]
    os.environ.update(before)


def test_init_and_config_map_fibers_keys_onto_the_settings(clean_settings: None) -> None:
    fiber.init(backend="local", cpu_per_job=2, mem_per_job=256)
    assert (fiber.config.backend, fiber.config.cpu_per_job, fiber.config.mem_per_job) == (
        "local", 2.0, 256)
    fiber.config.image = "me/env:1"  # Fiber's other way: set the module's attribute
    assert fiber.config.get_dict()["image"] == "me/env:1"
    ex = fiber.FiberExecutor(1)
    assert ex._config.resources.cpu == 2.0 and ex._config.resources.memory == 256 << 20
    assert ex._config.image == "me/env:1"
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['bakcend'\]"):
        fiber.init(bakcend="docker")
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['imgae'\]"):
        fiber.config.imgae = "me/env:2"  # as misspelt on the module
    assert not hasattr(fiber.config, "imgae")
    with pytest.raises(ConfigurationError, match="cpu_per_job=0.*cpu must be"):
        fiber.init(cpu_per_job=0)
    assert fiber.config.cpu_per_job == 2.0  # a refused value leaves the last one


def test_pool_start_workers_and_simple_queue_push() -> None:
    pool = fiber.Pool(1)
    pool.start_workers()  # before any task, as Fiber's users call it
    assert pool.apply(abs, (-3,)) == 3
    pool.close()
    pool.join()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.start_workers()
    queue = fiber.SimpleQueuePush()
    child = fiber.Process(target=ft.put_one, args=(queue, "pushed"))
    child.start()
    assert queue.get() == "pushed"
    child.join(30)
    assert child.exitcode == 0


def test_reset_puts_back_what_init_changed(clean_settings: None) -> None:
    """Fiber's ``fiber.reset()``: the settings and the logger as they were before `init`."""
    import logging

    os.environ["FIBEREXEC_IMAGE"] = "me/base:1"
    os.environ.pop("FIBEREXEC_CPU", None)
    logger = logging.getLogger("fiberexec")
    level, handlers = logger.level, list(logger.handlers)
    fiber.init(image="me/env:2", cpu_per_job=3, log_level="debug")
    fiber.config.mem_per_job = 512
    assert (fiber.config.image, fiber.config.cpu_per_job, fiber.config.mem_per_job) == (
        "me/env:2", 3.0, 512)
    assert logger.level == logging.DEBUG and len(logger.handlers) == len(handlers) + 1
    fiber.reset()
    assert os.environ["FIBEREXEC_IMAGE"] == "me/base:1"
    assert "FIBEREXEC_CPU" not in os.environ and "FIBEREXEC_MEMORY" not in os.environ
    assert (logger.level, logger.handlers) == (level, handlers)
    fiber.reset()  # nothing changed since: nothing to put back
    assert os.environ["FIBEREXEC_IMAGE"] == "me/base:1"


def test_fibers_pool_arguments_and_get_context() -> None:
    """``fiber.get_context("spawn")`` and ``Pool(..., error_handling=True)``, as Fiber's
    programs write them (a lost worker's tasks always run again here)."""
    ctx = fiber.get_context("spawn")
    assert ctx is fiber.get_context().get_context("spawn")
    with ctx.Pool(1, error_handling=True) as pool:
        assert pool.map(abs, [-1, -2]) == [1, 2]


@pytest.mark.parametrize(("options", "error", "match"), [
    ({"imgae": "me/env:1"}, TypeError, "unexpected keyword argument.*imgae.*FiberExecutor's "
                                       "keywords .*image"),
    ({"max_tasks_per_child": 2}, TypeError, "max_tasks_per_child: .*maxtasksperchild"),
    ({"memory": 100}, ConfigurationError, "memory must be at least 16Mi.*got 100"),
    ({"cpu": 0}, ConfigurationError, "cpu must be .*got 0"),
    ({"backend": "nosuch"}, ConfigurationError, "unknown backend 'nosuch'"),
])
def test_a_pools_options_are_checked_as_it_is_made(
        options: dict[str, object], error: type[Exception], match: str) -> None:
    """Not at its first task, as `FiberExecutor` would: where the pool is made, as the
    standard library's pool checks its arguments."""
    with pytest.raises(error, match=match):
        fiber.Pool(1, **options)  # type: ignore[arg-type]


def test_wait_until_workers_up_returns_once_every_worker_is_ready() -> None:
    """Fiber's ``Pool.wait_until_workers_up``: it starts the workers and blocks (no
    polling) until all are connected; with a timeout they cannot meet, it says how many
    were up."""
    with fiber.Pool(3) as pool:
        with pytest.raises(multiprocessing.TimeoutError,
                           match=r"\d of the pool's 3 workers were up after 0s"):
            pool.wait_until_workers_up(timeout=0)
        pool.wait_until_workers_up(timeout=60)
        assert [w.state for w in pool.workers()] == ["idle"] * 3
        assert pool.map(abs, [-1, -2]) == [1, 2]


def test_wait_until_workers_up_raises_what_broke_the_pool() -> None:
    """Workers that cannot start break the executor: the wait ends with that error."""
    from tests.test_start_failures import FirstWorksBackend

    backend = FirstWorksBackend(good=0)
    pool = fiber.Pool(2, backend=backend)
    try:
        with pytest.raises(fiber.BrokenFiberExecutor, match="failed to start"):
            pool.wait_until_workers_up(timeout=60)
    finally:
        pool.terminate()
        backend.close()


def test_fibers_environment_variables_configure_executors(tmp_path: Path) -> None:
    """A program moved from Fiber keeps running where ``FIBER_*`` says, in Fiber's units;
    fiberexec's own variables win over Fiber's, and Fiber's ``backend`` over its
    ``default_backend``."""
    environ = {"FIBER_DEFAULT_BACKEND": "kubernetes", "FIBER_BACKEND": "docker",
               "FIBER_IMAGE": "me/env:1", "FIBER_CPU_PER_JOB": "2", "FIBER_MEM_PER_JOB": "512",
               "FIBER_IPC_ADMIN_MASTER_PORT": "0", "FIBER_LOG_LEVEL": "debug"}
    config = resolve({}, environ=environ, cwd=tmp_path)
    assert (config.backend, config.image, config.resources.cpu, config.resources.memory,
            config.ports) == ("docker", "me/env:1", 2.0, 512 << 20, None)
    _, sources, _ = gather({}, environ, tmp_path)
    assert sources["backend"] == "environment variable FIBER_BACKEND (Fiber's)"
    del environ["FIBER_BACKEND"]
    assert resolve({}, environ=environ, cwd=tmp_path).backend == "kubernetes"
    assert resolve({}, environ={**environ, "FIBEREXEC_BACKEND": "local"},
                   cwd=tmp_path).backend == "local"
    with pytest.raises(ConfigurationError, match=r"mem_per_job is MiB per worker .*'lots' \(from "
                                                 r"environment variable FIBER_MEM_PER_JOB"):
        resolve({}, environ={"FIBER_MEM_PER_JOB": "lots"}, cwd=tmp_path)


def test_a_fiberconfig_file_configures_executors_below_fiberexecs_own(tmp_path: Path) -> None:
    """Fiber's ``.fiberconfig`` in the current directory: below the environment and below
    fiberexec's own config file; a key Fiber does not have is refused, as Fiber refused it."""
    (tmp_path / ".fiberconfig").write_text(
        "[default]\nbackend = docker\nimage = me/env:2\nmem_per_job = 256\nlog_level = debug\n")
    config = resolve({}, environ={}, cwd=tmp_path)
    assert (config.backend, config.image, config.resources.memory) == (
        "docker", "me/env:2", 256 << 20)
    assert resolve({}, environ={"FIBER_IMAGE": "me/env:3"}, cwd=tmp_path).image == "me/env:3"
    (tmp_path / ".fiberexec.toml").write_text('image = "me/env:4"\n')
    assert resolve({}, environ={}, cwd=tmp_path).image == "me/env:4"
    (tmp_path / ".fiberconfig").write_text("[default]\nbakcend = docker\n")
    with pytest.raises(ConfigurationError, match=r"unknown key\(s\) \['bakcend'\]"):
        resolve({}, environ={}, cwd=tmp_path)
    _, problems = diagnose(environ={}, cwd=tmp_path)  # (`fiberexec info` lists it instead)
    assert [(p.key, p.value) for p in problems] == [("config file", str(tmp_path / ".fiberconfig"))]
