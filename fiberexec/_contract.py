"""What every backend passes to ``python -m fiberexec.worker``: environment variable names.

Backends copy `WorkerSpec.env` and `WorkerSpec.secret_env` into the worker's environment
unchanged; they never need to interpret these values.
"""

from __future__ import annotations

WORKER_COMMAND = ("python", "-m", "fiberexec.worker")

ENV_ADDRESS = "FIBEREXEC_ADDRESS"  # where the worker dials: tcp://10.0.0.5:40123, or tls+tcp://
#: the executor's abstract Unix socket for this worker, tried first (see `fiberexec._link`)
ENV_LOCAL_ADDRESS = "FIBEREXEC_LOCAL_ADDRESS"
ENV_WORKER_ID = "FIBEREXEC_WORKER_ID"
ENV_EXECUTOR_ID = "FIBEREXEC_EXECUTOR_ID"
ENV_HEARTBEAT = "FIBEREXEC_HEARTBEAT"  # seconds between heartbeats
ENV_SILENCE = "FIBEREXEC_SILENCE"  # seconds of the executor's silence a worker waits out
ENV_CONNECT_TIMEOUT = "FIBEREXEC_CONNECT_TIMEOUT"  # give up dialing after this many seconds
#: hex of the executor's nonce for this start (one use: the worker's first message proves
#: the secret over it, see `fiberexec._protocol`)
ENV_NONCE = "FIBEREXEC_NONCE"
ENV_SECRET = "FIBEREXEC_SECRET"  # hex HMAC key; lives in WorkerSpec.secret_env only
#: hex of the parent's ``multiprocessing.current_process().authkey``, so stdlib `Manager`
#: proxies passed to tasks can authenticate from the worker; lives in secret_env only.
ENV_MP_AUTHKEY = "FIBEREXEC_MP_AUTHKEY"
#: JSON list of the parent's ``sys.path`` entries, absolute (see `fiberexec._syspath`).
ENV_SYS_PATH = "FIBEREXEC_SYS_PATH"
ENV_TLS_CERT = "FIBEREXEC_TLS_CERT"  # the executor's certificate (PEM), given to workers
ENV_TLS_SERVER_NAME = "FIBEREXEC_TLS_SERVER_NAME"  # the name its certificate carries
#: the threads each numerical library in the worker may start (see `fiberexec._threads`)
ENV_THREADS = "FIBEREXEC_THREADS"
