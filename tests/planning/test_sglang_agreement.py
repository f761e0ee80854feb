"""Agreement of planning/two_batch.py + two_chunk.py with SGLang 0.5.23's own split functions.

The only planning test that imports sglang. One deliberate difference, tested explicitly: when
upstream's two-chunk cut lands exactly on a sequence boundary (child A would compute zero tokens
of the cut request), we plan the boundary split at the same (sequence, token) indices with
two_chunk=False; upstream keeps a zero-token copy of the request in child A.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_overlap.planning.two_batch import ForwardKind, plan_two_batch
from tests.conftest import require_module

tbo = require_module(
    "sglang.srt.batch_overlap.two_batch_overlap",
    reason="sglang 0.5.23 is not importable here; the agreement test needs its split functions",
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode  # noqa: E402
from sglang.srt.runtime_context import get_flags  # noqa: E402


@pytest.fixture(autouse=True)
def _upstream_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compare against SGLang's own functions even when the plugin's hooks replaced them in this
    process (any test that loads plugins does): upstream's functions call each other through
    module globals, so every replaced one is put back for the duration of a test."""
    for name in ("compute_split_seq_index", "compute_split_token_index",
                 "_is_two_chunk_split_enabled"):
        fn = getattr(tbo, name)
        if hasattr(fn, "__wrapped__"):
            monkeypatch.setattr(tbo, name, inspect.unwrap(fn))
        assert getattr(tbo, name).__module__ == tbo.__name__, name


@pytest.fixture(autouse=True)
def _restore_threshold() -> Iterator[None]:
    moe = get_flags().moe
    saved = moe.tbo_token_distribution_threshold
    yield
    moe.tbo_token_distribution_threshold = saved


def upstream_extend(lens: list[int], t: float) -> tuple[int, int, bool]:
    """SGLang's split of an extend batch, with the threshold set where SGLang reads it."""
    get_flags().moe.tbo_token_distribution_threshold = t
    assert tbo.get_tbo_token_distribution_threshold() == t
    seq = tbo.compute_split_seq_index(ForwardMode.EXTEND, sum(lens), lens, None)
    tok = tbo.compute_split_token_index(seq, ForwardMode.EXTEND, lens, None)
    return seq, tok, bool(tbo._is_two_chunk_split_enabled(lens))


def check_extend(lens: list[int], t: float, padding: int) -> None:
    plan = plan_two_batch(ForwardKind.EXTEND, sum(lens) + padding, extend_lens=lens,
                          two_chunk_threshold=t)
    seq, tok, two_chunk = upstream_extend(lens, t)
    ctx = f"{lens=} {t=} {padding=} upstream={(seq, tok, two_chunk)} {plan=}"
    assert (plan.split_seq_index, plan.split_token_index) == (seq, tok), ctx
    on_boundary = two_chunk and tok == sum(lens[:seq])  # the deliberate difference
    assert plan.two_chunk == (two_chunk and not on_boundary), ctx
    # upstream's child token counts (non-padded) against ours
    n = sum(lens) + padding
    a, b = tbo.TboForwardBatchPreparer._split_num_token_non_padded(
        tbo_split_token_index=tok, num_token_non_padded=n)
    assert (plan.children[0].num_tokens, plan.children[1].num_tokens) == (a, b), ctx
    # upstream's child sequence ranges: A = [0, seq (+1 if two-chunk)), B = [seq, bs)
    a_end = seq + 1 if two_chunk else seq
    if not on_boundary:
        assert (plan.children[0].seq_end, plan.children[1].seq_start) == (a_end, seq), ctx


UPSTREAM_CASES = [
    [42], [42, 999], [999, 42], [498, 502], [4096] * 4, [4095, 4096, 4096, 4096, 1],
    [1, 4095, 4096, 4096, 4096], [4097, 4096, 4096, 4095, 1], [1, 1, 1, 1, 99999],
    [99999, 1, 1, 1, 1], [], [1], [3000, 10], [0, 0, 0], [3],
]


@pytest.mark.parametrize("lens", UPSTREAM_CASES)
@pytest.mark.parametrize("t", [0.0, 0.48, 0.5])
def test_hand_cases_agree(lens: list[int], t: float) -> None:
    check_extend(lens, t, padding=0)


def test_the_deliberate_difference() -> None:
    # [2, 3] at 0.48: balanced boundary 1 leaves 2/5 = 0.4 < 0.48 on the left, half = 2 = the
    # boundary; upstream's child A would be seqs [0, 2) with extend lens [2, 0].
    assert upstream_extend([2, 3], 0.48) == (1, 2, True)
    plan = plan_two_batch(ForwardKind.EXTEND, 5, extend_lens=[2, 3], two_chunk_threshold=0.48)
    assert (plan.split_seq_index, plan.split_token_index, plan.two_chunk) == (1, 2, False)
    assert [c.extend_lens for c in plan.children] == [(2,), (3,)]
    check_extend([2, 3], 0.48, padding=0)


lens_strategy = st.one_of(
    st.lists(st.integers(0, 4), max_size=10),
    st.lists(st.integers(1, 8192), max_size=64),
    st.lists(st.integers(0, 100_000), min_size=1, max_size=6),
)


@settings(max_examples=1500, deadline=None)
@given(lens=lens_strategy, padding=st.integers(0, 3),
       t=st.one_of(st.sampled_from([0.0, 0.48, 0.5]), st.floats(0.0, 0.5)))
def test_random_extend_batches_agree(lens: list[int], t: float, padding: int) -> None:
    check_extend(lens, t, padding)


@settings(max_examples=500, deadline=None)
@given(bs=st.integers(0, 4096), tps=st.integers(1, 8), verify=st.booleans())
def test_decode_and_verify_agree(bs: int, tps: int, verify: bool) -> None:
    mode, kind = ((ForwardMode.TARGET_VERIFY, ForwardKind.TARGET_VERIFY) if verify
                  else (ForwardMode.DECODE, ForwardKind.DECODE))
    tps = tps if verify else 1
    seq = tbo.compute_split_seq_index(mode, bs * tps, None, tps)
    tok = tbo.compute_split_token_index(seq, mode, None, tps)
    plan = plan_two_batch(kind, bs * tps, tokens_per_seq=tps)
    assert (plan.split_seq_index, plan.split_token_index) == (seq, tok), f"{bs=} {tps=} {mode=}"


def test_idle_agrees() -> None:
    seq = tbo.compute_split_seq_index(ForwardMode.IDLE, 0, None, 0)
    tok = tbo.compute_split_token_index(seq, ForwardMode.IDLE, None, 0)
    plan = plan_two_batch(ForwardKind.IDLE, 0)
    assert (plan.split_seq_index, plan.split_token_index) == (seq, tok) == (0, 0)
    assert tbo.TboForwardBatchPreparer._split_num_token_non_padded(
        tbo_split_token_index=0, num_token_non_padded=0) == (0, 0)


def test_threshold_over_half_is_refused_by_both() -> None:
    with pytest.raises(AssertionError):
        upstream_extend([42], 0.6)
    kwargs: dict[str, Any] = dict(extend_lens=[42], two_chunk_threshold=0.6)
    with pytest.raises(ValueError, match="--tbo-token-distribution-threshold"):
        plan_two_batch(ForwardKind.EXTEND, 42, **kwargs)
