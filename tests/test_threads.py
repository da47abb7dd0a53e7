"""A worker's numerical libraries start its share of the CPUs in threads, not one per core."""

from __future__ import annotations

import pytest

import fiberexec.multiprocessing as fmp
from fiberexec import FiberExecutor, _threads
from tests.tasks import blas_threads


@pytest.fixture
def unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """None of the variables in this process's environment (local workers inherit it)."""
    for name in _threads.VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_a_share_is_the_cpus_given_else_this_hosts_cpus_among_the_workers() -> None:
    cpus = _threads.cpus()
    assert _threads.share(2.5, 8, on_this_host=False) == 2
    assert _threads.share(0.5, 8, on_this_host=True) == 1
    assert _threads.share(None, 2, on_this_host=True) == max(1, cpus // 2)
    assert _threads.share(None, 1, on_this_host=True) == cpus
    assert _threads.share(None, 4 * cpus, on_this_host=True) == 1
    assert _threads.share(None, 2, on_this_host=False) is None


def test_every_variable_is_set_unless_one_is_set_already() -> None:
    env: dict[str, str] = {}
    assert _threads.apply(env, 3) == list(_threads.VARIABLES)
    assert env == dict.fromkeys(_threads.VARIABLES, "3")
    mine = {"MKL_NUM_THREADS": "8"}
    assert _threads.apply(mine, 3) == []
    assert mine == {"MKL_NUM_THREADS": "8"}
    for nothing in (None, ""):
        empty: dict[str, str] = {}
        assert _threads.apply(empty, nothing) == []
        assert empty == {}


@pytest.mark.usefixtures("unset")
def test_each_local_worker_is_told_its_share_and_openblas_keeps_to_it() -> None:
    share = str(max(1, _threads.cpus() // 2))
    with FiberExecutor(2) as ex:
        results = [ex.submit(blas_threads).result(timeout=60) for _ in range(4)]
    for env, openblas in results:
        assert env == dict.fromkeys(_threads.VARIABLES, share)
        assert openblas == [int(share)]


@pytest.mark.usefixtures("unset")
def test_workers_forked_after_the_launcher_imported_numpy_keep_to_their_share() -> None:
    """Executors after the first fork their workers from the launcher, which by then has
    imported numpy (the workers before needed it): it did so under the workers' share."""
    share = max(1, _threads.cpus() // 2)
    seen = []
    for _ in range(3):
        with FiberExecutor(2) as ex:
            seen += [openblas for _, openblas in ex.map(blas_threads, range(4))]
    assert seen == [[share]] * 12


@pytest.mark.usefixtures("unset")
def test_a_multiprocessing_pools_workers_are_told_their_share() -> None:
    share = str(max(1, _threads.cpus() // 2))
    with fmp.Pool(2) as pool:
        env, openblas = pool.apply(blas_threads)
    assert env == dict.fromkeys(_threads.VARIABLES, share)
    assert openblas == [int(share)]


@pytest.mark.usefixtures("unset")
def test_a_variable_given_in_env_leaves_every_other_to_the_user() -> None:
    # (one worker, whose share would be every CPU: OpenBLAS uses no more than there are)
    with FiberExecutor(1, env={"OPENBLAS_NUM_THREADS": "1"}) as ex:
        env, openblas = ex.submit(blas_threads).result(timeout=60)
    assert env == {"OPENBLAS_NUM_THREADS": "1"}
    assert openblas == [1]


@pytest.mark.usefixtures("unset")
def test_a_variable_in_the_callers_environment_is_inherited_and_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    with FiberExecutor(2) as ex:
        env, _ = ex.submit(blas_threads).result(timeout=60)
    assert env == {"OMP_NUM_THREADS": "2"}
