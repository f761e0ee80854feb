"""Per-mode counters: one INFO line the first time a path runs, then every LOG_EVERY steps."""

from __future__ import annotations

import logging
from collections import Counter

import pytest

from sglang_overlap import stats


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "_counts", Counter())
    monkeypatch.setattr(stats, "_steps", 0)
    monkeypatch.setattr(stats, "LOG_EVERY", 4)


def test_first_use_of_a_path_and_every_nth_step_log(fresh: None,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="sglang_overlap")
    for path in ("tbo", "tbo", "sbo", "tbo", "tbo", "none", "tbo", "tbo"):
        stats.count(path)
    lines = [r.getMessage() for r in caplog.records]
    assert [line.split(": ", 1)[1] for line in lines] == [
        "tbo=1 (first tbo)",
        "sbo=1 tbo=2 (first sbo)",
        "sbo=1 tbo=3",  # step 4
        "none=1 sbo=1 tbo=4 (first none)",
        "none=1 sbo=1 tbo=6",  # step 8
    ], lines
    assert all(line.startswith("sglang-overlap stats [pid ") for line in lines)


def test_summary_is_sorted_by_path(fresh: None) -> None:
    for path in ("two_chunk", "gate_none", "tbo"):
        stats.count(path)
    assert stats.summary().endswith("]: gate_none=1 tbo=1 two_chunk=1")


def test_labelled_series_count_and_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stats, "_series", {name: Counter() for name in stats.SERIES})
    stats.add("steps", "decode", "tbo", "graph")
    stats.add("steps", "decode", "tbo", "graph", n=2)
    stats.add("eager_fallbacks", "none", "batch above --cuda-graph-max-bs")
    snap = stats.snapshot()
    assert snap["steps"] == {("decode", "tbo", "graph"): 3}
    assert snap["eager_fallbacks"] == {("none", "batch above --cuda-graph-max-bs"): 1}
    assert snap["decisions"] == {}
    snap["steps"][("decode", "tbo", "graph")] = 0  # a copy: the counters stay
    assert stats.snapshot()["steps"] == {("decode", "tbo", "graph"): 3}


def test_labelled_series_refuse_unknown_names_and_wrong_labels() -> None:
    with pytest.raises(KeyError, match="'step'"):
        stats.add("step", "decode", "tbo", "graph")
    with pytest.raises(ValueError, match="'steps' takes labels"):
        stats.add("steps", "decode", "tbo")
