"""Tests for planning/two_chunk.py: the balanced boundary, the two-chunk trigger and cut."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_overlap.planning.two_chunk import (
    ExtendSplit,
    balanced_split_index,
    check_threshold,
    cum_half_index,
    plan_extend_split,
    plan_two_chunk_cut,
    wants_two_chunk,
)

# Upstream's unit-test values (test/manual/test_two_batch_overlap.py, t = 0.48), re-derived by
# hand: (extend_lens, split_seq_index, split_token_index, two_chunk).
UPSTREAM_TABLE = [
    ([42], 0, 21, True),  # one request: left = 0 < 0.48 * 42, cut at 21
    ([42, 999], 1, 520, True),  # boundary 1 leaves 42 / 1041 on the left; cut at 1041 // 2
    ([999, 42], 0, 520, True),
    ([498, 502], 1, 498, False),  # 498 / 1000 is inside [0.48, 0.52]
    ([4096] * 4, 2, 8192, False),
    ([4095, 4096, 4096, 4096, 1], 2, 8191, False),
    ([1, 4095, 4096, 4096, 4096], 3, 8192, False),
    ([4097, 4096, 4096, 4095, 1], 2, 8193, False),
    ([1, 1, 1, 1, 99999], 4, 50001, True),
    ([99999, 1, 1, 1, 1], 0, 50001, True),
    ([], 0, 0, False),
    ([1], 0, 0, False),  # guard: child A would hold 1 sequence and 0 tokens
]

# Cases worked by hand for this plugin: (extend_lens, threshold, seq, token, two_chunk, left_len).
HAND_TABLE = [
    ([3000, 10], 0.48, 0, 1505, True, 1505),  # 3000 / 3010 > 0.52; A: 1505 of req 0
    ([3000, 10], 0.0, 1, 3000, False, 0),  # threshold 0 disables two-chunk
    ([999, 42], 0.48, 0, 520, True, 520),  # B: 479 of req 0 on a prefix of 520, then req 1
    ([42], 0.48, 0, 21, True, 21),
    ([42], 0.0, 0, 0, False, 0),
    ([2, 3], 0.48, 1, 2, False, 0),  # 2 / 5 < 0.48 but the cut falls on boundary 1
    ([1, 2], 0.48, 1, 1, False, 0),  # guard: s = 1, A would have 2 seqs for 1 token
    ([0, 0, 0], 0.48, 2, 0, False, 0),  # all-zero: ties go to the later boundary
    ([10, 0, 0, 10], 0.48, 3, 10, False, 0),
    ([5, 5], 0.5, 1, 5, False, 0),  # exactly half is inside [0.5, 0.5]
]


@pytest.mark.parametrize(("lens", "seq", "tok", "two_chunk"), UPSTREAM_TABLE)
def test_upstream_table(lens: list[int], seq: int, tok: int, two_chunk: bool) -> None:
    split = plan_extend_split(lens, 0.48)
    assert (split.seq_index, split.token_index, split.two_chunk) == (seq, tok, two_chunk), (
        f"{lens=} {split=}"
    )


def test_single_three_token_request() -> None:
    # [3]: half = 1, s = 0, guard 0 + 1 > 1 is false, so a two-chunk cut 1 | 2 is made.
    assert plan_extend_split([3], 0.48) == ExtendSplit(0, 1, True, 1)


@pytest.mark.parametrize(("lens", "t", "seq", "tok", "two_chunk", "left"),
                         HAND_TABLE)
def test_hand_table(lens: list[int], t: float, seq: int, tok: int, two_chunk: bool,
                    left: int) -> None:
    assert plan_extend_split(lens, t) == ExtendSplit(seq, tok, two_chunk, left), f"{lens=} {t=}"


def test_cut_on_boundary_is_reported_by_the_cut_but_planned_as_boundary() -> None:
    cut = plan_two_chunk_cut([2, 3], 0.48)
    assert cut is not None and (cut.seq_index, cut.token_index, cut.left_len) == (1, 2, 0)
    assert plan_extend_split([2, 3], 0.48) == ExtendSplit(1, 2, False, 0)


@pytest.mark.parametrize("bad", [-0.01, 0.51, 1.0, math.nan, math.inf])
def test_threshold_out_of_range_names_the_flag(bad: float) -> None:
    with pytest.raises(ValueError, match="--tbo-token-distribution-threshold"):
        check_threshold(bad)
    with pytest.raises(ValueError, match="--tbo-token-distribution-threshold"):
        plan_extend_split([42], bad)


@pytest.mark.parametrize("good", [0, 0.0, 0.25, 0.48, 0.5])
def test_threshold_in_range(good: float) -> None:
    assert check_threshold(good) is None
    # one request cannot be split on a boundary: two-chunk cuts it, unless the threshold is 0
    split = plan_extend_split([42], good)
    assert split.two_chunk == (good > 0), f"{good=} {split=}"


# ---- brute-force references ---------------------------------------------------------------


def ref_balanced(lens: list[int]) -> int:
    """The latest boundary in 1..n-1 with the least |left - right|; 0 below two sequences."""
    if len(lens) < 2:
        return 0
    total = sum(lens)
    diffs = {i: abs(sum(lens[:i]) - (total - sum(lens[:i]))) for i in range(1, len(lens))}
    best = min(diffs.values())
    return max(i for i, d in diffs.items() if d == best)


def ref_cum_half(lens: list[int]) -> int:
    half = sum(lens) // 2
    over = [i for i in range(len(lens)) if sum(lens[: i + 1]) > half]
    return over[0] if over else 0


def ref_split(lens: list[int], t: float) -> ExtendSplit:
    """Token-by-token reference: who owns each token, and where the cut lands."""
    total = sum(lens)
    v = ref_balanced(lens)
    left = sum(lens[:v])
    if t > 0 and (left < total * t or left > total * (1 - t)):
        half = total // 2
        # walk the requests to the one owning token `half`, the first token of child B
        s, start = 0, 0
        while half >= start + lens[s]:
            start += lens[s]
            s += 1
        if s + 1 <= half:
            left_len = half - start
            return ExtendSplit(s, half, left_len > 0, left_len)
    return ExtendSplit(v, left, False, 0)


lens_strategy = st.one_of(
    st.lists(st.integers(0, 3), max_size=12),  # tiny batches: guard and zero lengths
    st.lists(st.integers(1, 5000), max_size=48),
    st.lists(st.integers(0, 200_000), min_size=1, max_size=8),
)
threshold_strategy = st.one_of(st.sampled_from([0.0, 0.48, 0.5, 0.3]), st.floats(0.0, 0.5))


@settings(max_examples=2500, deadline=None)
@given(lens=lens_strategy, t=threshold_strategy)
def test_split_matches_brute_force(lens: list[int], t: float) -> None:
    assert balanced_split_index(lens) == ref_balanced(lens), f"{lens=}"
    assert cum_half_index(lens) == ref_cum_half(lens), f"{lens=}"
    split = plan_extend_split(lens, t)
    assert split == ref_split(lens, t), f"{lens=} {t=} {split=}"
    assert plan_extend_split(tuple(lens), t) == split  # deterministic, input type irrelevant


@settings(max_examples=1500, deadline=None)
@given(lens=lens_strategy, t=threshold_strategy)
def test_split_balance_and_guard(lens: list[int], t: float) -> None:
    split = plan_extend_split(lens, t)
    total = sum(lens)
    a_tokens = split.token_index
    b_tokens = total - a_tokens
    if split.two_chunk:
        assert abs(a_tokens - b_tokens) <= 1, f"{lens=} {t=} {split=}"
        assert split.seq_index + 1 <= a_tokens, f"guard: {lens=} {split=}"
        assert 0 < split.left_len < lens[split.seq_index], f"{lens=} {split=}"
        assert wants_two_chunk(lens, t)
        return
    assert a_tokens == sum(lens[: split.seq_index])
    # never worse than any other sequence boundary (1..n-1; 0 and n are never better)
    for i in range(1, len(lens)):
        other = sum(lens[:i])
        assert abs(a_tokens - b_tokens) <= abs(other - (total - other)), f"{lens=} {i=} {split=}"


@pytest.mark.parametrize(("lens", "threshold", "want"), [
    ([25, 75], 0.25, False),  # child A holds exactly t of the tokens: upstream's `<` keeps it
    ([24, 76], 0.25, True),
    ([75, 25], 0.25, False),  # exactly 1 - t: upstream's `>` keeps it too
    ([76, 24], 0.25, True),
])
def test_the_threshold_bounds_are_exclusive_as_upstream(lens: list[int], threshold: float,
                                                        want: bool) -> None:
    assert wants_two_chunk(lens, threshold) is want, f"{lens=} {threshold=}"
    assert (plan_two_chunk_cut(lens, threshold) is not None) is want, f"{lens=}"
