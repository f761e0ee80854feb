"""Two-batch overlap (TBO): how one forward batch is split into two micro-batches ("children").

Decode and target-verify split at half the sequences (each sequence carrying `tokens_per_seq`
tokens: 1 for decode, the draft-token count for verify). Extend (prefill) splits at the sequence
boundary that best balances the token counts, or cuts one request in two (`two_chunk.py`). Idle
batches (a data-parallel rank with nothing to do) still get two empty children, so that every
rank issues the same collectives.

Tokens beyond the planned sequences (e.g. padding past sum(extend_lens)) go to child B, as in
the supported SGLang's `TboForwardBatchPreparer.prepare_raw`. Each child's `padded_len` rounds its
token count up to a multiple of the attention-TP size (0 stays 0), as upstream's `tbo_padded_len`.

Plain Python on ints; no torch, no sglang.
"""

from __future__ import annotations

import functools
from array import array
from collections.abc import Sequence
from enum import StrEnum
from operator import add, sub
from typing import NamedTuple

from sglang_overlap.planning.two_chunk import check_threshold, plan_extend_split, prefix_sums


class ForwardKind(StrEnum):
    """The forward modes TBO plans for (SGLang's ForwardMode, reduced to what matters here)."""

    EXTEND = "extend"
    DECODE = "decode"
    TARGET_VERIFY = "target_verify"
    IDLE = "idle"


class ChildPlan(NamedTuple):
    """One micro-batch: ranges into the parent batch and the per-sequence lengths it sees.

    A NamedTuple (immutable, compared by value) rather than a frozen dataclass: it is built
    twice per planned step, and a tuple is built several times faster."""

    seq_start: int  # [seq_start, seq_end) into the parent's sequences
    seq_end: int
    token_start: int  # [token_start, token_end) into the parent's tokens
    token_end: int
    extend_lens: tuple[int, ...]  # per child sequence (extend only; () otherwise)
    extend_prefix_lens: tuple[int, ...]  # per child sequence (extend only; () otherwise)
    seq_lens: tuple[int, ...]  # per child sequence, prefix + extend (or given seq_lens)
    padded_len: int  # num_tokens rounded up to a multiple of attn_tp_size

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start

    @property
    def num_seqs(self) -> int:
        return self.seq_end - self.seq_start

    @property
    def pad(self) -> int:
        """Rows of padding after this child's tokens (padded_len - num_tokens)."""
        return self.padded_len - self.num_tokens


class TwoBatchPlan(NamedTuple):
    """The split of one batch into children A (`children[0]`) and B (`children[1]`)."""

    kind: ForwardKind
    split_seq_index: int  # upstream's tbo_split_seq_index (two-chunk: the request in both)
    split_token_index: int  # child A = tokens [0, split_token_index)
    two_chunk: bool
    children: tuple[ChildPlan, ChildPlan]


def _padded(num_tokens: int, attn_tp_size: int) -> int:
    return -(-num_tokens // attn_tp_size) * attn_tp_size


def _check_lens(name: str, lens: Sequence[int], expected_len: int | None) -> tuple[int, ...]:
    values = lens if type(lens) is tuple else tuple(lens)
    if expected_len is not None and len(values) != expected_len:
        raise ValueError(f"{name} has {len(values)} entries, expected {expected_len}")
    try:  # an unsigned array refuses negatives in one C loop: half the time of min() at bs 256
        array("Q", values)
    except OverflowError:
        raise ValueError(f"{name} must be non-negative; got {name}={list(values)}") from None
    except TypeError:
        raise ValueError(f"{name} must be integers; got {name}={list(values)}") from None
    return values


def plan_two_batch(
    kind: ForwardKind,
    num_tokens: int,
    *,
    extend_lens: Sequence[int] | None = None,
    extend_prefix_lens: Sequence[int] | None = None,
    seq_lens: Sequence[int] | None = None,
    tokens_per_seq: int = 1,
    two_chunk_threshold: float = 0.0,
    attn_tp_size: int = 1,
) -> TwoBatchPlan:
    """Split a batch of `num_tokens` tokens into two children.

    extend: `extend_lens` is required; `extend_prefix_lens` defaults to zeros (or to
    seq_lens - extend_lens when `seq_lens` is given); `two_chunk_threshold` is
    --tbo-token-distribution-threshold (0 disables two-chunk). decode / target_verify: the batch
    has num_tokens // tokens_per_seq sequences; `seq_lens` is optional and only sliced (children
    get () without it, which keeps decode planning O(1)). idle: num_tokens must be 0.
    Raises ValueError naming the offending value for inconsistent inputs.
    """
    if type(kind) is not ForwardKind:
        kind = ForwardKind(kind)
    if num_tokens < 0:
        raise ValueError(f"num_tokens must be >= 0; got {num_tokens=}")
    if attn_tp_size < 1:
        raise ValueError(f"attn_tp_size must be >= 1; got {attn_tp_size=}")
    check_threshold(two_chunk_threshold)
    if kind is ForwardKind.EXTEND:
        if extend_lens is None:
            raise ValueError("an extend batch needs extend_lens (one entry per sequence)")
        return _plan_extend(num_tokens, extend_lens, extend_prefix_lens, seq_lens,
                            two_chunk_threshold, attn_tp_size)
    if extend_lens is not None or extend_prefix_lens is not None:
        raise ValueError(f"extend_lens / extend_prefix_lens apply to extend batches only; "
                         f"got them for kind={kind.value}")
    if kind is ForwardKind.IDLE:
        if num_tokens != 0 or (seq_lens is not None and len(seq_lens) != 0):
            raise ValueError(f"an idle batch has no tokens or sequences; got {num_tokens=}, "
                             f"seq_lens={None if seq_lens is None else list(seq_lens)}")
        return _plan_uniform(kind, 0, 1, attn_tp_size)
    if tokens_per_seq < 1:
        raise ValueError(f"tokens_per_seq must be >= 1 for {kind.value}; got {tokens_per_seq=}")
    num_seqs, rest = divmod(num_tokens, tokens_per_seq)
    if rest:
        raise ValueError(f"{kind.value}: num_tokens must be a multiple of tokens_per_seq; "
                         f"got {num_tokens=}, {tokens_per_seq=}")
    plan = _plan_uniform(kind, num_seqs, tokens_per_seq, attn_tp_size)
    if seq_lens is None:
        return plan
    lens = _check_lens("seq_lens", seq_lens, num_seqs)
    a, b = plan.children
    split = plan.split_seq_index
    return TwoBatchPlan(kind, split, plan.split_token_index, False, (
        ChildPlan(0, split, 0, a.token_end, (), (), lens[:split], a.padded_len),
        ChildPlan(split, b.seq_end, b.token_start, b.token_end, (), (), lens[split:],
                  b.padded_len)))


@functools.lru_cache(maxsize=8192)
def _plan_uniform(
    kind: ForwardKind, num_seqs: int, tokens_per_seq: int, attn_tp_size: int
) -> TwoBatchPlan:
    """Decode / target-verify / idle: every sequence has tokens_per_seq tokens. Plans are
    immutable values, so repeated batch sizes (every decode step) reuse one object."""
    split_seq = num_seqs // 2
    split_tok = split_seq * tokens_per_seq
    total = num_seqs * tokens_per_seq
    a = ChildPlan(0, split_seq, 0, split_tok, (), (), (), _padded(split_tok, attn_tp_size))
    b = ChildPlan(split_seq, num_seqs, split_tok, total, (), (), (),
                  _padded(total - split_tok, attn_tp_size))
    return TwoBatchPlan(kind, split_seq, split_tok, False, (a, b))


def _extend_inputs(
    num_tokens: int,
    extend_lens: Sequence[int],
    extend_prefix_lens: Sequence[int] | None,
    seq_lens: Sequence[int] | None,
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], list[int]]:
    """Validated (extend_lens, prefix_lens, seq_lens, prefix sums of extend_lens) with the
    missing ones derived."""
    ext = _check_lens("extend_lens", extend_lens, None)
    n = len(ext)
    cum = prefix_sums(ext)
    if num_tokens < cum[n]:
        raise ValueError(f"num_tokens={num_tokens} is less than sum(extend_lens)={cum[n]}")
    given_seq = None if seq_lens is None else _check_lens("seq_lens", seq_lens, n)
    if extend_prefix_lens is not None:
        prefix = _check_lens("extend_prefix_lens", extend_prefix_lens, n)
        seq = tuple(map(add, prefix, ext))
    elif given_seq is not None:
        prefix = tuple(map(sub, given_seq, ext))
        if prefix and min(prefix) < 0:
            raise ValueError(f"seq_lens must be >= extend_lens per sequence; got "
                             f"seq_lens={list(given_seq)}, extend_lens={list(ext)}")
        seq = given_seq
    else:
        prefix, seq = (0,) * n, ext
    if given_seq is not None and given_seq != seq:
        raise ValueError(f"seq_lens must equal extend_prefix_lens + extend_lens; got "
                         f"seq_lens={list(given_seq)}, extend_prefix_lens={list(prefix)}, "
                         f"extend_lens={list(ext)}")
    return ext, prefix, seq, cum


def _plan_extend(
    num_tokens: int,
    extend_lens: Sequence[int],
    extend_prefix_lens: Sequence[int] | None,
    seq_lens: Sequence[int] | None,
    threshold: float,
    attn_tp_size: int,
) -> TwoBatchPlan:
    ext, prefix, seq, cum = _extend_inputs(num_tokens, extend_lens, extend_prefix_lens, seq_lens)
    n = len(ext)
    split = plan_extend_split(ext, threshold, cum)
    s, tok = split.seq_index, split.token_index
    pad_a, pad_b = _padded(tok, attn_tp_size), _padded(num_tokens - tok, attn_tp_size)
    if not split.two_chunk:
        a = ChildPlan(0, s, 0, tok, ext[:s], prefix[:s], seq[:s], pad_a)
        b = ChildPlan(s, n, tok, num_tokens, ext[s:], prefix[s:], seq[s:], pad_b)
        return TwoBatchPlan(ForwardKind.EXTEND, s, tok, False, (a, b))
    # Request s is in both children: A computes its first `left` tokens (and, from A's point of
    # view, the sequence ends there); B computes the rest on top of a prefix that includes them.
    left = split.left_len
    a = ChildPlan(0, s + 1, 0, tok, ext[:s] + (left,), prefix[: s + 1],
                  seq[:s] + (prefix[s] + left,), pad_a)
    b = ChildPlan(s, n, tok, num_tokens, (ext[s] - left,) + ext[s + 1:],
                  (prefix[s] + left,) + prefix[s + 1:], seq[s:], pad_b)
    return TwoBatchPlan(ForwardKind.EXTEND, s, tok, True, (a, b))


def split_overlaps(kind: ForwardKind, busiest_tokens: int, tokens_per_seq: int = 1) -> bool:
    """Whether a two-batch split of the busiest rank's batch leaves both children with tokens,
    i.e. whether a TBO step overlaps anything at all. Decode / target-verify split by sequence:
    at least two sequences of `tokens_per_seq` tokens; extend: at least two tokens (two-chunk
    can cut one request). Where it is False every rank runs TBO with an empty child: the serial
    path plus that child's cost, never faster."""
    if type(kind) is not ForwardKind:
        kind = ForwardKind(kind)
    if tokens_per_seq < 1:
        raise ValueError(f"tokens_per_seq must be >= 1; got {tokens_per_seq=}")
    if kind is ForwardKind.IDLE:
        return False
    if kind is ForwardKind.EXTEND:
        return busiest_tokens >= 2
    return busiest_tokens >= 2 * tokens_per_seq


__all__ = ["ChildPlan", "ForwardKind", "TwoBatchPlan", "plan_two_batch", "split_overlaps"]
