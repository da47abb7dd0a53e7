"""A program the forking launcher runs in `tests/test_launcher_gate.py`: it says how many
children its launcher has as it starts, then waits to be killed."""

import os
import time


def main() -> None:
    with open(f"/proc/{os.getppid()}/task/{os.getppid()}/children") as f:
        siblings = len(f.read().split())  # itself included
    os.write(1, f"{os.getpid()} {siblings}\n".encode())  # one write: children write at once
    time.sleep(120)
