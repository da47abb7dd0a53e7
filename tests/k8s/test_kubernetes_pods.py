"""Pod status -> worker status, on plain dicts: the kubelet's image pull sequence."""

from __future__ import annotations

from typing import Any

import pytest

from fiberexec.backend import WorkerState
from fiberexec.backends._k8s_pods import image_refused, pull_error, worker_status
from tests.k8s._kubelet import pull_error_message

IMAGE = "registry.example.com/ml/es:1"


def pending(reason: str, message: str) -> dict[str, Any]:
    return {"status": {"phase": "Pending", "containerStatuses": [{
        "name": "worker", "state": {"waiting": {"reason": reason, "message": message}}}]}}


def sequence(kind: str, detail: bool) -> list[dict[str, Any]]:
    """What a kubelet reports for one failing image, attempt after attempt."""
    error = pull_error_message(kind, IMAGE)
    backoff = f'Back-off pulling image "{IMAGE}"' + (f": ErrImagePull: {error}" if detail else "")
    return [pending("ErrImagePull", error), pending("ImagePullBackOff", backoff)] * 3


def replay(pods: list[dict[str, Any]], deadline: float = 300.0) -> list[Any]:
    """Statuses as the backend computes them, remembering the last ErrImagePull message."""
    last: str | None = None
    seen = []
    for pod in pods:
        last = pull_error(pod["status"]) or last
        seen.append(worker_status(pod, pending_for=1.0, pending_deadline=deadline,
                                  last_pull_error=last))
    return seen


@pytest.mark.parametrize("kind", ["not-found", "no-repository", "unauthorized"])
@pytest.mark.parametrize("detail", [False, True], ids=["kubelet<1.32", "kubelet>=1.32"])
def test_refused_pull_fails_at_every_step(kind: str, detail: bool) -> None:
    expected = f"ErrImagePull: {pull_error_message(kind, IMAGE)}"
    for status in replay(sequence(kind, detail)):
        assert (status.state, status.reason) == (WorkerState.FAILED, expected)


@pytest.mark.parametrize("kind", ["timeout", "rate-limit"])
@pytest.mark.parametrize("detail", [False, True], ids=["kubelet<1.32", "kubelet>=1.32"])
def test_transient_pull_stays_pending_until_the_deadline(kind: str, detail: bool) -> None:
    statuses = replay(sequence(kind, detail))
    assert {s.state for s in statuses} == {WorkerState.PENDING}
    assert statuses[0].reason == f"ErrImagePull: {pull_error_message(kind, IMAGE)}"
    late = replay(sequence(kind, detail), deadline=0.5)
    assert {s.state for s in late} == {WorkerState.FAILED}


def test_backoff_alone_says_nothing_about_the_image() -> None:
    pod = pending("ImagePullBackOff", f'Back-off pulling image "{IMAGE}"')
    assert pull_error(pod["status"]) is None
    assert image_refused(pod["status"], None) is None
    status = worker_status(pod, pending_for=1.0, pending_deadline=300.0)
    assert status.state is WorkerState.PENDING


def test_a_remembered_refusal_does_not_fail_a_pod_that_moved_on() -> None:
    running = {"status": {"phase": "Running", "containerStatuses": [{
        "name": "worker", "state": {"running": {}}}]}}
    creating = pending("ContainerCreating", "")
    refusal = pull_error_message("not-found", IMAGE)
    assert worker_status(running, pending_for=1.0, pending_deadline=300.0,
                         last_pull_error=refusal).state is WorkerState.RUNNING
    assert worker_status(creating, pending_for=1.0, pending_deadline=300.0,
                         last_pull_error=refusal).state is WorkerState.PENDING
