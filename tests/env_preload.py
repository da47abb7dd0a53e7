"""A module that changes the environment as it is imported (preloaded by a launcher in
`tests/test_local_backend.py`): a forked worker still has the environment its executor
gives it."""

import os

os.environ["FIBEREXEC_TEST_PRELOAD_SET"] = "by the module"
os.environ["FIBEREXEC_TEST_PRELOAD_CHANGED"] = "by the module"
os.environ.pop("FIBEREXEC_TEST_PRELOAD_REMOVED", None)
