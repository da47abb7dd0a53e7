"""TLS for executors whose workers reach them over an untrusted network.

The executor listens with a certificate and key of yours; workers receive the certificate
itself (public) and accept only a peer that presents it, so no CA infrastructure is needed
(pinning). The HMAC handshake still runs inside TLS: TLS keeps the stream private, the
shared secret still proves each side belongs to this executor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fiberexec._errors import ConfigurationError


@dataclass(frozen=True)
class TLSOptions:
    """Encrypt every connection between the executor and its workers.

    Args:
        cert_file: PEM certificate the executor presents; its subjectAltName must cover
            ``server_name``.
        key_file: the certificate's private key (PEM); it never leaves this process.
        server_name: the name workers check in the certificate (default: the address they
            dial, e.g. ``127.0.0.1`` or the executor's pod IP).

    Example:
        >>> tls = TLSOptions("ex.crt", "ex.key")  # doctest: +SKIP
        >>> FiberExecutor(8, backend="kubernetes", tls=tls)  # doctest: +SKIP
    """

    cert_file: str | Path
    key_file: str | Path
    server_name: str | None = None
    cert: str = field(init=False, repr=False)
    key: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "cert", _read(self.cert_file, "cert_file", "CERTIFICATE"))
        object.__setattr__(self, "key", _read(self.key_file, "key_file", "PRIVATE KEY"))

    def server_config(self) -> Any:
        import pynng

        return pynng.TLSConfig(
            pynng.TLSConfig.MODE_SERVER, own_cert_string=self.cert, own_key_string=self.key
        )


def client_config(cert: str, server_name: str) -> Any:
    """What a worker dials with: trust exactly the executor's certificate."""
    import pynng

    return pynng.TLSConfig(pynng.TLSConfig.MODE_CLIENT, ca_string=cert, server_name=server_name)


def _read(path: str | Path, what: str, marker: str) -> str:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigurationError(f"TLS {what} {str(path)!r} cannot be read: {exc}") from exc
    if "-----BEGIN " not in text or marker not in text:
        raise ConfigurationError(
            f"TLS {what} {str(path)!r} is not a PEM {marker.lower()}; "
            "pass a PEM file (e.g. from openssl req -x509 ...)"
        )
    return text
