"""The ``fiberexec`` command: ``info``, ``run``, ``cleanup``, ``top`` and ``bench``.

Installed as ``fiberexec`` (``[project.scripts]``) and runnable as ``python -m fiberexec``.
Errors in what the user asked for (`ConfigurationError`) print one line and exit with 2; a
backend that fails (`BackendError`, e.g. an engine or cluster that refused) prints one line
and exits with 1. Backends do the work through optional capabilities (`Backend.launch_master`,
`Backend.probe`, `Backend.remove_stray`), so this package holds no Docker or Kubernetes code.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from fiberexec import __version__
from fiberexec.backend import (
    BackendError,
    ConfigurationError,
    MasterRequest,
    Sweep,
    available_backends,
    check_backend_name,
)
from fiberexec.config import ExecutorConfig, diagnose, resolve, unknown_variables

EXIT_USAGE = 2
INTERVAL_MIN, INTERVAL_MAX = 0.01, 3600.0  # fiberexec top's refresh period, seconds
EXIT_BACKEND = 1
BENCH_HINT = (
    "the benchmark suite ships with the source tree, not the wheel: "
    "git clone the fiberexec repository, cd into it and run `fiberexec bench` there "
    "(it needs pip install 'fiberexec[bench]')"
)


BACKEND_OPTION = "the --backend option"


def _config(backend: str | None = None, image: str | None = None) -> ExecutorConfig:
    if backend is not None:
        check_backend_name(backend, BACKEND_OPTION)
    return resolve({"backend": backend, "image": image})


# ------------------------------------------------------------------ commands


def cmd_info(args: argparse.Namespace) -> int:
    """Every setting, the bad ones flagged (then exit 2), unknown variables, and backends."""
    from fiberexec import _cli_info as info

    config, problems = diagnose()
    found = info.Findings(config, problems, unknown_variables(os.environ),
                          info.probe_all(available_backends(), config))
    if args.json:
        print(json.dumps(info.as_json(found), indent=2))
    else:
        print(info.report(found, __version__))
    for problem in problems:
        print(f"fiberexec info: {problem.message}", file=sys.stderr)
    return EXIT_USAGE if problems else 0


def cmd_run(args: argparse.Namespace) -> int:
    from fiberexec import _cli_run as launch

    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    config = _config(backend=args.backend, image=args.image)
    request = MasterRequest(
        command=tuple(command),
        backend=config.backend,
        image=config.image,
        env=launch.parse_env(args.env),
        namespace=args.namespace,
        service_account=args.service_account,
        start_timeout=args.start_timeout,
        keep=args.keep,
    )
    return launch.run(request)


def cmd_cleanup(args: argparse.Namespace) -> int:
    from fiberexec import _cli_cleanup as cleanup

    if args.backend:
        check_backend_name(args.backend, BACKEND_OPTION)
    names = [args.backend] if args.backend else available_backends()
    asks = args.all and not args.dry_run and not args.yes
    if asks and not sys.stdin.isatty():
        raise ConfigurationError(
            "--all removes live executors' workers too, and there is no terminal to ask on; "
            "pass --yes to remove them, or --dry-run to list them")
    executor = args.executor
    if executor is not None:
        seen = cleanup.survey(names, args.namespace)
        # a dry run refuses a live executor as the real one does (unless --force)
        executor = cleanup.pick_executor(executor, seen, force=args.force)
        if executor not in seen:  # a typo, or a backend that cannot be surveyed knows it
            print(f"no backend here reports workers of an executor whose id is or starts "
                  f"with {executor!r}; sweeping for that id as given", file=sys.stderr,
                  flush=True)
    sweep = Sweep(executor_id=executor, everything=args.all, dry_run=args.dry_run,
                  namespace=args.namespace)
    if args.all and not args.dry_run:
        for line in cleanup.listing(names, sweep):
            print(line, flush=True)  # on screen before anything is removed
        if asks and input("remove them? [y/N] ").strip().lower() not in ("y", "yes"):
            print("nothing removed")
            return 0
    failed: list[str] = []
    for line in cleanup.run(names, sweep, failed):
        print(line, flush=True)
    # The backend asked for by name could not be cleaned up: a script must be able to tell
    # (unnamed ones that are not set up here are skipped as expected)
    return EXIT_BACKEND if args.backend and failed else 0


def cmd_top(args: argparse.Namespace) -> int:
    from fiberexec import _cli_top as top

    if not INTERVAL_MIN <= args.interval <= INTERVAL_MAX:  # (nan is neither)
        raise ConfigurationError(
            f"--interval must be a number of seconds from {INTERVAL_MIN} to {INTERVAL_MAX}, "
            f"got {args.interval}")
    return top.run(args.executor, once=args.once, interval=args.interval)


def find_benchmarks(cwd: Path) -> Path | None:
    """The folder holding ``benchmarks/run.py``: here, or the source tree fiberexec runs from."""
    for root in (cwd, Path(__file__).resolve().parent.parent):
        if (root / "benchmarks" / "run.py").is_file():
            return root
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    root = find_benchmarks(Path.cwd())
    if root is None:
        print(f"fiberexec bench: {BENCH_HINT}", file=sys.stderr)
        return EXIT_USAGE
    extra = [a for a in args.extra if a != "--"]
    command = [sys.executable, "-m", "benchmarks.run", *(["--quick"] if args.quick else []),
               *extra]
    return subprocess.run(command, cwd=root, check=False).returncode


# ------------------------------------------------------------------ parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fiberexec",
        description="Run Python work across processes, containers and clusters.",
    )
    parser.add_argument("--version", action="version", version=f"fiberexec {__version__}")
    # Not required here: `parse` names an unknown option before it says a command is missing.
    sub = parser.add_subparsers(dest="command_name", metavar="COMMAND")

    info = sub.add_parser("info", help="the resolved configuration and the usable backends")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(parser=info, func=cmd_info)

    run = sub.add_parser(
        "run", help="run a program as the master job (process, container or pod)",
        description="Run PROGRAM as the master job on a backend; its FiberExecutor starts "
                    "workers on the same backend. On backends that run it with this "
                    "machine's interpreter (local, slurm), a PROGRAM of 'python' or "
                    "'python3' means the interpreter fiberexec is installed in "
                    f"({sys.executable}), not the one first on PATH; containers (docker, "
                    "kubernetes) run their image's python. Example: fiberexec run --backend "
                    "docker --image me/app:1 -- python train.py --epochs 3")
    run.add_argument("--backend", help="local, docker, kubernetes or any backend that can "
                                       "launch a master (default: FIBEREXEC_BACKEND, the "
                                       "config file, local)")
    run.add_argument("--image", help="image for the master and the workers "
                                     "(default: FIBEREXEC_IMAGE or the config file)")
    run.add_argument("-e", "--env", action="append", default=[], metavar="KEY=VALUE",
                     help="extra environment variable for the program (repeatable)")
    run.add_argument("--namespace", help="kubernetes: namespace (default: the context's)")
    run.add_argument("--service-account", default="fiberexec-executor",
                     help="kubernetes: service account of the master pod "
                          "(default: fiberexec-executor, see docs/kubernetes-rbac.yaml)")
    run.add_argument("--start-timeout", type=float, default=300.0,
                     help="kubernetes: seconds the pod may stay Pending (default: 300)")
    run.add_argument("--keep", action="store_true",
                     help="docker, kubernetes: keep the container or pod after it exits")
    run.add_argument("command", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]")
    run.set_defaults(parser=run, func=cmd_run)

    clean = sub.add_parser(
        "cleanup", help="remove workers whose executor is gone",
        description="Remove workers whose executor is gone: every executor holds a lease "
                    "its workers name (its process on this machine, a lease container on "
                    "Docker, a Lease on Kubernetes, the wrapper on an ssh host), and only "
                    "workers whose lease is gone are removed. Live executors' workers stay.")
    clean.add_argument("--backend", help="only this backend (default: every backend)")
    which = clean.add_mutually_exclusive_group()
    which.add_argument("--executor", metavar="ID",
                       help="this executor's workers (and its Secret and lease), once it has "
                            "ended; a unique start of the id will do")
    which.add_argument("--all", action="store_true",
                       help="every fiberexec worker, live executors' too; lists them first, "
                            "then asks (--yes: does not ask)")
    clean.add_argument("--force", action="store_true",
                       help="with --executor: remove the workers of an executor that still "
                            "runs (it starts new ones)")
    clean.add_argument("--yes", action="store_true",
                       help="with --all: remove without asking (needed when stdin is not a "
                            "terminal)")
    clean.add_argument("--dry-run", action="store_true",
                       help="remove nothing; say what would be removed")
    clean.add_argument("--namespace", help="kubernetes: namespace (default: the context's)")
    clean.set_defaults(parser=clean, func=cmd_cleanup)

    top = sub.add_parser(
        "top", help="watch a running executor's workers, tasks and failures",
        description="Attach to an executor of this user on this machine made with "
                    "observe=True (or FIBEREXEC_OBSERVE=1) and show its workers, the task "
                    "each runs and for how long (stragglers, over 3x their function's "
                    "median, marked '!'), throughput and the last failures.")
    top.add_argument("--executor", metavar="ID",
                     help="the executor's id (or a unique start of it) or pid, when several "
                          "are running")
    top.add_argument("--once", action="store_true",
                     help="print one snapshot and exit (no screen control)")
    top.add_argument("--interval", type=float, default=1.0,
                     help="seconds between refreshes (default: 1)")
    top.set_defaults(parser=top, func=cmd_top)

    bench = sub.add_parser(
        "bench", help="run the benchmark suite and print its table",
        description="Run `python -m benchmarks.run` from the source tree; arguments after "
                    "-- go to it (e.g. -- --workloads submit,latency).")
    bench.add_argument("--quick", action="store_true", help="small sizes, one repeat")
    bench.add_argument("extra", nargs=argparse.REMAINDER, metavar="-- ARGS")
    bench.set_defaults(parser=bench, func=cmd_bench)
    return parser


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; an unknown one is named by the parser of the command it was given to
    (with that command's usage), before a missing command is."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        culprit: argparse.ArgumentParser = getattr(args, "parser", parser)
        culprit.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command_name is None:
        parser.error("a COMMAND is required: info, run, cleanup, top or bench")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    try:
        code: int = args.func(args)
        sys.stdout.flush()  # (here, not at exit: a reader that left is said below)
    except ConfigurationError as exc:
        print(f"fiberexec {args.command_name}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BackendError as exc:
        print(f"fiberexec {args.command_name}: {exc}", file=sys.stderr)
        return EXIT_BACKEND
    except BrokenPipeError:  # the reader left (``fiberexec info --json | head``): as cat does
        devnull = os.open(os.devnull, os.O_WRONLY)  # nothing more reaches it, at exit either
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 128 + signal.SIGPIPE
    return code
