"""The joblib backend "fiber": joblib's documented backend behaviour, on every fiberexec backend."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import cloudpickle
import pytest
from joblib import Parallel, delayed, effective_n_jobs, parallel_config
from joblib.parallel import BACKENDS, cpu_count

import fiberexec.joblib as fj
from fiberexec import ConfigurationError
from tests import joblib_tasks as jt
from tests.support.kit import BackendKit

Options = dict[str, Any]


@pytest.fixture
def opts(kit: BackendKit) -> Iterator[Options]:
    """Executor options for the backend under test; warm executors are stopped afterwards."""
    yield {"executor_backend": kit.make_backend(), "heartbeat": 0.5, **kit.executor_kwargs}
    fj.shutdown_executors(wait=True)


# ---------------------------------------------------------------- registration and options


def test_import_registers_fiber_and_register_adds_names() -> None:
    assert BACKENDS["fiber"] is fj.FiberBackend
    fj.register("fiber-test")
    try:
        assert BACKENDS["fiber-test"] is fj.FiberBackend
    finally:
        del BACKENDS["fiber-test"]


def test_without_joblib_the_import_names_the_extra_to_install() -> None:
    hide = ("import sys; sys.modules['joblib'] = None\n"  # (an import of it then fails)
            "import fiberexec.joblib")
    done = subprocess.run([sys.executable, "-c", hide], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "ModuleNotFoundError: fiberexec.joblib needs joblib, which is not installed; install "
        "it with pip install 'fiberexec[joblib]' (or pip install joblib)")


def test_unknown_option_names_the_accepted_ones() -> None:
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\) \['imgae'\].*'image'"):
        fj.FiberBackend(imgae="me/app:1")
    with pytest.raises(ConfigurationError, match="not both"):
        fj.FiberBackend(executor_backend="local", backend="local")


def test_a_misspelt_option_gets_the_nearest_and_the_list_as_it_is_accepted() -> None:
    with pytest.raises(ConfigurationError) as info, parallel_config(
            backend="fiber", n_jobs=2, max_workerz=3):
        pass
    message = str(info.value)
    assert message.startswith("the fiber joblib backend got unknown option(s) ['max_workerz']; "
                              "did you mean 'max_workers'? it accepts FiberExecutor's options [")
    accepted = message.split("options ")[1]
    assert "'max_workers'" in accepted and "'executor_backend'" in accepted
    assert "'backend'" not in accepted  # joblib's own; the executor's is executor_backend=


def test_a_misspelt_executor_backend_is_named_as_typed() -> None:
    with pytest.raises(ConfigurationError, match=re.escape(
            "unknown backend 'lcoal' (from the executor_backend= option); did you mean "
            "'local'?")):
        fj.FiberBackend(executor_backend="lcoal")


def test_unknown_option_through_parallel_kwargs_is_rejected(opts: Options) -> None:
    with pytest.raises(ConfigurationError, match="nope"):
        Parallel(n_jobs=2, backend="fiber", nope=1)(delayed(jt.square)(i) for i in range(2))


def test_parallel_config_passes_executor_options(opts: Options) -> None:
    with parallel_config(
        backend="fiber", n_jobs=2, initializer=jt.set_marker, initargs=("hello",),
        max_task_retries=1, **opts,
    ):
        markers = Parallel()(delayed(jt.read_marker)(i) for i in range(6))
    assert markers == ["hello"] * 6


# ---------------------------------------------------------------- n_jobs


def test_n_jobs_follows_joblib_rules() -> None:
    backend = fj.FiberBackend()
    assert backend.effective_n_jobs(None) == 1
    assert backend.effective_n_jobs(3) == 3
    assert backend.effective_n_jobs(-1) == cpu_count()
    assert backend.effective_n_jobs(-cpu_count() - 5) == 1
    with pytest.raises(ValueError, match="n_jobs == 0"):
        backend.effective_n_jobs(0)
    assert fj.FiberBackend(max_workers=64).effective_n_jobs(-2) == 63


def test_effective_n_jobs_under_parallel_config() -> None:
    with parallel_config(backend="fiber", n_jobs=3):
        assert effective_n_jobs(None) == 3
    with parallel_config(backend="fiber", max_workers=10):
        assert effective_n_jobs(-1) == 10


def test_n_jobs_none_is_one_unless_parallel_config_sets_it(opts: Options) -> None:
    with parallel_config(backend="fiber", **opts):
        assert set(Parallel()(delayed(jt.pid)(i) for i in range(4))) == {os.getpid()}
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        assert os.getpid() not in set(Parallel()(delayed(jt.pid)(i) for i in range(4)))


def test_n_jobs_one_runs_in_this_process(opts: Options) -> None:
    pids = Parallel(n_jobs=1, backend=fj.FiberBackend(**opts))(delayed(jt.pid)(i) for i in range(3))
    assert set(pids) == {os.getpid()}


# ---------------------------------------------------------------- results


def test_lambdas_and_closures_travel(opts: Options) -> None:
    offset = 7

    def shifted(x: int) -> int:
        return x + offset

    with parallel_config(backend="fiber", n_jobs=2, **opts):
        assert Parallel()(delayed(lambda x: x * 3)(i) for i in range(5)) == [0, 3, 6, 9, 12]
        assert Parallel()(delayed(shifted)(i) for i in range(3)) == [7, 8, 9]


@pytest.mark.parametrize("return_as", ["generator", "generator_unordered"])
def test_return_as_generators(opts: Options, return_as: str) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        out = Parallel(return_as=return_as)(
            delayed(jt.sleep_return)(0.05 * (4 - i), i) for i in range(4)
        )
        assert not isinstance(out, list)
        got = list(out)
    assert got == [0, 1, 2, 3] if return_as == "generator" else sorted(got) == [0, 1, 2, 3]


def test_auto_batching_grows_batches_for_tiny_tasks(opts: Options) -> None:
    backend = fj.FiberBackend(**opts)
    assert Parallel(n_jobs=2, backend=backend)(delayed(jt.square)(i) for i in range(20000)) == [
        i * i for i in range(20000)
    ]
    with Parallel(n_jobs=2, backend=backend) as parallel:
        parallel(delayed(jt.square)(i) for i in range(20000))
        assert backend.compute_batch_size() > 1


def test_large_numpy_arguments_and_results(opts: Options) -> None:
    np = pytest.importorskip("numpy")
    arrays = [np.full(3 << 20, float(i)) for i in range(3)]  # 24 MiB each
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        stats = Parallel()(delayed(jt.array_stats)(a) for a in arrays)
        made = Parallel()(delayed(jt.make_array)(3 << 20, i) for i in range(2))
    assert stats == [(24 << 20, float(i * (3 << 20))) for i in range(3)]
    assert [float(m[-1]) for m in made] == [0.0, 1.0]


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_tasks_write_into_a_memory_map_the_caller_passes(tmp_path: Any, backend: str) -> None:
    """joblib's documented pattern: a `numpy.memmap` (small: below ``max_nbytes``; or a
    large array loaded ``mmap_mode="r+"``), or a view of one, reaches the workers as its
    file, and what tasks write there is in the caller's map (on workers of this host)."""
    np = pytest.importorskip("numpy")
    import joblib

    extra = {"executor_backend": "local"} if backend == "fiber" else {}
    small = np.memmap(tmp_path / "small.mmap", dtype=np.float64, shape=(4,), mode="w+")
    joblib.dump(np.zeros(200_000), tmp_path / "large.pkl")
    large = joblib.load(tmp_path / "large.pkl", mmap_mode="r+")
    with parallel_config(backend=backend, n_jobs=2, **extra):
        Parallel()(delayed(jt.write_at)(small, i) for i in range(4))
        Parallel()(delayed(jt.write_at)(large, i) for i in range(4))
        Parallel()(delayed(jt.write_at)(large[100::2], i) for i in range(4))
    fj.shutdown_executors(wait=True)
    assert small.tolist() == [100.0, 101.0, 102.0, 103.0]
    assert large[:4].tolist() == [100.0, 101.0, 102.0, 103.0]
    assert large[100:108].tolist() == [100.0, 0.0, 101.0, 0.0, 102.0, 0.0, 103.0, 0.0]


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_large_arrays_made_for_each_task_reach_each_its_own(opts: Options, backend: str) -> None:
    """A large array made as the tasks are (``X + k``, ``X[idx]``: bootstrap samples) is
    freed once sent, and the next one may get its id: each must still travel as its own
    file. Every task got the next one's data, or a file being written (EOFError), when a
    file name was reused."""
    np = pytest.importorskip("numpy")
    base = np.zeros((2000, 100))  # 1.6 MB: over joblib's default max_nbytes
    extra = opts if backend == "fiber" else {}
    with parallel_config(backend=backend, n_jobs=2, **extra):
        for _ in range(3):
            got = Parallel()(delayed(jt.first_item)(base + k) for k in range(24))
            assert got == list(range(24))


def test_a_long_call_removes_each_arrays_file_once_its_task_is_done(opts: Options) -> None:
    """Files of arrays made for each task go as their tasks end, not at the call's end:
    200 of 1.6 MB would be 320 MB in /dev/shm by then (loky kept 183 of 200 in a run)."""
    np = pytest.importorskip("numpy")
    import glob

    base, most = np.zeros((2000, 100)), 0
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        results = Parallel(return_as="generator")(delayed(jt.first_item)(base + k)
                                                   for k in range(200))
        for k, got in enumerate(results):
            assert got == k
            most = max(most, len(glob.glob(f"/dev/shm/fiberexec-joblib-{os.getpid()}-*/*.npy")))
    assert 0 < most <= 60


def test_workers_share_the_cpus_among_their_thread_pools(monkeypatch: pytest.MonkeyPatch) -> None:
    """As joblib sets them for loky (`ParallelBackendBase._prepare_worker_env`): the CPUs
    shared among the workers, or ``inner_max_num_threads``; a limit the caller's
    environment sets is kept; ``env`` has the last word."""
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)

    def seen(**config: Any) -> dict[str, str | None]:
        with parallel_config(backend="fiber", n_jobs=2, executor_backend="local", **config):
            (limits,) = Parallel()(delayed(jt.thread_limits)() for _ in range(1))
        return limits  # type: ignore[no-any-return]

    share = str(max(cpu_count() // 2, 1))
    assert seen() == dict.fromkeys(jt.thread_limits(), share)
    assert seen(inner_max_num_threads=3) == dict.fromkeys(jt.thread_limits(), "3")
    assert seen(env={"MKL_NUM_THREADS": "4"})["MKL_NUM_THREADS"] == "4"
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    kept = seen()
    fj.shutdown_executors(wait=True)
    assert kept["OMP_NUM_THREADS"] == "5" and kept["OPENBLAS_NUM_THREADS"] == share


# ---------------------------------------------------------------- reuse


def test_warm_executor_is_reused_across_calls(opts: Options) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        a = set(Parallel(batch_size=1)(delayed(jt.pid)(i) for i in range(20)))
        b = set(Parallel(batch_size=1)(delayed(jt.pid)(i) for i in range(20)))
    assert a == b


def test_a_call_with_another_n_jobs_replaces_the_idle_executor(opts: Options) -> None:
    """As loky resizes its one executor: calls that vary ``n_jobs`` keep one pool (they
    kept one per size, each with its idle workers, until the idle timeout)."""
    from fiberexec._joblib_backend import _warm

    for n_jobs in (2, 3, 2, 4):
        with parallel_config(backend="fiber", n_jobs=n_jobs, **opts):
            assert Parallel()(delayed(jt.square)(i) for i in range(8)) == [
                i * i for i in range(8)]
        assert [ex.max_workers for ex in _warm.executors()] == [n_jobs]


def test_reuse_false_leaves_nothing_running(kit: BackendKit, opts: Options) -> None:
    backend = fj.FiberBackend(reuse=False, **opts)
    assert Parallel(n_jobs=2, backend=backend)(delayed(jt.square)(i) for i in range(5)) == [
        0, 1, 4, 9, 16,
    ]
    assert backend._executor is None
    assert kit.leaks() == []


def test_managed_parallel_reuses_backend_across_calls(opts: Options) -> None:
    with Parallel(n_jobs=2, backend=fj.FiberBackend(**opts)) as parallel:
        assert parallel(delayed(jt.square)(i) for i in range(4)) == [0, 1, 4, 9]
        with pytest.raises(ValueError, match="task 2 refuses"):
            parallel(delayed(jt.fail_on)(i, 2) for i in range(4))
        assert parallel(delayed(jt.square)(i) for i in range(4)) == [0, 1, 4, 9]


# ---------------------------------------------------------------- errors, abort, timeout


class _Recording(fj.FiberBackend):
    """Keeps every future it hands to joblib, to see what abort_everything did to them."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.handed_out: list[Future[Any]] = []

    def submit(self, func: Any, callback: Any = None) -> Future[Any]:
        future = super().submit(func, callback)
        self.handed_out.append(future)
        return future


def test_first_error_raises_with_remote_traceback_and_cancels_the_rest(opts: Options) -> None:
    backend = _Recording(**opts)
    tasks = [delayed(jt.fail_on)(0, 0)] + [delayed(jt.sleep_return)(0.3, i) for i in range(30)]
    start = time.monotonic()
    with pytest.raises(ValueError, match="task 0 refuses") as info:
        Parallel(n_jobs=2, backend=backend, batch_size=1, pre_dispatch="all")(tasks)
    assert time.monotonic() - start < 5.0
    assert "fail_on" in str(info.value.__cause__)
    assert any(f.cancelled() for f in backend.handed_out)


def test_timeout_raises_and_stops_hung_workers(opts: Options) -> None:
    start = time.monotonic()
    with pytest.raises(multiprocessing.TimeoutError):  # what joblib raises for every backend
        Parallel(n_jobs=2, backend=fj.FiberBackend(**opts), timeout=0.5)(
            delayed(jt.sleep_return)(60, i) for i in range(2)
        )
    assert time.monotonic() - start < 10.0
    # the leak fixture checks the workers running the 60 s tasks are gone


def test_dropped_generator_aborts_and_backend_still_works(opts: Options) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        gen = Parallel(return_as="generator")(delayed(jt.sleep_return)(0.2, i) for i in range(10))
        assert next(gen) == 0
        with pytest.warns(UserWarning, match="have been cancelled"):  # joblib's own notice
            del gen
        assert Parallel()(delayed(jt.square)(i) for i in range(3)) == [0, 1, 4]


# ---------------------------------------------------------------- nesting and pickling


def test_nested_parallel_runs_on_threads_inside_workers(opts: Options) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        out = Parallel()(delayed(jt.nested_sum)(n) for n in (3, 4))
    assert out == [(5, "ThreadingBackend"), (14, "ThreadingBackend")]


def test_explicit_fiber_inside_a_worker_falls_back_to_threads(opts: Options) -> None:
    with parallel_config(backend="fiber", n_jobs=2, **opts):
        (distinct_pids, _threads), = Parallel()(delayed(jt.nested_explicit_fiber)(4) for _ in [0])
    assert distinct_pids == 1  # ran in the worker itself, not in workers of workers


def test_backend_and_its_nested_backend_are_picklable() -> None:
    backend = fj.FiberBackend(nesting_level=0, image="me/app:1", reuse=False)
    clone = pickle.loads(cloudpickle.dumps(backend))
    assert (clone.options, clone.reuse, clone.nesting_level) == ({"image": "me/app:1"}, False, 0)
    nested, n_jobs = backend.get_nested_backend()
    assert pickle.loads(pickle.dumps(nested)).nesting_level == 1 and n_jobs is None


# ---------------------------------------------------------------- scikit-learn


def test_sklearn_grid_search_matches_sequential(opts: Options) -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import GridSearchCV
    from sklearn.svm import SVC

    X, y = datasets.load_iris(return_X_y=True)
    grid = {"C": [0.1, 1.0, 10.0], "gamma": ["scale", 0.1]}
    sequential = GridSearchCV(SVC(), grid, cv=3, n_jobs=None).fit(X, y)
    with parallel_config(backend="fiber", **opts):
        parallel = GridSearchCV(SVC(), grid, cv=3, n_jobs=2).fit(X, y)
    assert parallel.best_params_ == sequential.best_params_
    assert list(parallel.cv_results_["mean_test_score"]) == list(
        sequential.cv_results_["mean_test_score"]
    )


def test_sklearn_cross_val_score_matches_sequential(opts: Options) -> None:
    datasets = pytest.importorskip("sklearn.datasets")
    from sklearn.model_selection import cross_val_score
    from sklearn.tree import DecisionTreeClassifier

    X, y = datasets.load_wine(return_X_y=True)
    model = DecisionTreeClassifier(random_state=0)
    sequential = cross_val_score(model, X, y, cv=5)
    with parallel_config(backend="fiber", **opts):
        parallel = cross_val_score(model, X, y, cv=5, n_jobs=2)
    assert list(parallel) == list(sequential)


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_generator_unordered_returns_the_fastest_task_first(opts: Options, backend: str) -> None:
    extra = opts if backend == "fiber" else {}
    with parallel_config(backend=backend, n_jobs=2, **extra):
        # Warm both workers: two slow tasks at once run on two workers, whichever way the
        # backend places them, so neither is still starting when the timing begins.
        Parallel()(delayed(jt.sleep_return)(1.0, i) for i in range(2))
        start = time.monotonic()
        results = Parallel(return_as="generator_unordered", batch_size=1)(
            delayed(jt.sleep_return)(s, s) for s in (1.5, 0.0)
        )
        first = next(results)
        elapsed = time.monotonic() - start
        assert (first, list(results)) == (0.0, [1.5])
    assert elapsed < 1.0, f"the instant task came back after {elapsed:.2f}s"


@pytest.mark.parametrize("n_jobs", [2, 4])
@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_generator_unordered_yields_every_quick_task_before_a_slow_one(
        opts: Options, backend: str, n_jobs: int) -> None:
    # joblib's own check, on more jobs than this machine has cores: the second of ten tasks
    # takes far longer than the others and the whole start; the other nine come first
    extra = opts if backend == "fiber" else {}
    with parallel_config(backend=backend, n_jobs=n_jobs, **extra):
        results = Parallel(return_as="generator_unordered")(
            delayed(jt.sleep_return)(60.0 if i == 1 else 0.0, i) for i in range(10)
        )
        quick = sorted(next(results) for _ in range(9))
        with pytest.warns(UserWarning, match="have been cancelled"):  # joblib's own notice
            del results  # aborts the call: the slow task's worker is stopped, not awaited
    assert quick == [0, *range(2, 10)]


def _pool_of(backend: Any) -> Any:
    """A joblib backend's pool of workers, where joblib's own tests look for it."""
    return getattr(backend, "_pool", getattr(backend, "_workers", None))


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_an_error_restarts_the_pool_of_a_managed_parallel(opts: Options, backend: str) -> None:
    extra = opts if backend == "fiber" else {}
    with parallel_config(backend=backend, **extra), Parallel(n_jobs=2) as parallel:
        first = _pool_of(parallel._backend)
        assert first is not None
        with pytest.raises(ValueError, match="task 1 refuses"):
            parallel(delayed(jt.fail_on)(i, 1) for i in range(2))
        second = _pool_of(parallel._backend)
        assert second is not None and second is not first
        assert parallel(delayed(jt.square)(i) for i in range(4)) == [0, 1, 4, 9]
    assert _pool_of(parallel._backend) is None


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_large_arrays_reach_same_host_workers_as_one_read_only_map(
        opts: Options, backend: str) -> None:
    np = pytest.importorskip("numpy")
    big, small = np.ones(300_000), np.ones(10)  # 2.4 MB over joblib's default 1M, and not
    extra = opts if backend == "fiber" else {}
    with parallel_config(backend=backend, n_jobs=2, **extra):
        views = Parallel(batch_size=1)(delayed(jt.array_view)(a) for a in [big] * 4 + [small])
        copies = Parallel(batch_size=1, max_nbytes=None)(delayed(jt.array_view)(big)
                                                          for _ in range(2))
    *mapped, unmapped = views
    if backend == "fiber" and not opts["executor_backend"].workers_share_host:
        assert all(v[0] == "ndarray" for v in views)  # another host: copies, as with loky's
        return
    assert {(kind, writable, total) for kind, _, writable, total in mapped} == {
        ("memmap", False, 300_000.0)}
    assert len({filename for _, filename, _, _ in mapped}) == 1  # one file for every task
    assert unmapped[0] == "ndarray" and copies[0][0] == "ndarray"


KILLED_IN_A_CALL = """
import os, signal, sys, threading
import numpy as np
from joblib import Parallel, delayed
from joblib.externals.loky.backend import resource_tracker
import fiberexec.joblib  # noqa: F401  # registers "fiber"
from tests import joblib_tasks as jt

def kill_when_mapped():
    while True:
        folders = [n for n in os.listdir("/dev/shm")
                   if n.startswith(f"fiberexec-joblib-{os.getpid()}-") and n not in before]
        if folders and resource_tracker._resource_tracker._pid:
            print(folders[0], resource_tracker._resource_tracker._pid, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Event().wait(0.05)

before = set(os.listdir("/dev/shm"))
threading.Thread(target=kill_when_mapped, daemon=True).start()
big = np.ones(2_000_000)
Parallel(n_jobs=2, backend="fiber")(delayed(jt.sleep_return)(0.5, big) for _ in range(40))
"""


def test_a_program_killed_in_a_call_leaves_no_memmap_folder() -> None:
    """Killed while its large arguments sit in a memmap folder, a program leaves it to
    joblib's resource tracker, which removes it once the program is gone, as it does for
    loky's folders."""
    import signal
    import subprocess
    import sys

    from fiberexec.backend import readable_within

    proc = subprocess.run([sys.executable, "-c", KILLED_IN_A_CALL], capture_output=True,
                          text=True, timeout=120, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    folder, tracker = proc.stdout.split()
    try:
        pidfd = os.pidfd_open(int(tracker))
    except ProcessLookupError:
        pass
    else:
        try:
            assert readable_within(pidfd, 60), "joblib's resource tracker did not end"
        finally:
            os.close(pidfd)
    assert not os.path.exists(os.path.join("/dev/shm", folder))


@pytest.mark.parametrize("backend", ["loky", "fiber"])
def test_a_task_that_ends_its_worker_raises_terminated_worker_error(
        backend: str, opts: Options) -> None:
    """loky's `TerminatedWorkerError` is what joblib code catches when a worker dies: on
    the fiber backend, the `WorkerLostError` a call raises once the retries are spent is
    one too (and still a `BrokenProcessPool`)."""
    from concurrent.futures.process import BrokenProcessPool

    from joblib.externals.loky.process_executor import TerminatedWorkerError

    from fiberexec import WorkerLostError

    options = {"max_task_retries": 0, **opts} if backend == "fiber" else {}
    with parallel_config(backend=backend, n_jobs=2, **options), \
            pytest.raises(TerminatedWorkerError) as raised:
        Parallel()(delayed(jt.exit_now)(1) for _ in range(2))
    assert isinstance(raised.value, BrokenProcessPool)
    if backend == "fiber":
        assert isinstance(raised.value, WorkerLostError)
        assert "terminated abruptly" in str(raised.value) or "died" in str(raised.value)
    with parallel_config(backend=backend, n_jobs=2, **options):
        assert Parallel()(delayed(jt.square)(i) for i in range(3)) == [0, 1, 4]  # goes on
