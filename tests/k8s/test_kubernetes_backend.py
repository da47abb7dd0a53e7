"""The Kubernetes adapter against the API emulator, through the real client over HTTP.

What is Kubernetes' own; the seam's contract (exit codes, signals, unknown handles, stop, close,
strays, logs) is checked for every backend by tests/conformance.

Runs only with ``FIBEREXEC_TEST_BACKEND=kubernetes``; then every failure is an error.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from typing import Any

import pytest

from fiberexec.backend import (
    LEASE_LABEL,
    PermanentBackendError,
    Resources,
    RetryPolicy,
    Sweep,
    TransientBackendError,
    WorkerState,
    lease_name,
)
from tests.k8s._kubelet import pull_error_message
from tests.k8s.conftest import Exits, make_spec
from tests.k8s.emulator import Emulator
from tests.support.backend_kubernetes import IMAGE, NAMESPACE

pytestmark = pytest.mark.skipif(
    os.environ.get("FIBEREXEC_TEST_BACKEND") != "kubernetes",
    reason="Kubernetes adapter tests run with FIBEREXEC_TEST_BACKEND=kubernetes",
)

SLEEP = ("python", "-c", "import time; time.sleep(60)")


def running(pod: dict[str, Any] | None) -> bool:
    return pod is not None and (pod.get("status") or {}).get("phase") == "Running"


def wait_running(emu: Emulator, name: str) -> None:
    emu.wait_for_pod(NAMESPACE, name, running)


def _waiting(pod: dict[str, Any] | None) -> str | None:
    """The worker container's waiting reason (ErrImagePull, ImagePullBackOff...)."""
    for container in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        return ((container.get("state") or {}).get("waiting") or {}).get("reason")
    return None


# -- exit codes and status ---------------------------------------------------------------------
def test_status_reads_the_watch_cache_not_the_api(make_backend: Any, emu: Emulator,
                                                  exits: Exits) -> None:
    backend = make_backend()
    handles = [backend.start_worker(make_spec(*SLEEP)) for _ in range(3)]
    for handle in handles:
        wait_running(emu, handle.ref)
    before = len(emu.requests)
    statuses = [backend.status(h) for h in handles for _ in range(20)]
    assert {s.state for s in statuses} <= {WorkerState.RUNNING, WorkerState.PENDING}
    assert len(emu.requests) == before
    assert len(emu.calls("watch", "pods")) == 1  # one watch for the whole backend


# -- the pod manifest --------------------------------------------------------------------------
def test_labels_resources_template_and_owner(make_backend: Any, emu: Emulator,
                                             client: Any, exits: Exits) -> None:
    from kubernetes import client as k8s

    emu.fail_image_pull("executor:1")  # the owner pod stays Pending: no process needed
    k8s.CoreV1Api(client).create_namespaced_pod(NAMESPACE, {
        "metadata": {"name": "executor-0"},
        "spec": {"containers": [{"name": "main", "image": "executor:1"}]}})
    template = {
        "metadata": {"labels": {"team": "ml"}, "annotations": {"note": "x"}},
        "spec": {"nodeSelector": {"pool": "gpu"}, "restartPolicy": "Always",
                 "tolerations": [{"key": "gpu", "operator": "Exists"}],
                 "serviceAccountName": "runner", "imagePullSecrets": [{"name": "regcred"}],
                 "volumes": [{"name": "data", "emptyDir": {}}],
                 "containers": [{"name": "worker",
                                 "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}}
    backend = make_backend(pod_template=template, owner_pod="executor-0", pending_deadline=0.5)
    spec = make_spec(*SLEEP, labels={"app": "es"}, workdir="/tmp",
                     resources=Resources(cpu=0.5, memory=256 * 2**20, gpu=1))
    handle = backend.start_worker(spec)
    pod = emu.pod(NAMESPACE, handle.ref)
    assert pod is not None
    labels = pod["metadata"]["labels"]
    assert labels == {**spec.all_labels(), "team": "ml",
                      LEASE_LABEL: lease_name(spec.executor_id)}
    assert pod["metadata"]["annotations"] == {"note": "x"}
    owner = emu.pod(NAMESPACE, "executor-0")
    assert owner is not None
    assert pod["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Pod", "name": "executor-0",
        "uid": owner["metadata"]["uid"]}]
    lease = emu.store.get("leases", NAMESPACE, labels[LEASE_LABEL])  # the executor's lease
    assert lease is not None and lease["metadata"]["ownerReferences"] == \
        pod["metadata"]["ownerReferences"]
    podspec = pod["spec"]
    assert podspec["restartPolicy"] == "Never"  # fiberexec's rule beats the template
    assert podspec["automountServiceAccountToken"] is False
    assert podspec["nodeSelector"] == {"pool": "gpu"}
    assert podspec["serviceAccountName"] == "runner"
    assert podspec["imagePullSecrets"] == [{"name": "regcred"}]
    assert podspec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    [container] = podspec["containers"]
    assert container["command"] == list(SLEEP)
    assert container["image"] == "fiberexec-test:latest"
    assert container["workingDir"] == "/tmp"
    assert container["volumeMounts"] == [{"name": "data", "mountPath": "/data"}]
    amounts = {"cpu": "500m", "memory": str(256 * 2**20), "nvidia.com/gpu": "1"}
    assert container["resources"] == {"requests": amounts, "limits": amounts}
    # the emulated node has no GPU, so the scheduler says so, in the API server's words
    backend.watch(handle, exits)
    status = exits.next()
    assert status.state is WorkerState.FAILED
    assert status.reason is not None
    assert status.reason.startswith("Unschedulable: 0/1 nodes are available: "
                                    "1 Insufficient nvidia.com/gpu")
    backend.close()
    emu.delete_pod(NAMESPACE, "executor-0")


def test_gpu_pod_runs_on_a_node_that_has_one(make_backend: Any, emu: Emulator,
                                             exits: Exits) -> None:
    emu.faults.allocatable["nvidia.com/gpu"] = "2"
    backend = make_backend()
    handle = backend.start_worker(make_spec("python", "-c", "pass",
                                            resources=Resources(gpu=1)))
    backend.watch(handle, exits)
    assert exits.next().exit_code == 0


def test_logs_of_a_running_container_the_api_still_calls_creating(
        make_backend: Any, emu: Emulator, exits: Exits) -> None:
    """A real kubelet reports a start at its next status sync; the container prints meanwhile."""
    emu.lag_status(1.5)
    backend = make_backend()
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        port = server.getsockname()[1]
        code = ("import socket; print('one'); print('two', flush=True); "
                f"c = socket.create_connection(('127.0.0.1', {port})); c.recv(1)")
        handle = backend.start_worker(make_spec("python", "-c", code))
        backend.watch(handle, exits)
        conn, _ = server.accept()
        with conn:
            assert not running(emu.pod(NAMESPACE, handle.ref)), "the status lag did not apply"
            assert backend.logs(handle, tail=1) == "two\n"
            conn.sendall(b"x")
    assert exits.next().exit_code == 0


def test_secret_env_travels_in_a_secret(make_backend: Any, emu: Emulator, exits: Exits) -> None:
    backend = make_backend()
    secret_value = "s3cr3t-0123456789abcdef"
    code = "import os; print('seen', os.environ['FIBEREXEC_SECRET'], os.environ['PLAIN'])"
    handle = backend.start_worker(make_spec("python", "-c", code, env={"PLAIN": "p"},
                                            secret_env={"FIBEREXEC_SECRET": secret_value}))
    backend.watch(handle, exits)
    assert exits.next().exit_code == 0
    assert f"seen {secret_value} p" in backend.logs(handle)
    pod = emu.pod(NAMESPACE, handle.ref)
    assert secret_value not in json.dumps(pod)
    [secret] = emu.secrets(NAMESPACE, selector="fiberexec")
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["FIBEREXEC_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"], "key": "FIBEREXEC_SECRET"}
    second = backend.start_worker(make_spec("python", "-c", "pass",
                                            secret_env={"FIBEREXEC_SECRET": secret_value}))
    assert len(emu.secrets(NAMESPACE)) == 1  # one Secret per backend, however many pods
    assert len(emu.calls("create", "secrets")) == 1
    backend.stop(second)
    backend.close()
    assert emu.secrets(NAMESPACE) == []


# -- API errors --------------------------------------------------------------------------------
@pytest.mark.parametrize(("code", "retry_after"), [(429, 2), (503, None), (500, None)])
def test_transient_bursts_are_retried(make_backend: Any, emu: Emulator, exits: Exits,
                                      code: int, retry_after: int | None) -> None:
    backend = make_backend()
    emu.fail_next(code, 3, verbs={"create"}, resources={"pods"}, retry_after=retry_after)
    waits: list[float] = []
    with pytest.raises(TransientBackendError) as info:
        backend.start_worker(make_spec("python", "-c", "pass"))
    assert info.value.retry_after == retry_after
    handle = RetryPolicy(attempts=5).call(
        lambda: backend.start_worker(make_spec("python", "-c", "pass")), sleep=waits.append)
    assert len(waits) == 2
    if retry_after is not None:
        assert all(w >= retry_after for w in waits)  # Retry-After honoured
    backend.watch(handle, exits)
    assert exits.next().exit_code == 0


def test_delete_and_secret_calls_retry_on_their_own(make_backend: Any, emu: Emulator) -> None:
    backend = make_backend()
    emu.fail_next(503, 2, verbs={"create"}, resources={"secrets"})
    handle = backend.start_worker(make_spec(*SLEEP, secret_env={"K": "v"}))
    wait_running(emu, handle.ref)
    emu.fail_next(429, 2, verbs={"delete"}, resources={"pods"}, retry_after=0)
    backend.stop(handle, grace=1)
    emu.wait_for_pod(NAMESPACE, handle.ref, lambda p: p is None)
    assert len(emu.calls("delete", "pods")) == 3


def test_forbidden_fails_at_once_naming_verb_and_resource(make_backend: Any,
                                                          emu: Emulator) -> None:
    backend = make_backend()
    emu.forbid("create", "pods")
    with pytest.raises(PermanentBackendError) as info:
        RetryPolicy(attempts=5).call(lambda: backend.start_worker(make_spec(*SLEEP)),
                                     sleep=lambda _: None)
    message = str(info.value)
    assert f'cannot create pods in namespace "{NAMESPACE}"' in message
    assert 'grant verb "create" on "pods"' in message
    assert "docs/kubernetes-rbac.yaml" in message
    assert len(emu.calls("create", "pods")) == 1


def test_forbidden_secret_names_secrets(make_backend: Any, emu: Emulator) -> None:
    backend = make_backend()
    emu.forbid("create", "secrets")
    with pytest.raises(PermanentBackendError, match='grant verb "create" on "secrets"'):
        backend.start_worker(make_spec(*SLEEP, secret_env={"K": "v"}))


def test_invalid_spec_fails_at_once(make_backend: Any, emu: Emulator) -> None:
    backend = make_backend()
    with pytest.raises(PermanentBackendError, match="422") as info:
        RetryPolicy(attempts=5).call(
            lambda: backend.start_worker(make_spec(*SLEEP, labels={"app": "not valid!"})),
            sleep=lambda _: None)
    assert "not valid!" in str(info.value)
    assert len(emu.calls("create", "pods")) == 1


def test_template_the_client_rejects_fails_at_once(make_backend: Any, emu: Emulator) -> None:
    backend = make_backend(pod_template={"spec": {"nodeSelectr": {"pool": "a"}}})
    with pytest.raises(PermanentBackendError, match="fix pod_template"):
        backend.start_worker(make_spec(*SLEEP))
    assert emu.pods(NAMESPACE) == []


def test_missing_namespace_is_permanent(make_backend: Any) -> None:
    backend = make_backend(namespace="nowhere")
    with pytest.raises(PermanentBackendError, match='namespace "nowhere" not found'):
        backend.start_worker(make_spec(*SLEEP))


def test_options_are_validated_without_io() -> None:
    from fiberexec.backends.kubernetes import KubernetesBackend

    with pytest.raises(ValueError, match="pending_deadline must be > 0"):
        KubernetesBackend(pending_deadline=0)
    with pytest.raises(ValueError, match="pod_template must be a dict"):
        KubernetesBackend(pod_template=["x"])  # type: ignore[arg-type]
    backend = KubernetesBackend(namespace="x")
    with pytest.raises(ValueError, match="need an image"):
        backend.start_worker(make_spec(*SLEEP))
    backend.close()


# -- pods that never run -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["timeout", "rate-limit"])
def test_transient_pull_error_keeps_the_deadline(make_backend: Any, emu: Emulator,
                                                 exits: Exits, kind: str) -> None:
    emu.fail_image_pull("registry.example.com/ml/es:1", kind, backoff_detail=True)
    backend = make_backend(pending_deadline=2.0)
    started = time.monotonic()
    handle = backend.start_worker(make_spec(*SLEEP, image="registry.example.com/ml/es:1"))
    backend.watch(handle, exits)
    # the kubelet retries: ErrImagePull, ImagePullBackOff, ErrImagePull again
    for reason in ("ErrImagePull", "ImagePullBackOff", "ErrImagePull"):
        emu.wait_for_pod(NAMESPACE, handle.ref, lambda p, r=reason: _waiting(p) == r)
    assert exits.empty()
    assert backend.status(handle).state is WorkerState.PENDING
    status = exits.next()
    assert time.monotonic() - started >= 2.0
    assert status.state is WorkerState.FAILED
    assert status.reason is not None
    assert status.reason.startswith(("ImagePullBackOff: ", "ErrImagePull: "))
    assert "registry.example.com/ml/es:1" in status.reason


REFUSALS = {  # what the kubelet's message says, per kind of refusal
    "not-found": 'docker.io/library/nope:1": docker.io/library/nope:1: not found',
    "no-repository": "pull access denied, repository does not exist",
    "unauthorized": "401 Unauthorized",
}


@pytest.mark.parametrize("kind", sorted(REFUSALS))
@pytest.mark.parametrize("backoff_detail", [False, True], ids=["kubelet<1.32", "kubelet>=1.32"])
def test_image_that_does_not_exist_fails_at_once(make_backend: Any, emu: Emulator,
                                                 exits: Exits, kind: str,
                                                 backoff_detail: bool) -> None:
    emu.fail_image_pull("nope:1", kind, backoff_detail=backoff_detail)
    backend = make_backend()  # pending_deadline: the default 300 s
    started = time.monotonic()
    handle = backend.start_worker(make_spec(*SLEEP, image="nope:1"))
    backend.watch(handle, exits)
    status = exits.next(timeout=30)
    assert time.monotonic() - started < 30
    assert status.state is WorkerState.FAILED
    assert status.reason == f"ErrImagePull: {pull_error_message(kind, 'nope:1')}"
    assert REFUSALS[kind] in status.reason
    assert backend.status(handle) == status


def test_unschedulable_fails_at_the_deadline(make_backend: Any, emu: Emulator,
                                             exits: Exits) -> None:
    emu.unschedulable("0/3 nodes are available: 3 Insufficient cpu.")
    backend = make_backend(pending_deadline=0.5)
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    status = exits.next()
    assert status.state is WorkerState.FAILED
    assert status.reason == "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def test_slow_scheduling_fails_at_the_deadline(make_backend: Any, emu: Emulator,
                                               exits: Exits) -> None:
    emu.slow_scheduling(30)
    backend = make_backend(pending_deadline=0.5)
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    status = exits.next()
    assert (status.state, status.reason) == (WorkerState.FAILED,
                                             "Pending: not running after 0.5s")


def test_slow_scheduling_within_the_deadline_runs(make_backend: Any, emu: Emulator,
                                                  exits: Exits) -> None:
    emu.slow_scheduling(0.5)
    backend = make_backend(pending_deadline=20)
    handle = backend.start_worker(make_spec("python", "-c", "raise SystemExit(4)"))
    assert backend.status(handle).state is WorkerState.PENDING
    backend.watch(handle, exits)
    assert exits.next().exit_code == 4


# -- pods that die -----------------------------------------------------------------------------
def test_pod_deleted_behind_our_back_is_reported(make_backend: Any, emu: Emulator,
                                                 exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    emu.delete_pod(NAMESPACE, handle.ref)
    status = exits.next()
    assert status.finished
    assert "Deleted" in str(status.reason)
    assert emu.running_processes() == []


def test_graceful_delete_behind_our_back_reports_the_exit(make_backend: Any, emu: Emulator,
                                                          exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    emu.delete_pod(NAMESPACE, handle.ref, grace=5)
    status = exits.next()
    assert (status.state, status.exit_code) == (WorkerState.EXITED, -signal.SIGTERM)


def test_oom_killed_is_reported(make_backend: Any, emu: Emulator, exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP, resources=Resources(memory=2**20)))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    emu.oom_kill(NAMESPACE, handle.ref)
    status = exits.next()
    assert (status.state, status.exit_code, status.reason) == (WorkerState.EXITED, -9,
                                                               "OOMKilled")
    assert status.describe() == "was killed by signal 9 (SIGKILL) (OOMKilled)"


def test_evicted_is_reported(make_backend: Any, emu: Emulator, exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    emu.evict(NAMESPACE, handle.ref)
    status = exits.next()
    assert status.state is WorkerState.EXITED
    assert str(status.reason).startswith("Evicted: ")


# -- the watch ---------------------------------------------------------------------------------
def test_watch_expiry_recovers_by_relisting(make_backend: Any, emu: Emulator,
                                            exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec("python", "-c",
                                            "import time; time.sleep(1); raise SystemExit(5)"))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    lists = len(emu.calls("list", "pods"))
    emu.fail_next(503, 2, verbs={"watch"})  # the outage spans the pod's exit
    emu.expire_watches()
    status = exits.next()
    assert (status.state, status.exit_code) == (WorkerState.EXITED, 5)
    assert len(emu.calls("list", "pods")) > lists  # 410 Gone made it re-list


def test_relist_notices_pods_deleted_while_not_watching(make_backend: Any, emu: Emulator,
                                                        exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    emu.fail_next(503, 2, verbs={"watch"})
    emu.expire_watches()
    emu.delete_pod(NAMESPACE, handle.ref)
    status = exits.next()
    assert status.finished
    assert "Deleted" in str(status.reason)


# -- stop, close, strays -----------------------------------------------------------------------
def test_stop_deletes_the_pod_and_forgets_it(make_backend: Any, emu: Emulator,
                                             exits: Exits) -> None:
    backend = make_backend()
    handle = backend.start_worker(make_spec(*SLEEP))
    backend.watch(handle, exits)
    wait_running(emu, handle.ref)
    backend.stop(handle, grace=1)
    emu.wait_for_pod(NAMESPACE, handle.ref, lambda p: p is None)
    assert backend.status(handle).state is WorkerState.UNKNOWN
    assert exits.empty()  # stopped on purpose: no exit report
    backend.stop(handle)  # idempotent


def test_stopping_the_last_worker_releases_secret_and_watch(make_backend: Any,
                                                             emu: Emulator, exits: Exits) -> None:
    backend = make_backend()
    handles = [backend.start_worker(make_spec(*SLEEP, secret_env={"K": "v"})) for _ in range(2)]
    backend.stop(handles[0])
    assert len(emu.secrets(NAMESPACE)) == 1  # still needed by the other worker
    backend.stop(handles[1])
    assert emu.secrets(NAMESPACE) == []
    assert emu.pods(NAMESPACE) == []  # the last stop waits for the pods to be gone
    assert not [t for t in threading.enumerate() if t.name.startswith("fiberexec-kubernetes")]
    again = backend.start_worker(make_spec("python", "-c", "raise SystemExit(2)",
                                           secret_env={"K": "v"}))
    backend.watch(again, exits)
    assert exits.next().exit_code == 2
    assert len(emu.calls("create", "secrets")) == 2


def test_close_removes_pods_secret_and_processes(make_backend: Any, emu: Emulator) -> None:
    backend = make_backend()
    for _ in range(3):
        handle = backend.start_worker(make_spec(*SLEEP, secret_env={"K": "v"}))
    wait_running(emu, handle.ref)
    assert len(emu.pods(NAMESPACE)) == 3
    backend.close()
    assert emu.pods(NAMESPACE) == []
    assert emu.secrets(NAMESPACE) == []
    assert emu.running_processes() == []
    backend.close()  # idempotent
    with pytest.raises(PermanentBackendError, match="after close"):
        backend.start_worker(make_spec(*SLEEP))


def test_remove_stray(make_backend: Any, emu: Emulator, client: Any) -> None:
    from fiberexec.backends.kubernetes import remove_stray

    mine, other = make_backend(), make_backend()
    for _ in range(2):
        mine.start_worker(make_spec(*SLEEP, executor_id="exa", secret_env={"K": "v"}))
    other.start_worker(make_spec(*SLEEP, executor_id="exb"))
    assert remove_stray(client, namespace=NAMESPACE) == []  # both executors hold their lease
    removed = remove_stray(client, namespace=NAMESPACE, executor_id="exa")
    assert [line.split()[1] for line in removed] == ["pod", "pod", "secret", "lease"], removed
    assert [p["metadata"]["labels"]["fiberexec.executor"] for p in
            emu.pods(NAMESPACE, selector="fiberexec")] == ["exb"]
    assert len(remove_stray(client, namespace=NAMESPACE, sweep=Sweep(everything=True))) == 2
    for backend in (mine, other):
        backend.close()
    assert emu.pods(NAMESPACE) == []
    assert emu.running_processes() == []


def test_one_backend_serves_one_executor(make_backend: Any) -> None:
    backend = make_backend()
    backend.start_worker(make_spec(*SLEEP, executor_id="exa"))
    with pytest.raises(ValueError, match="one KubernetesBackend serves one executor"):
        backend.start_worker(make_spec(*SLEEP, executor_id="exb"))


# -- the emulator itself -----------------------------------------------------------------------
def test_emulator_pod_created_again_under_its_name_is_another_pod(emu: Emulator,
                                                                  client: Any) -> None:
    """The node still runs a pod the API server already dropped (a force delete the kubelet
    has not acted on) when a pod of the same name is created: the old pod's exit must not
    touch the new pod's status, object or log (a kubelet tracks pods by uid)."""
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(client)
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(10)
        port = server.getsockname()[1]

        def pod(code: str) -> dict[str, Any]:
            return {"metadata": {"name": "again"}, "spec": {"containers": [{
                "name": "worker", "image": IMAGE, "command": ["python", "-c", code]}]}}

        core.create_namespaced_pod(NAMESPACE, pod(
            "import socket; print('first', flush=True); "
            f"socket.create_connection(('127.0.0.1', {port})).recv(1)"))
        conn, _ = server.accept()  # the first pod's process runs
        [first] = [t for t in threading.enumerate() if t.name == "kubelet-again"]
        emu.store.delete("pods", NAMESPACE, "again")
        core.create_namespaced_pod(NAMESPACE, pod(
            "import socket; print('second', flush=True); "
            f"socket.create_connection(('127.0.0.1', {port})).recv(1)"))
        second, _ = server.accept()  # the second pod's process runs, and has printed
        conn.close()  # the first process exits now, its pod long gone
        first.join(10)
        assert not first.is_alive()
        again = emu.pod(NAMESPACE, "again")
        assert running(again), f"the old pod's exit reached the new pod: {again}"
        assert core.read_namespaced_pod_log("again", NAMESPACE) == "second\n"
        second.close()
    core.delete_namespaced_pod("again", NAMESPACE, grace_period_seconds=0)


def test_emulator_label_selectors(emu: Emulator, client: Any) -> None:
    from kubernetes import client as k8s

    core = k8s.CoreV1Api(client)
    for name, labels in (("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db"}),
                         ("c", {"env": "dev"})):
        core.create_namespaced_secret(NAMESPACE, {"metadata": {"name": name, "labels": labels},
                                                  "stringData": {"k": "v"}})

    def names(selector: str) -> list[str]:
        return [s.metadata.name for s in
                core.list_namespaced_secret(NAMESPACE, label_selector=selector).items]

    assert names("tier=web") == ["a"]
    assert names("tier==db") == ["b"]
    assert names("tier!=web") == ["b", "c"]
    assert names("tier in (web, db)") == ["a", "b"]
    assert names("env notin (prod)") == ["b", "c"]
    assert names("tier") == ["a", "b"]
    assert names("!tier") == ["c"]
    assert names("tier,env=prod") == ["a"]
    [secret] = [s for s in core.list_namespaced_secret(NAMESPACE).items if s.metadata.name == "a"]
    assert secret.data == {"k": "dg=="}
    for name in "abc":
        core.delete_namespaced_secret(name, NAMESPACE)
