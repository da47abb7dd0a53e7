"""The consumer's tally page and the broker's view of it (`_tally`), in one process."""

from __future__ import annotations

import os
import secrets
import tempfile

import pytest

from fiberexec.multiprocessing import _tally

pytestmark = pytest.mark.skipif(not _tally.available(), reason="needs memfd and /proc")


def _view_of(page: _tally.TallyPage) -> _tally.TallyView:
    return _tally.TallyView(page.path, page.nonce)


def test_the_broker_reads_what_the_consumer_counts() -> None:
    page = _tally.TallyPage()
    first, second = page.slot(), page.slot()
    assert (first, second) == (0, 1)
    view = _view_of(page)
    assert view.read(0) == 0 and view.read(1) == 0
    page.write(1, 5)
    page.write(0, 2**40 + 3)
    assert (view.read(0), view.read(1)) == (2**40 + 3, 5)
    view.close()
    assert view.read(1) is None  # a closed view reads nothing, and does not fail
    page.close()


def test_a_page_announced_with_another_nonce_is_refused() -> None:
    page = _tally.TallyPage()
    with pytest.raises(OSError, match="not the page this consumer announced"):
        _tally.TallyView(page.path, secrets.token_bytes(_tally.NONCE))
    page.close()


def test_a_descriptor_that_is_not_a_page_is_refused() -> None:
    with tempfile.TemporaryFile() as other, pytest.raises(  # a file, not a page's size
            OSError, match="not a consumer's tally page"):
        _tally.TallyView(f"/proc/{os.getpid()}/fd/{other.fileno()}", b"\0" * _tally.NONCE)
    with pytest.raises(OSError):  # no such descriptor: another host's path, say
        _tally.TallyView(f"/proc/{os.getpid()}/fd/99999", b"\0" * _tally.NONCE)


def test_slots_run_out_and_then_every_take_is_reported() -> None:
    page = _tally.TallyPage()
    slots = [page.slot() for _ in range(_tally.SLOTS)]
    assert slots == list(range(_tally.SLOTS))
    assert page.slot() is None
    view = _view_of(page)
    page.write(_tally.SLOTS - 1, 7)  # the last slot ends inside the page
    assert view.read(_tally.SLOTS - 1) == 7
    view.close()
    page.close()


def test_a_write_caught_halfway_reads_as_unknown() -> None:
    page = _tally.TallyPage()
    slot = page.slot() or 0
    view = _view_of(page)
    page.counts[2 * slot] = 9  # the first of the two stores, alone
    assert view.read(slot) is None
    page.counts[2 * slot + 1] = 9
    assert view.read(slot) == 9
    view.close()
    page.close()
