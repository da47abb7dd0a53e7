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
from collections.abc import Callable
from typing import Any

# What a child's first put, get, send or receive would otherwise import under its caller's
# lock: the local backend's launcher imports this program once, before its first fork of
# it, so its children start with these loaded.
from fiberexec.multiprocessing import _route, _stream  # noqa: F401

EXIT_NO_PARENT = 4
_leaving = threading.Event()  # the process's code is done: exit handlers run


def _exit(code: int) -> None:
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    from fiberexec.multiprocessing import _forward, _owned

    _forward.finish()  # where the output goes to the parent: what is left of it
    # its locks and values end with it (their names, as its finalizers would; holders
    # elsewhere keep what they opened), without its resource tracker's warnings
    _owned.remove_all()
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
    from fiberexec._serialize import loads_bytes
    from fiberexec.multiprocessing import _calls as calls
    from fiberexec.multiprocessing import _forward, _process, _rpc

    try:
        address = os.environ[_process.ENV_ADDRESS]
        proc_id = int(os.environ[_process.ENV_PROCESS])
        secret = _auth.secret_from_hex(os.environ.pop(_process.ENV_SECRET))
    except KeyError as exc:
        sys.exit(f"fiberexec process: missing environment variable {exc}; Process.start sets it")
    authkey = bytes.fromhex(os.environ.pop(_process.ENV_AUTHKEY, ""))
    client = _rpc.client_for(address, secret)
    client.on_lost(lambda: _parent_gone(address))
    if os.environ.get(_forward.ENV_OUTPUT) == "forward":
        _forward.start(_rpc.Endpoint(address, secret))
    _set_parent(client.lost)
    from fiberexec import _procstate, _untracked_shm

    _procstate.adopt_tracker()  # started afresh: its parent named its tracker's pipe, if any
    _untracked_shm.attach_without_tracking()
    if authkey:  # before unpickling: stdlib Manager proxies authenticate as they are rebuilt
        import multiprocessing

        multiprocessing.current_process().authkey = authkey
    _set_logging(os.environ.get(_process.ENV_LOG, ""))
    from fiberexec import _syspath

    origin = _syspath.adopt(os.environ.get(_syspath.ENV_SYS_PATH))  # before any unpickling
    from fiberexec import _mainspace
    from fiberexec.multiprocessing import _main

    _main.adopt(origin)
    # ``__main__.<name>``: the copy the process brought, else the parent's main module
    _mainspace.install(origin, fallback=_main.lookup)
    _, payload = client.call(calls.Fetch(proc_id, os.getpid()))
    try:
        process = loads_bytes(payload, what="process")
    except Exception:  # a failure of this process, not its parent's absence (exit code 4)
        _leaving.set()
        traceback.print_exc()
        _exit(1)
    _mainspace.adopt((process, vars(process)))  # its target's script names (see there)
    _become(process, authkey)
    _exit(_run(process))


def _set_parent(lost: threading.Event) -> None:
    import multiprocessing.process

    from fiberexec.multiprocessing import _process

    pid, _, name = os.environ.get(_process.ENV_PARENT, "0 ?").partition(" ")
    _process._parent = _process._ParentProcess(int(pid), name, lost)
    # code that asks the stdlib (``multiprocessing.parent_process()``) gets the same
    multiprocessing.process._parent_process = _process._parent  # type: ignore[attr-defined]


def _set_logging(setting: str) -> None:
    if not setting:
        return
    from multiprocessing import util

    level, to_stderr = setting.split()
    if to_stderr == "1":
        util.log_to_stderr()
    util.get_logger().setLevel(int(level))


def _become(process: Any, authkey: bytes) -> None:
    """Make ``process`` this process's `current_process()`, for us and for the stdlib."""
    import multiprocessing

    from fiberexec.multiprocessing import _process

    process._child_pid = os.getpid()
    process._authkey = authkey
    _process._current = process
    multiprocessing.current_process().name = process.name


def _guarded(call: Callable[[], object]) -> int:
    """Call ``call()`` as the stdlib runs a process's code: 0, the SystemExit code, or 1
    with the traceback on stderr."""
    try:
        call()
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:
        print(f"Process {_current_name()}:", file=sys.stderr)
        traceback.print_exc()
        return 1
    return 0


def _current_name() -> str:
    from fiberexec.multiprocessing import _process

    return _process.current_process().name


def _stdlib_exit_function() -> None:
    from multiprocessing import util

    util._exit_function()  # type: ignore[attr-defined]


def _parent_gone(address: str) -> None:
    if _leaving.is_set():  # our own exit closes the connection
        return
    print(f"fiberexec process {os.getpid()}: parent at {address} is gone; exiting",
          file=sys.stderr, flush=True)
    threading.Thread(target=_exit, args=(EXIT_NO_PARENT,), daemon=True).start()


def _run(process: object) -> int:
    code = _guarded(process.run)  # type: ignore[attr-defined]
    _leaving.set()
    from fiberexec.multiprocessing._connection import release_all
    from fiberexec.multiprocessing._process import join_children

    try:
        # as the stdlib's children: its finalizers and children, our children (daemonic
        # ones terminated, the others joined), then threads that are not daemons. Like a
        # forked child (not a spawned one), no atexit handler runs
        code = _guarded(_stdlib_exit_function) or code
        join_children()
        code = _guarded(threading._shutdown) or code  # type: ignore[attr-defined]
    finally:
        release_all()  # our pipe ends close, so readers elsewhere see EOF
        from fiberexec.multiprocessing._stream import settle_all

        settle_all()  # writers that sent here directly take back what was not read
    return code


if __name__ == "__main__":
    main()
