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
from fiberexec._claims import SUFFIX, ClaimBoard
from fiberexec._link import Endpoint
from fiberexec.worker import EXIT_AUTH_FAILED, EXIT_NO_BOARD


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


def _setup(proof: bytes, board: bool = False) -> bytes:
    return p.encode(p.Setup(proof, board, board, 1.0, 30.0, 0, None))


def _greeted(executor: Executor, *, bind: bool = True) -> tuple[p.Hello, Any]:
    """The worker's Hello and the pipe it came on (bound, unless told not to)."""
    msg = executor.receive()
    hello = p.decode(msg.bytes)
    assert isinstance(hello, p.Hello)
    if bind:
        executor.endpoint.bind(msg.pipe)
    return hello, msg.pipe


def _ours(executor: Executor) -> list[str]:
    return sorted(n for n in os.listdir(_shm.SHM_DIR) if executor.executor_id in n)


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
        hello, _ = _greeted(executor)
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


def test_the_worker_opens_the_claim_boards_semaphore_the_executor_made(
        executor: Executor) -> None:
    """Making a named semaphore writes a temporary file first, which a worker killed in that
    call would leave: a worker makes only its board's page and opens the semaphore the
    executor made, then unlinks its name."""
    worker = _start(executor.env())
    board = None
    try:
        hello, pipe = _greeted(executor, bind=False)
        assert _ours(executor) == [hello.shm_probe, hello.shm_probe + SUFFIX]  # no semaphore
        board = ClaimBoard.attach(hello.shm_probe)  # as the shard does on a Hello of ours
        assert board is not None
        _shm.discard(hello.shm_probe)
        board.unlink(semaphore=False)
        assert _ours(executor) == [f"sem.{hello.shm_probe}{SUFFIX}"]
        executor.endpoint.bind(pipe)
        executor.endpoint.send_nowait(_setup(
            _auth.proof(executor.secret, "executor", hello.nonce, executor.nonce), board=True))
        assert isinstance(p.decode(executor.receive().bytes), p.Heartbeat)
        assert _ours(executor) == []  # it opened the semaphore, and unlinked it
        assert board.take_back([0]) == {0}  # ours and the worker's: one semaphore
        executor.endpoint.send_nowait(p.encode(p.Bye("done")))
        assert isinstance(p.decode(executor.receive().bytes), p.Bye)
        executor.endpoint.close()
        worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
        if board is not None:
            board.close()
    assert worker.returncode == 0


@pytest.mark.parametrize("executor_then", ["hangs up", "stays"])
def test_a_worker_told_of_a_board_it_cannot_open_never_runs_a_task(
        executor: Executor, executor_then: str) -> None:
    """An executor unlinks a board's names when it lets a worker go: a worker that finds no
    semaphore leaves quietly once the executor hangs up, and with an error that says why if
    it does not (the executor would take back tasks the worker then ran anyway)."""
    worker = _start(executor.env(**{_contract.ENV_CONNECT_TIMEOUT: "2"}))
    try:
        hello, _ = _greeted(executor)
        executor.endpoint.send_nowait(_setup(
            _auth.proof(executor.secret, "executor", hello.nonce, executor.nonce), board=True))
        if executor_then == "hangs up":
            executor.endpoint.close()
        _, err = worker.communicate(timeout=30)
    finally:
        worker.kill()
        worker.wait()
    if executor_then == "hangs up":
        assert (worker.returncode, err) == (0, "")
    else:
        assert worker.returncode == EXIT_NO_BOARD
        assert "claim board" in err and "cannot be opened here" in err
    assert _ours(executor) == []
