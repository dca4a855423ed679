"""``service_gc``: the young-generation threshold and the start-up freeze last as long as the service, no longer."""

from __future__ import annotations

import gc

from process.gc_tuning import service_gc


def test_threshold_is_raised_for_the_service_and_put_back() -> None:
    before = gc.get_threshold()
    with service_gc(12_345) as after_startup:
        assert gc.get_threshold() == (12_345, *before[1:])
        after_startup()
    assert gc.get_threshold() == before


def test_after_startup_freezes_once_and_exit_unfreezes() -> None:
    assert gc.get_freeze_count() == 0
    with service_gc(0) as after_startup:
        assert gc.get_freeze_count() == 0, "nothing is frozen before start-up is over"
        after_startup()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        after_startup()
        assert gc.get_freeze_count() == frozen
    assert gc.get_freeze_count() == 0


def test_zero_keeps_the_interpreters_threshold_and_an_error_still_restores() -> None:
    before = gc.get_threshold()
    try:
        with service_gc(0):
            assert gc.get_threshold() == before
            gc.set_threshold(99)  # whatever happened meanwhile, exit restores what was there before
            raise RuntimeError("start-up failed")
    except RuntimeError:
        pass
    assert gc.get_threshold() == before
