"""Tests for planning/two_batch.py: the TBO split of decode, verify, extend and idle batches."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_overlap.planning.two_batch import (
    ChildPlan,
    ForwardKind,
    TwoBatchPlan,
    plan_two_batch,
    split_overlaps,
)

D, V, E, IDLE = ForwardKind.DECODE, ForwardKind.TARGET_VERIFY, ForwardKind.EXTEND, ForwardKind.IDLE


def ranges(plan: TwoBatchPlan) -> list[tuple[int, int, int, int, int]]:
    return [(c.seq_start, c.seq_end, c.token_start, c.token_end, c.padded_len)
            for c in plan.children]


# (bs, tokens_per_seq, attn_tp_size) -> [(seq_start, seq_end, tok_start, tok_end, padded)] x 2
DECODE_TABLE = [
    (0, 1, 1, [(0, 0, 0, 0, 0), (0, 0, 0, 0, 0)]),
    (1, 1, 1, [(0, 0, 0, 0, 0), (0, 1, 0, 1, 1)]),  # bs 1: child A is empty, not a crash
    (1, 1, 4, [(0, 0, 0, 0, 0), (0, 1, 0, 1, 4)]),
    (2, 1, 1, [(0, 1, 0, 1, 1), (1, 2, 1, 2, 1)]),
    (7, 1, 1, [(0, 3, 0, 3, 3), (3, 7, 3, 7, 4)]),
    (7, 1, 4, [(0, 3, 0, 3, 4), (3, 7, 3, 7, 4)]),
    (256, 1, 1, [(0, 128, 0, 128, 128), (128, 256, 128, 256, 128)]),
    (256, 1, 3, [(0, 128, 0, 128, 129), (128, 256, 128, 256, 129)]),
]


@pytest.mark.parametrize(("bs", "tps", "tp", "expected"), DECODE_TABLE)
def test_decode_table(bs: int, tps: int, tp: int, expected: list[Any]) -> None:
    plan = plan_two_batch(D, bs * tps, tokens_per_seq=tps, attn_tp_size=tp)
    assert (plan.kind, plan.split_seq_index, plan.two_chunk) == (D, bs // 2, False)
    assert ranges(plan) == expected, f"{bs=} {tps=} {tp=} {plan=}"
    assert all(c.extend_lens == () and c.seq_lens == () for c in plan.children)


def test_target_verify_splits_whole_sequences_of_draft_tokens() -> None:
    plan = plan_two_batch(V, 7 * 4, tokens_per_seq=4, seq_lens=[10, 11, 12, 13, 14, 15, 16])
    assert (plan.split_seq_index, plan.split_token_index) == (3, 12)
    assert ranges(plan) == [(0, 3, 0, 12, 12), (3, 7, 12, 28, 16)]
    a, b = plan.children
    assert (a.seq_lens, b.seq_lens) == ((10, 11, 12), (13, 14, 15, 16))
    assert a.extend_lens == b.extend_lens == () and a.extend_prefix_lens == ()


def test_idle_gives_two_empty_children() -> None:
    plan = plan_two_batch(IDLE, 0, attn_tp_size=8)
    assert ranges(plan) == [(0, 0, 0, 0, 0)] * 2 and plan.split_seq_index == 0
    assert plan.kind is IDLE and all(c.pad == 0 and c.num_seqs == 0 for c in plan.children)


@pytest.mark.parametrize("tps", [1, 2, 4])
@pytest.mark.parametrize("kind", [D, V])
def test_split_overlaps_when_both_decode_children_get_tokens(kind: ForwardKind, tps: int) -> None:
    for bs in range(6):
        plan = plan_two_batch(kind, bs * tps, tokens_per_seq=tps)
        both = all(c.num_tokens > 0 for c in plan.children)
        assert split_overlaps(kind, bs * tps, tps) == both, f"{kind=} {bs=} {tps=} {plan=}"


@pytest.mark.parametrize("tokens", range(5))
def test_split_overlaps_for_one_extend_request_cut_in_two(tokens: int) -> None:
    plan = plan_two_batch(E, tokens, extend_lens=[tokens], two_chunk_threshold=0.48)
    assert split_overlaps(E, tokens) == all(c.num_tokens > 0 for c in plan.children), plan
    assert not split_overlaps(IDLE, 0) and not split_overlaps("idle", 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="tokens_per_seq"):
        split_overlaps(D, 4, 0)


def test_kind_accepts_the_string_value() -> None:
    assert plan_two_batch("decode", 4) == plan_two_batch(D, 4)  # type: ignore[arg-type]


def child(seqs: tuple[int, int], toks: tuple[int, int], ext: tuple[int, ...],
          prefix: tuple[int, ...], seq: tuple[int, ...], padded: int) -> ChildPlan:
    return ChildPlan(seqs[0], seqs[1], toks[0], toks[1], ext, prefix, seq, padded)


# (extend_lens, prefix_lens, num_tokens, threshold, tp) -> (split_seq, split_tok, two_chunk, A, B)
EXTEND_TABLE = [
    # one request, two-chunk on: 21 | 21, B continues on a prefix of 21
    (([42], None, 42, 0.48, 1),
     (0, 21, True, child((0, 1), (0, 21), (21,), (0,), (21,), 21),
      child((0, 1), (21, 42), (21,), (21,), (42,), 21))),
    # same, with a cached prefix of 8 and attention TP 4
    (([42], [8], 42, 0.48, 4),
     (0, 21, True, child((0, 1), (0, 21), (21,), (8,), (29,), 24),
      child((0, 1), (21, 42), (21,), (29,), (50,), 24))),
    # two-chunk off: the only boundary for one request is 0, child A is empty
    (([42], None, 42, 0.0, 1),
     (0, 0, False, child((0, 0), (0, 0), (), (), (), 0),
      child((0, 1), (0, 42), (42,), (0,), (42,), 42))),
    (([3000, 10], None, 3010, 0.48, 1),
     (0, 1505, True, child((0, 1), (0, 1505), (1505,), (0,), (1505,), 1505),
      child((0, 2), (1505, 3010), (1495, 10), (1505, 0), (3000, 10), 1505))),
    (([3000, 10], None, 3010, 0.0, 1),
     (1, 3000, False, child((0, 1), (0, 3000), (3000,), (0,), (3000,), 3000),
      child((1, 2), (3000, 3010), (10,), (0,), (10,), 10))),
    (([999, 42], [100, 5], 1041, 0.48, 1),
     (0, 520, True, child((0, 1), (0, 520), (520,), (100,), (620,), 520),
      child((0, 2), (520, 1041), (479, 42), (620, 5), (1099, 47), 521))),
    # the cut lands on boundary 1: planned as a plain boundary split (upstream: two-chunk, L=0)
    (([2, 3], None, 5, 0.48, 1),
     (1, 2, False, child((0, 1), (0, 2), (2,), (0,), (2,), 2),
      child((1, 2), (2, 5), (3,), (0,), (3,), 3))),
    # all-zero extend lengths: ties go to the later boundary, nothing crashes
    (([0, 0, 0], [4, 5, 6], 0, 0.48, 2),
     (2, 0, False, child((0, 2), (0, 0), (0, 0), (4, 5), (4, 5), 0),
      child((2, 3), (0, 0), (0,), (6,), (6,), 0))),
    # empty extend batch with 4 padding tokens: they go to child B
    (([], None, 4, 0.48, 4),
     (0, 0, False, child((0, 0), (0, 0), (), (), (), 0), child((0, 0), (0, 4), (), (), (), 4))),
    # padding past sum(extend_lens) also goes to child B
    (([5, 5], None, 12, 0.48, 4),
     (1, 5, False, child((0, 1), (0, 5), (5,), (0,), (5,), 8),
      child((1, 2), (5, 12), (5,), (0,), (5,), 8))),
]


@pytest.mark.parametrize(("args", "expected"), EXTEND_TABLE)
def test_extend_table(args: tuple[Any, ...], expected: tuple[Any, ...]) -> None:
    lens, prefix, num_tokens, t, tp = args
    plan = plan_two_batch(E, num_tokens, extend_lens=lens, extend_prefix_lens=prefix,
                          two_chunk_threshold=t, attn_tp_size=tp)
    got = (plan.split_seq_index, plan.split_token_index, plan.two_chunk, *plan.children)
    assert got == expected, f"{args=}\n{got=}\n{expected=}"


def test_extend_seq_lens_only_derives_prefix() -> None:
    by_prefix = plan_two_batch(E, 1041, extend_lens=[999, 42], extend_prefix_lens=[100, 5],
                               two_chunk_threshold=0.48)
    by_seq = plan_two_batch(E, 1041, extend_lens=[999, 42], seq_lens=[1099, 47],
                            two_chunk_threshold=0.48)
    assert by_prefix == by_seq


ERRORS: list[tuple[dict[str, Any], str]] = [
    (dict(kind=E, num_tokens=3), "needs extend_lens"),
    (dict(kind=E, num_tokens=3, extend_lens=[2, 2]), "less than sum"),
    (dict(kind=E, num_tokens=4, extend_lens=[2, -1, 3]), "non-negative"),
    (dict(kind=E, num_tokens=4, extend_lens=[2, 2], extend_prefix_lens=[1]), "1 entries"),
    (dict(kind=E, num_tokens=4, extend_lens=[2, 2], seq_lens=[1, 9]), ">= extend_lens"),
    (dict(kind=E, num_tokens=4, extend_lens=[2, 2], extend_prefix_lens=[0, 0],
          seq_lens=[2, 3]), "must equal"),
    (dict(kind=E, num_tokens=4, extend_lens=[4], two_chunk_threshold=0.6),
     "--tbo-token-distribution-threshold"),
    (dict(kind=D, num_tokens=4, extend_lens=[1, 1, 1, 1]), "extend batches only"),
    (dict(kind=V, num_tokens=7, tokens_per_seq=2), "multiple of tokens_per_seq"),
    (dict(kind=V, num_tokens=8, tokens_per_seq=0), "tokens_per_seq must be >= 1"),
    (dict(kind=D, num_tokens=4, seq_lens=[1, 2, 3]), "3 entries, expected 4"),
    (dict(kind=IDLE, num_tokens=2), "idle batch"),
    (dict(kind=IDLE, num_tokens=0, seq_lens=[3]), "idle batch"),
    (dict(kind=D, num_tokens=-1), "num_tokens must be >= 0"),
    (dict(kind=D, num_tokens=4, attn_tp_size=0), "attn_tp_size"),
    (dict(kind="prefill", num_tokens=4), "prefill"),
]


@pytest.mark.parametrize(("kwargs", "match"), ERRORS)
def test_inconsistent_inputs_raise_naming_the_value(kwargs: dict[str, Any], match: str) -> None:
    kwargs = dict(kwargs)
    kind, num_tokens = kwargs.pop("kind"), kwargs.pop("num_tokens")
    with pytest.raises(ValueError, match=match):
        plan_two_batch(kind, num_tokens, **kwargs)


# ---- properties against a token-by-token reference ----------------------------------------


def check_child_against_tokens(plan: TwoBatchPlan, idx: int, lens: list[int],
                               prefix: list[int], num_tokens: int) -> None:
    """Rebuild child `idx`'s per-sequence fields from who owns each of its tokens."""
    owners = [i for i, n in enumerate(lens) for _ in range(n)]
    owners += [-1] * (num_tokens - len(owners))  # padding rows
    c = plan.children[idx]
    mine = owners[c.token_start:c.token_end]
    per_seq, before = Counter(o for o in mine if o >= 0), Counter(owners[:c.token_start])
    assert all(c.seq_start <= o < c.seq_end for o in per_seq), f"{idx=} {lens=} {plan=}"
    seqs = range(c.seq_start, c.seq_end)
    assert c.extend_lens == tuple(per_seq[i] for i in seqs), f"{idx=} {lens=} {plan=}"
    assert c.extend_prefix_lens == tuple(prefix[i] + before[i] for i in seqs)
    assert c.seq_lens == tuple(p + e for p, e in zip(c.extend_prefix_lens, c.extend_lens,
                                                     strict=True))
    if idx == 0:
        assert -1 not in mine, "padding rows belong to child B"


extend_batch = st.tuples(
    st.one_of(st.lists(st.integers(0, 4), max_size=12),  # tiny: guard and zero lengths
              st.lists(st.integers(1, 600), max_size=24)),
    st.integers(0, 2**32 - 1),  # seed for the cached prefix lengths (cheaper than a 2nd list)
    st.integers(0, 9),  # padding rows
    st.one_of(st.sampled_from([0.0, 0.48, 0.5]), st.floats(0.0, 0.5)),
    st.sampled_from([1, 1, 2, 4, 8]),
)


@settings(max_examples=4000, deadline=None)
@given(batch=extend_batch)
def test_extend_properties(batch: tuple[list[int], int, int, float, int]) -> None:
    lens, seed, padding, t, tp = batch
    rng = random.Random(seed)
    prefix = [rng.choice((0, rng.randint(1, 5000))) for _ in lens]
    total = sum(lens)
    num_tokens = total + padding
    plan = plan_two_batch(E, num_tokens, extend_lens=lens, extend_prefix_lens=prefix,
                          two_chunk_threshold=t, attn_tp_size=tp)
    a, b = plan.children
    ctx = f"{lens=} {prefix=} {padding=} {t=} {tp=} {plan=}"
    # token conservation: A then B tile [0, num_tokens)
    assert (a.token_start, a.token_end, b.token_start, b.token_end) == (
        0, plan.split_token_index, plan.split_token_index, num_tokens), ctx
    assert sum(a.extend_lens) + sum(b.extend_lens) == total, ctx
    assert sum(a.extend_lens) == a.num_tokens, ctx
    # sequence conservation: A then B tile [0, n), sharing one request when two-chunk
    shared = 1 if plan.two_chunk else 0
    assert (a.seq_start, b.seq_end, a.seq_end - b.seq_start) == (0, len(lens), shared), ctx
    for idx in (0, 1):
        check_child_against_tokens(plan, idx, lens, prefix, num_tokens)
        c = plan.children[idx]
        assert c.padded_len % tp == 0 and 0 <= c.pad < tp, ctx
    a_tok, b_tok = a.num_tokens, b.num_tokens - padding
    if plan.two_chunk:
        # prefix continuity across the cut, and B sees the request's full length
        s = plan.split_seq_index
        assert b.extend_prefix_lens[0] == a.extend_prefix_lens[-1] + a.extend_lens[-1], ctx
        assert b.seq_lens[0] == prefix[s] + lens[s] and a.seq_lens[-1] < b.seq_lens[0], ctx
        assert abs(a_tok - b_tok) <= 1 and a.num_seqs <= a.num_tokens, ctx
        assert a.extend_lens[-1] >= 1 and b.extend_lens[0] >= 1, ctx
    else:
        for i in range(1, len(lens)):  # never worse than any other boundary
            left = sum(lens[:i])
            assert abs(a_tok - b_tok) <= abs(left - (total - left)), f"{i=} {ctx}"
    again = plan_two_batch(E, num_tokens, extend_lens=tuple(lens),
                           seq_lens=[p + e for p, e in zip(prefix, lens, strict=True)],
                           two_chunk_threshold=t, attn_tp_size=tp)
    assert again == plan, ctx  # deterministic; seq_lens and prefix describe the same batch


@settings(max_examples=1500, deadline=None)
@given(bs=st.integers(0, 2048), tps=st.integers(1, 8), tp=st.integers(1, 16),
       kind=st.sampled_from([D, V]), with_seq_lens=st.booleans())
def test_decode_properties(bs: int, tps: int, tp: int, kind: ForwardKind,
                           with_seq_lens: bool) -> None:
    seq_lens = [1000 + 7 * i for i in range(bs)] if with_seq_lens else None
    plan = plan_two_batch(kind, bs * tps, tokens_per_seq=tps, attn_tp_size=tp, seq_lens=seq_lens)
    a, b = plan.children
    ctx = f"{bs=} {tps=} {tp=} {kind=} {plan.split_seq_index=}"
    assert plan.split_seq_index == bs // 2 and plan.split_token_index == (bs // 2) * tps, ctx
    assert (a.seq_start, a.seq_end, b.seq_start, b.seq_end) == (0, bs // 2, bs // 2, bs), ctx
    assert (a.token_start, b.token_end) == (0, bs * tps) and a.token_end == b.token_start, ctx
    assert 0 <= b.num_seqs - a.num_seqs <= 1, ctx
    for c in plan.children:
        assert c.num_tokens == c.num_seqs * tps and c.padded_len % tp == 0 and 0 <= c.pad < tp
        assert c.extend_lens == () and c.extend_prefix_lens == ()
    if seq_lens is None:
        assert a.seq_lens == b.seq_lens == ()
    else:
        assert list(a.seq_lens + b.seq_lens) == seq_lens, ctx
    assert plan_two_batch(kind, bs * tps, tokens_per_seq=tps, attn_tp_size=tp,
                          seq_lens=seq_lens) == plan
