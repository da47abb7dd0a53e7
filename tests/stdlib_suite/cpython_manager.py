"""CPython's own multiprocessing test suite, its "manager" tests, on fiberexec's `Manager`;
run alone by `test_cpython_suite`.

As `cpython_processes` does for the processes tests: the suite's manager mixin starts
``multiprocessing.Manager()`` and takes every shared object from it; here it starts
`fiberexec.multiprocessing.Manager` and runs our `Process`, so every test runs unchanged
against our manager, proxies and processes. The standard library passes the same 65 tests
and skips the same 9 (the suite's own "not appropriate for manager").
"""

from __future__ import annotations

from typing import Any

import fiberexec.multiprocessing as fmp
from tests.stdlib_suite.cpython_processes import suite

_API = ("current_process", "parent_process", "active_children")


def _use_fiberexec() -> None:
    mixin = suite.ManagerMixin
    mixin.Process = fmp.Process
    for name in _API:
        setattr(mixin, name, staticmethod(getattr(fmp, name)))

    def set_up_class(cls: Any) -> None:
        suite.BaseMixin.setUpClass.__func__(cls)
        cls.manager = fmp.Manager()

    mixin.setUpClass = classmethod(set_up_class)


_use_fiberexec()
suite.install_tests_in_module_dict(globals(), "spawn", only_type="manager")
