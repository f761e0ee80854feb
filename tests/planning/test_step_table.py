"""Tests for planning/step_table.py: the bucket grid, the all-reducible vector, recency."""

from __future__ import annotations

import random

import pytest

from sglang_overlap.planning.step_table import (
    MODES,
    NUM_BUCKETS,
    NUM_CELLS,
    PHASES,
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


def test_vector_sum_is_rank_order_independent() -> None:
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
            merged.add_vector(tables[i].to_vector())
        sums.append(merged.to_vector())
    assert sums[0] == sums[1]
    direct = [sum(col) for col in zip(*(t.to_vector() for t in tables), strict=True)]
    assert sums[0] == direct


def test_mean_count_cap_and_clear() -> None:
    t = StepTable()
    c = cell_index("prefill", 10, "two_chunk")
    assert t.mean(c) is None and t.empty()
    for us in (100.4, 200.6, 300.0):
        t.add(c, us)
    assert (t.count(c), t.mean(c)) == (3, (100 + 201 + 300) / 3)
    t.cap(2)
    assert (t.count(c), t.totals[c]) == (2, 601 * 2 // 3)
    with pytest.raises(ValueError, match="max_count"):
        t.cap(0)
    with pytest.raises(ValueError, match="entries"):
        t.add_vector([1, 2, 3])
    t.clear()
    assert t.empty()


def test_rows_and_format() -> None:
    t = StepTable()
    t.add(cell_index("decode", measure_bucket(16), "none"), 2500.0)
    t.add(cell_index("decode", measure_bucket(17), "tbo"), 3000.0)
    t.add(cell_index("decode", measure_bucket(17), "tbo"), 3100.0)
    rows = t.rows()
    assert [(r.phase, r.tokens_lo, r.tokens_hi, r.mode, r.count) for r in rows] == [
        ("decode", 16, 19, "none", 1), ("decode", 16, 19, "tbo", 2)]
    assert format_rows(rows) == "decode tokens 16-19: none=2.500ms x1, tbo=3.050ms x2"


def test_add_vector_caps_only_what_it_touches() -> None:
    t = StepTable()
    a, b = cell_index("decode", 5, "none"), cell_index("decode", 6, "tbo")
    for _ in range(10):
        t.add(a, 100.0)
    delta = StepTable()
    for _ in range(5):
        delta.add(b, 200.0)
    t.add_vector(delta.to_vector(), max_count=4)
    assert (t.count(a), t.count(b), t.mean(b)) == (10, 4, 200.0), "a untouched, b capped"
    delta.clear()
    delta.add(a, 1100.0)
    t.add_vector(delta.to_vector(), max_count=4)
    assert (t.count(a), t.totals[a]) == (4, (1000 + 1100) * 4 // 11)


@pytest.mark.parametrize("seed", range(4))
def test_take_and_add_cells_equal_the_vector_round_trip(seed: int) -> None:
    """The sparse form (`take` on one table, `add_cells` on another) gives the tables the dense
    one (`to_vector` + `clear`, `add_vector`) gives, caps included."""
    rng = random.Random(seed)
    dense, sparse = StepTable(), StepTable()
    for _ in range(30):
        new = StepTable()
        cells = rng.sample(range(NUM_CELLS), rng.randint(0, 6))
        for cell in cells:
            for _ in range(rng.randint(1, 5)):
                new.add(cell, rng.uniform(10.0, 5000.0))
        cap = rng.choice([None, 3, 8])
        vector = new.to_vector()
        triples = new.take(cells + rng.sample(range(NUM_CELLS), 3))  # untouched ones: skipped
        assert new.empty() and [c for c, _, _ in triples] == cells
        dense.add_vector(vector, cap)
        sparse.add_cells(triples, cap)
        assert (dense.counts, dense.totals) == (sparse.counts, sparse.totals), f"{seed=} {cap=}"


def test_add_cells_refuses_a_bad_triple() -> None:
    t = StepTable()
    with pytest.raises(ValueError, match="0 <= cell < 768"):
        t.add_cells([(NUM_CELLS, 1, 10)])
    with pytest.raises(ValueError, match="count >= 0"):
        t.add_cells([(0, -1, 10)])
    assert t.empty()
