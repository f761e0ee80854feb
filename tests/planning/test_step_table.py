"""Tests for planning/step_table.py: the bucket grid, the all-reducible vector, recency, the
spread of a cell."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from sglang_overlap.modes import PHASES
from sglang_overlap.modes import SELECTOR_MODES as MODES
from sglang_overlap.planning.step_table import (
    NUM_BUCKETS,
    NUM_CELLS,
    StepTable,
    bucket_bounds,
    cell_index,
    format_rows,
    measure_bucket,
)


def test_buckets_hand_worked() -> None:
    assert [measure_bucket(t) for t in (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 16, 20, 31, 32)] == [
        0, 1, 2, 3, 4, 5, 6, 7, 8, 8, 9, 11, 12, 13, 15, 16]
    assert bucket_bounds(8) == (8, 9) and bucket_bounds(13) == (20, 23)
    assert measure_bucket(10**12) == NUM_BUCKETS - 1


def test_buckets_partition_the_token_counts() -> None:
    """Brute force: every count lands in the bucket whose bounds hold it; buckets are monotone,
    contiguous and at most 25% wide."""
    prev = 0
    for t in range(0, 1 << 16):
        b = measure_bucket(t)
        lo, hi = bucket_bounds(b)
        assert lo <= t <= hi, f"{t=} {b=} {lo=} {hi=}"
        assert b in (prev, prev + 1), f"{t=} {b=} {prev=}"
        assert hi - lo <= max(0, lo // 4), f"{b=} {lo=} {hi=}"
        prev = b
    rng = random.Random(0)
    for _ in range(2000):
        t = rng.randint(1 << 16, 1 << 30)
        lo, hi = bucket_bounds(measure_bucket(t))
        assert lo <= t <= hi, f"{t=}"


def test_cells_are_distinct_and_dense() -> None:
    cells = {cell_index(p, b, m) for p in PHASES for b in range(NUM_BUCKETS) for m in MODES}
    assert cells == set(range(NUM_CELLS))
    with pytest.raises(ValueError, match="bucket index"):
        bucket_bounds(NUM_BUCKETS)


def test_summed_triples_are_rank_order_independent() -> None:
    rng = random.Random(1)
    tables = []
    for _ in range(4):
        t = StepTable()
        for _ in range(200):
            t.add(rng.randrange(NUM_CELLS), rng.uniform(10, 1e5))
        tables.append(t)
    sums = []
    for order in ([0, 1, 2, 3], [3, 1, 0, 2]):
        merged = StepTable()
        for i in order:
            merged.add_cells([(c, tables[i].counts[c], tables[i].totals[c], tables[i].squares[c])
                              for c in range(NUM_CELLS) if tables[i].counts[c]])
        sums.append((merged.counts, merged.totals, merged.squares))
    assert sums[0] == sums[1]
    direct = ([sum(t.counts[c] for t in tables) for c in range(NUM_CELLS)],
              [sum(t.totals[c] for t in tables) for c in range(NUM_CELLS)],
              [sum(t.squares[c] for t in tables) for c in range(NUM_CELLS)])
    assert sums[0] == direct


def test_mean_count_cap_and_clear() -> None:
    t = StepTable()
    c = cell_index("prefill", 10, "tbo")
    assert t.mean(c) is None and t.empty()
    for us in (100.4, 200.6, 300.0):
        t.add(c, us)
    assert (t.count(c), t.mean(c)) == (3, (100 + 201 + 300) / 3)
    t.cap(2)
    assert (t.count(c), t.totals[c]) == (2, 601 * 2 // 3)
    with pytest.raises(ValueError, match="max_count"):
        t.cap(0)
    t.clear()
    assert t.empty() and not any(t.squares) and not any(t.totals)


def test_rows_and_format() -> None:
    t = StepTable()
    t.add(cell_index("decode", measure_bucket(16), "none"), 2500.0)
    t.add(cell_index("decode", measure_bucket(17), "tbo"), 3000.0)
    t.add(cell_index("decode", measure_bucket(17), "tbo"), 3100.0)
    rows = t.rows()
    assert [(r.phase, r.tokens_lo, r.tokens_hi, r.mode, r.count) for r in rows] == [
        ("decode", 16, 19, "none", 1), ("decode", 16, 19, "tbo", 2)]
    assert format_rows(rows) == "decode tokens 16-19: none=2.500ms x1, tbo=3.050ms x2"


def test_add_cells_caps_only_what_it_touches() -> None:
    t = StepTable()
    a, b = cell_index("decode", 5, "none"), cell_index("decode", 6, "tbo")
    for _ in range(10):
        t.add(a, 100.0)
    t.add_cells([(b, 5, 1000, 5 * 200**2)], max_count=4)
    assert (t.count(a), t.count(b), t.mean(b)) == (10, 4, 200.0), "a untouched, b capped"
    t.add_cells([(a, 1, 1100, 1100**2)], max_count=4)
    assert (t.count(a), t.totals[a]) == (4, (1000 + 1100) * 4 // 11)
    assert t.squares[a] == (10 * 100**2 + 1100**2) * 4 // 11
    t.add_cells([(b, 0, 0, 0)], max_count=4)  # at the cap, not over it: unchanged
    assert (t.count(b), t.totals[b], t.squares[b]) == (4, 800, 4 * 200**2)


@pytest.mark.parametrize("seed", range(4))
def test_take_then_add_cells_moves_exactly_the_measured_cells(seed: int) -> None:
    """`take` empties the cells it returns, in the order given, each once; `add_cells` of them
    on an empty table rebuilds the same counts and totals."""
    rng = random.Random(seed)
    new = StepTable()
    cells = rng.sample(range(NUM_CELLS), rng.randint(1, 6))
    for cell in cells:
        for _ in range(rng.randint(1, 5)):
            new.add(cell, rng.uniform(10.0, 5000.0))
    before = (list(new.counts), list(new.totals), list(new.squares))
    taken = new.take(cells + cells[:1] + rng.sample(range(NUM_CELLS), 3))
    assert new.empty() and [c for c, _, _, _ in taken] == cells
    assert not any(new.squares), "take empties the squares too"
    rebuilt = StepTable()
    rebuilt.add_cells(taken)
    assert (rebuilt.counts, rebuilt.totals, rebuilt.squares) == before, f"{seed=}"


def test_add_cells_refuses_a_bad_cell() -> None:
    t = StepTable()
    with pytest.raises(ValueError, match="0 <= cell < 576"):
        t.add_cells([(NUM_CELLS, 1, 10, 100)])
    with pytest.raises(ValueError, match="count >= 0"):
        t.add_cells([(0, -1, 10, 100)])
    assert t.empty()


def test_spread_hand_worked() -> None:
    """The standard error of a cell's mean: 100, 200, 300 us have a sample sd of 100 us, so
    100 / sqrt(3); one step has none; equal steps have 0."""
    t = StepTable()
    c, d = cell_index("decode", 9, "none"), cell_index("decode", 9, "tbo")
    assert t.spread(c) is None
    t.add(c, 100.0)
    assert t.spread(c) is None, "one step: no spread"
    t.add(c, 200.0)
    t.add(c, 300.0)
    assert t.squares[c] == 100**2 + 200**2 + 300**2
    assert t.spread(c) == pytest.approx(100.0 / math.sqrt(3), rel=1e-12)
    for _ in range(5):
        t.add(d, 777.0)
    assert t.spread(d) == 0.0


def test_cap_keeps_the_mean_and_the_per_step_variance() -> None:
    """100, 100, 400, 400 us: mean 250, population variance 22500 us^2. Capped to 2 steps, both
    stay; the error of the mean grows to sqrt(2 x 22500 / 2) = 150 us (fewer steps)."""
    t = StepTable()
    c = cell_index("prefill", 3, "sbo")
    for us in (100.0, 100.0, 400.0, 400.0):
        t.add(c, us)
    assert t.spread(c) == pytest.approx(math.sqrt(4 * 22500 / 3 / 4), rel=1e-12)
    t.cap(2)
    assert (t.count(c), t.totals[c], t.squares[c]) == (2, 500, 170000)
    assert t.mean(c) == 250.0 and t.spread(c) == 150.0


def test_spread_of_sums_that_no_steps_give_is_zero_not_an_error() -> None:
    """Integer floors (a cap) can leave n x squares a hair below total^2; the spread is then 0."""
    t = StepTable()
    c = cell_index("decode", 4, "tbo")
    t.add_cells([(c, 2, 3, 4)])  # 2 x 4 - 3^2 = -1
    assert t.spread(c) == 0.0


@pytest.mark.parametrize("seed", range(4))
def test_spread_matches_the_statistics_module(seed: int) -> None:
    rng = random.Random(seed)
    t = StepTable()
    c = rng.randrange(NUM_CELLS)
    values = [rng.uniform(10.0, 1e6) for _ in range(rng.randint(2, 300))]
    for v in values:
        t.add(c, v)
    rounded = [int(v + 0.5) for v in values]
    want = statistics.stdev(rounded) / math.sqrt(len(rounded))
    assert t.spread(c) == pytest.approx(want, rel=1e-9), f"{seed=} {len(values)=}"
