"""Fixtures for the ssh backend's tests: the test bed, a certificate, backends that close."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fiberexec import TLSOptions
from fiberexec.backends.ssh import SSHBackend
from tests.support.backend_ssh import backend_options
from tests.testbed.fixtures import healthy_links, lab
from tests.testbed.session import Lab

__all__ = ["healthy_links", "lab", "make_backend", "tls"]


@pytest.fixture(scope="session")
def tls(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> TLSOptions:
    """A self-signed certificate for the executor host's address."""
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "executor.crt", directory / "executor.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=fiberexec",
         "-addext", f"subjectAltName=IP:{lab.executor_address}"],
        check=True, capture_output=True, timeout=60,
    )
    return TLSOptions(cert, key)


@pytest.fixture
def make_backend(lab: Lab) -> Iterator[Callable[..., SSHBackend]]:
    """``make_backend(**overrides)``: an SSHBackend on the test bed; all closed afterwards."""
    made: list[SSHBackend] = []

    def make(**overrides: Any) -> SSHBackend:
        made.append(SSHBackend(**backend_options(lab, **overrides)))
        return made[-1]

    yield make
    for backend in made:
        backend.close()


def empty_venv(directory: Path) -> str:
    """A Python without fiberexec: a fresh venv with nothing installed."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)],
                   check=True, capture_output=True, timeout=120)
    return str(directory / "bin" / "python")
