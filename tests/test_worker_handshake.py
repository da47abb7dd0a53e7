"""A real worker process's side of the handshake, against a test standing in for the
executor on the local link: it proves itself in its first message, over the nonce its start
request carries, and acts on nothing from a peer that cannot prove the secret. (The shard's
side: `tests/test_shard.py`.)"""

from __future__ import annotations

import os
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from fiberexec import _auth, _contract, _shm
from fiberexec import _protocol as p
from fiberexec._link import Endpoint
from fiberexec.worker import EXIT_AUTH_FAILED


class Executor:
    """The executor's end of one worker's local link, and the worker's start request."""

    def __init__(self) -> None:
        self.name = f"fiberexec-test/{os.getpid()}/{secrets.token_hex(4)}"
        self.endpoint = Endpoint(self.name, None, on_remove=lambda pipe: None,
                                 max_frame=p.MAX_MESSAGE)
        self.secret = _auth.new_secret()
        self.nonce = _auth.new_nonce()
        self.executor_id = f"hs{secrets.token_hex(4)}"

    def env(self, **changes: str) -> dict[str, str]:
        env = {**os.environ,
               _contract.ENV_ADDRESS: "tcp://127.0.0.1:9",  # (never dialled: local first)
               _contract.ENV_LOCAL_ADDRESS: self.name,
               _contract.ENV_WORKER_ID: "w0",
               _contract.ENV_EXECUTOR_ID: self.executor_id,
               _contract.ENV_CONNECT_TIMEOUT: "20",
               _contract.ENV_SECRET: self.secret.hex(),
               _contract.ENV_NONCE: self.nonce.hex()}
        env.update(changes)
        return env

    def receive(self, timeout: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            select.select([self.endpoint.fileno()], [], [], left)
            if (msg := self.endpoint.try_recv()) is not None:
                return msg
        raise AssertionError("the worker sent nothing")


@pytest.fixture
def executor() -> Iterator[Executor]:
    made = Executor()
    yield made
    made.endpoint.close()


def _start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fiberexec.worker"], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _setup(proof: bytes) -> bytes:
    return p.encode(p.Setup(proof, False, False, 1.0, 30.0, 0, None))


@pytest.mark.parametrize("forged", ["wrong secret", "another nonce"])
def test_a_worker_leaves_an_executor_that_cannot_prove_the_secret(
        executor: Executor, forged: str) -> None:
    worker = _start(executor.env())
    try:
        msg = executor.receive()
        hello = p.decode(msg.bytes)
        assert isinstance(hello, p.Hello) and hello.worker_id == "w0"
        assert _auth.verify(  # it proved itself over our nonce, in its first message
            _auth.proof(executor.secret, "worker", hello.nonce, executor.nonce), hello.proof)
        # and named a probe of /dev/shm holding that proof, under our prefix
        assert hello.shm_probe.startswith(f"{_shm.PREFIX}{executor.executor_id}-")
        assert _shm.check_probe(hello.shm_probe, p.PROOF_SIZE) == (hello.proof, os.getuid())
        executor.endpoint.bind(msg.pipe)
        secret, nonce = executor.secret, executor.nonce
        if forged == "wrong secret":
            secret = _auth.new_secret()
        else:
            nonce = _auth.new_nonce()
        executor.endpoint.send_nowait(_setup(_auth.proof(secret, "executor", hello.nonce, nonce)))
        _, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == EXIT_AUTH_FAILED
    assert "the executor failed authentication" in err
    # it left nothing in /dev/shm: its probe and its claim board (and their semaphore)
    assert not [n for n in os.listdir(_shm.SHM_DIR) if executor.executor_id in n]


def test_a_worker_takes_the_setup_of_an_executor_that_proves_it(executor: Executor) -> None:
    worker = _start(executor.env())
    try:
        msg = executor.receive()
        hello = p.decode(msg.bytes)
        assert isinstance(hello, p.Hello)
        executor.endpoint.bind(msg.pipe)
        executor.endpoint.send_nowait(_setup(
            _auth.proof(executor.secret, "executor", hello.nonce, executor.nonce)))
        beat = p.decode(executor.receive().bytes)  # its first word once set up
        assert isinstance(beat, p.Heartbeat)
        executor.endpoint.send_nowait(p.encode(p.Bye("done")))
        assert isinstance(p.decode(executor.receive().bytes), p.Bye)
        executor.endpoint.close()  # the executor hangs up on a worker's last word
        worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    assert worker.returncode == 0


@pytest.mark.parametrize("nonce", ["", "zz", "00" * 15])
def test_a_start_request_without_a_proper_nonce_is_refused_by_name(
        executor: Executor, nonce: str) -> None:
    result = subprocess.run([sys.executable, "-m", "fiberexec.worker"], text=True, check=False,
                            env=executor.env(**{_contract.ENV_NONCE: nonce}),
                            capture_output=True, timeout=60)
    assert result.returncode == 1
    assert "FIBEREXEC_NONCE must be 16 bytes in hex" in result.stderr
    assert "the executor sets it" in result.stderr
