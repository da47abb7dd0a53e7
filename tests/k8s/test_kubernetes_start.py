"""An executor whose workers can never start says why, fast, in the kubelet's words."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from fiberexec import BrokenFiberExecutor, FiberExecutor
from tests.k8s.emulator import Emulator


def test_typo_in_the_image_breaks_the_executor_within_30s(
    emu: Emulator, make_backend: Callable[..., Any],
) -> None:
    emu.fail_image_pull("me/es-typo:1", "no-repository")
    started = time.monotonic()
    with FiberExecutor(2, backend=make_backend(image="me/es-typo:1")) as ex:
        future = ex.submit(abs, -1)
        with pytest.raises(BrokenFiberExecutor) as info:
            future.result(timeout=60)
    assert time.monotonic() - started < 30
    message = str(info.value)
    assert "ErrImagePull: rpc error: code = Unknown desc = failed to pull and unpack image " \
           '"docker.io/me/es-typo:1"' in message
    assert "pull access denied, repository does not exist" in message
