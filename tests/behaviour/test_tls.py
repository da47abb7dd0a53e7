"""TLS: workers connect over tls+tcp, pin the executor's certificate, and plaintext is refused."""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
from pathlib import Path

import pynng
import pytest

from fiberexec import ConfigurationError, TLSOptions
from fiberexec._link_nng import Channel
from fiberexec._tls import client_config
from tests import tasks
from tests.conftest import ExecutorFactory
from tests.support.backend_local import NetworkLocalBackend
from tests.support.kit import BackendKit


def _certificate(directory: Path, name: str, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and ``host``, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed to make test certificates")
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=fiberexec",
         "-addext", f"subjectAltName=DNS:localhost,IP:127.0.0.1,{_san(host)}"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key


def _san(host: str) -> str:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return f"DNS:{host}"
    return f"IP:{host}"


def test_tasks_run_over_tls(
    make_executor: ExecutorFactory, kit: BackendKit, tmp_path: Path
) -> None:
    probe = kit.make_backend()  # where this backend's workers dial the executor
    host = probe.advertise_host
    probe.close()
    cert, key = _certificate(tmp_path, "executor", host)
    ex = make_executor(2, tls=TLSOptions(cert, key))
    assert list(ex.map(tasks.square, range(50), chunksize=5, timeout=60)) == [
        i * i for i in range(50)
    ]
    conns = [c for s in ex._pool.shards for c in s.conns.values()  # type: ignore[union-attr]
             if c.channel.kind]  # the workers that connected (one may still be starting)
    if probe.workers_share_host:  # the local link: never leaves the host, no TLS to use
        assert conns and all(c.channel.kind == "unix" for c in conns)
    else:
        assert conns and all(c.channel.address.startswith("tls+tcp://") for c in conns)


def test_tasks_run_over_tls_on_the_network_link(make_executor: ExecutorFactory,
                                                tmp_path: Path) -> None:
    """Local processes sent over the network link, TLS on: the bytes really go through it."""
    cert, key = _certificate(tmp_path, "executor")
    ex = make_executor(2, backend=NetworkLocalBackend(), tls=TLSOptions(cert, key))
    assert list(ex.map(tasks.square, range(50), chunksize=5, timeout=60)) == [
        i * i for i in range(50)
    ]
    conns = [c for s in ex._pool.shards for c in s.conns.values()  # type: ignore[union-attr]
             if c.channel.kind]  # the workers that connected (one may still be starting)
    assert conns
    assert all(c.channel.kind == "nng" and c.channel.address.startswith("tls+tcp://")
               for c in conns)


def test_plaintext_and_foreign_certificates_are_refused(tmp_path: Path) -> None:
    """On a channel with no peer yet, only a client that pins our certificate gets in."""
    cert, key = _certificate(tmp_path, "executor")
    other_cert, _ = _certificate(tmp_path, "other")
    connected: list[object] = []
    channel = Channel.listen("127.0.0.1", max_message=1 << 20, on_connect=connected.append,
                             on_remove=lambda pipe: None,
                             tls=TLSOptions(cert, key).server_config())
    try:
        plain = channel.address.replace("tls+tcp://", "tcp://")
        with pynng.Pair1(send_timeout=1000) as attacker, pytest.raises(pynng.NNGException):
            attacker.dial(plain, block=True)  # no TLS handshake: refused
        foreign = client_config(other_cert.read_text(), "127.0.0.1")
        with pynng.Pair1(tls_config=foreign) as impostor, pytest.raises(pynng.NNGException):
            impostor.dial(channel.address, block=True)  # does not trust our certificate
        assert connected == []
        with pynng.Pair1(tls_config=client_config(cert.read_text(), "127.0.0.1")) as worker:
            worker.dial(channel.address, block=True)  # the pinned certificate: accepted
            worker.send(b"hello")
            received = channel.recv(timeout=10)
            assert received is not None and received.bytes == b"hello"
    finally:
        channel.close()


def test_bad_tls_files_name_the_problem(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cert_file .* cannot be read"):
        TLSOptions(tmp_path / "missing.crt", tmp_path / "missing.key")
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate")
    with pytest.raises(ConfigurationError, match="is not a PEM certificate"):
        TLSOptions(junk, junk)
