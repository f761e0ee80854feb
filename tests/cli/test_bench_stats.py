"""Tests for cli/bench_stats.py: paired ratios with Student-t intervals, round order."""

from __future__ import annotations

import math
import random

import pytest

from sglang_overlap.cli.bench_stats import paired_ratio, round_orders, t975


def test_t_quantiles() -> None:
    assert (t975(1), t975(2), t975(9), t975(30), t975(45), t975(1000)) == (
        12.706, 4.303, 2.262, 2.042, 2.000, 1.960)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t975(0)


def test_paired_ratio_hand_worked() -> None:
    # per-round ratios 0.5 and 2: log-mean 0 -> ratio 1; sd of logs = ln 2 * sqrt 2
    r = paired_ratio([1.0, 4.0], [2.0, 2.0])
    assert r.ratio == pytest.approx(1.0)
    half = 12.706 * (math.log(2) * math.sqrt(2)) / math.sqrt(2)
    assert (r.low, r.high) == (pytest.approx(math.exp(-half)), pytest.approx(math.exp(half)))
    one = paired_ratio([3.0], [2.0])
    assert (one.ratio, one.low, one.high, one.text()) == (1.5, None, None, "1.500x")
    same = paired_ratio([5.0, 6.0, 7.0], [5.0, 6.0, 7.0])
    assert (same.ratio, same.low, same.high) == (1.0, 1.0, 1.0)
    assert same.text() == "1.000x [1.000, 1.000]"


def test_paired_ratio_covers_the_truth_about_95_percent() -> None:
    rng = random.Random(0)
    hits = 0
    for _ in range(2000):
        base = [rng.uniform(50, 150) for _ in range(5)]
        vals = [b * 0.9 * math.exp(rng.gauss(0, 0.05)) for b in base]
        r = paired_ratio(vals, base)
        assert r.low is not None and r.high is not None
        hits += r.low <= 0.9 <= r.high
    assert 0.93 <= hits / 2000 <= 0.97, hits


def test_bad_series() -> None:
    with pytest.raises(ValueError, match="equally long"):
        paired_ratio([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([0.0], [1.0])


def test_round_orders_alternate() -> None:
    assert round_orders(2, 4) == [[0, 1], [1, 0], [0, 1], [1, 0]]
    assert round_orders(3, 2) == [[0, 1, 2], [2, 1, 0]]
