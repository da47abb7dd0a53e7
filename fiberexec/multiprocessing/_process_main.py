"""The program a `Process` runs as: ``python -m fiberexec.multiprocessing._process_main``.

It dials the parent's broker, authenticates with ``FIBEREXEC_MP_SECRET``, fetches its pickled
`Process`, runs it, and exits with its code. It exits at once if the broker goes away.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from typing import Any

EXIT_NO_PARENT = 4


def _exit(code: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    os._exit(code)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def main() -> None:
    from fiberexec import _auth
    from fiberexec.multiprocessing import _process, _rpc
    from fiberexec.multiprocessing._wire import loads

    try:
        address = os.environ[_process.ENV_ADDRESS]
        proc_id = int(os.environ[_process.ENV_PROCESS])
        secret = _auth.secret_from_hex(os.environ.pop(_process.ENV_SECRET))
    except KeyError as exc:
        sys.exit(f"fiberexec process: missing environment variable {exc}; Process.start sets it")
    authkey = bytes.fromhex(os.environ.pop(_process.ENV_AUTHKEY, ""))
    client = _rpc.client_for(address, secret)
    client.on_lost(lambda: _parent_gone(address))
    _set_parent(client.lost)
    from fiberexec.multiprocessing import _shared_memory

    _shared_memory.attach_without_tracking()
    if authkey:  # before unpickling: stdlib Manager proxies authenticate as they are rebuilt
        import multiprocessing

        multiprocessing.current_process().authkey = authkey
    _, payload = client.call("fetch", (proc_id, os.getpid()))
    process = loads(payload, what="process")
    _become(process, authkey)
    _exit(_run(process))


def _set_parent(lost: threading.Event) -> None:
    from fiberexec.multiprocessing import _process

    pid, _, name = os.environ.get(_process.ENV_PARENT, "0 ?").partition(" ")
    _process._parent = _process._ParentProcess(int(pid), name, lost)


def _become(process: Any, authkey: bytes) -> None:
    """Make ``process`` this process's `current_process()`, for us and for the stdlib."""
    import multiprocessing

    from fiberexec.multiprocessing import _process

    process._child_pid = os.getpid()
    process._authkey = authkey
    _process._current = process
    multiprocessing.current_process().name = process.name


def _parent_gone(address: str) -> None:
    print(f"fiberexec process {os.getpid()}: parent at {address} is gone; exiting",
          file=sys.stderr, flush=True)
    threading.Thread(target=_exit, args=(EXIT_NO_PARENT,), daemon=True).start()


def _run(process: object) -> int:
    try:
        process.run()  # type: ignore[attr-defined]
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        name = getattr(process, "name", "?")
        print(f"Process {name}:", file=sys.stderr)
        traceback.print_exc()
        code = 1
    from fiberexec.multiprocessing._connection import release_all
    from fiberexec.multiprocessing._process import join_children

    try:
        join_children()  # as the stdlib: daemonic children terminated, the others joined
    finally:
        release_all()  # our pipe ends close, so readers elsewhere see EOF
        from fiberexec.multiprocessing._stream import settle_all

        settle_all(5.0)  # writers that sent here directly take back what was not read
    return code


if __name__ == "__main__":
    main()
