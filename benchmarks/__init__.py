"""fiberexec's benchmark suite: ``python -m benchmarks.run [--quick] [--plot]``."""
