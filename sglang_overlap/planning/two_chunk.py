"""Where a prefill (extend) batch is cut in two, and when one request is cut across both halves.

The sequence-boundary split and the two-chunk trigger follow SGLang 0.5.23
(`sglang.srt.batch_overlap.two_batch_overlap`: `_split_array_by_balanced_sum`,
`_split_array_by_cum_less_than_half`, `_is_two_chunk_split_enabled`) exactly, with one deliberate
difference, kept in `plan_extend_split`: when the half-token cut lands exactly on a sequence
boundary (the cut request would give child A zero tokens), upstream still plans a two-chunk split
and puts a zero-token copy of that request in child A; we plan the plain boundary split at the
same (sequence, token) indices instead: same token counts, one request fewer in child A.

Plain Python on ints; no torch, no sglang.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

THRESHOLD_FLAG = "--tbo-token-distribution-threshold"


@dataclass(frozen=True)
class TwoChunkCut:
    """A cut at half the tokens through request `seq_index`.

    Child A takes sequences [0, seq_index] and tokens [0, token_index); child B takes sequences
    [seq_index, n) and tokens [token_index, total). Request `seq_index` appears in both: its first
    `left_len` extend tokens go to A, the remaining `right_len` to B.
    """

    seq_index: int
    token_index: int  # = total // 2
    left_len: int  # tokens of request seq_index that child A computes (0: cut on a boundary)
    right_len: int  # >= 1: tokens of request seq_index that child B computes


def check_threshold(threshold: float) -> None:
    """Raise ValueError unless 0 <= threshold <= 0.5 (0 disables two-chunk)."""
    if not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 0.5):
        raise ValueError(
            f"{THRESHOLD_FLAG} must be in [0, 0.5] (got {threshold!r}); 0 disables two-chunk"
        )


def balanced_split_index(extend_lens: Sequence[int]) -> int:
    """The sequence boundary i in 1..n-1 with the smallest |sum(lens[:i]) - sum(lens[i:])|.

    Ties go to the later boundary; 0 when there are fewer than two sequences. The walk stops as
    soon as the difference grows: with non-negative lengths, d(i) = 2*sum(lens[:i]) - total is
    non-decreasing in i, so once |d| has grown, d > 0 and every later |d| is at least as large;
    the early stop therefore still returns a global minimum (the tests check this by brute force).
    """
    total = sum(extend_lens)
    left = 0
    best_diff = total + 1  # larger than any |d|
    best_index = 0
    for i in range(1, len(extend_lens)):
        left += extend_lens[i - 1]
        diff = abs(2 * left - total)
        if diff <= best_diff:
            best_diff = diff
            best_index = i
        else:
            break
    return best_index


def cum_half_index(extend_lens: Sequence[int]) -> int:
    """The first sequence whose running token sum exceeds total // 2 (0 if none does)."""
    half = sum(extend_lens) // 2
    left = 0
    for i, n in enumerate(extend_lens):
        left += n
        if left > half:
            return i
    return 0


def wants_two_chunk(extend_lens: Sequence[int], threshold: float) -> bool:
    """True when the balanced boundary leaves child A under t or over 1 - t of the tokens.

    The comparison is done in floats exactly as upstream does, so borderline batches agree.
    """
    check_threshold(threshold)
    total = sum(extend_lens)
    left = sum(extend_lens[: balanced_split_index(extend_lens)])
    return left < total * threshold or left > total * (1 - threshold)


def plan_two_chunk_cut(extend_lens: Sequence[int], threshold: float) -> TwoChunkCut | None:
    """The two-chunk cut for these extend lengths, or None when upstream would not cut.

    None when the threshold is 0, when the balanced boundary is within [t, 1 - t] of the tokens,
    or when child A would get more sequences than tokens (upstream's guard, e.g. a single 1-token
    request). The returned cut may have `left_len == 0` (the cut falls on a sequence boundary);
    `plan_extend_split` turns that into a boundary split.
    """
    if not wants_two_chunk(extend_lens, threshold):
        return None
    total = sum(extend_lens)
    half = total // 2
    seq_index = cum_half_index(extend_lens)
    if seq_index + 1 > half:
        return None  # upstream's guard: child A would hold more sequences than query tokens
    left_len = half - sum(extend_lens[:seq_index])
    return TwoChunkCut(
        seq_index=seq_index,
        token_index=half,
        left_len=left_len,
        right_len=extend_lens[seq_index] - left_len,
    )


@dataclass(frozen=True)
class ExtendSplit:
    """Where an extend batch is split: the decision `plan_two_batch` turns into two children."""

    seq_index: int  # boundary: A = seqs [0, seq_index); two-chunk: the request in both children
    token_index: int  # A = tokens [0, token_index)
    two_chunk: bool
    left_len: int  # two-chunk: tokens of request seq_index in child A (>= 1); 0 otherwise


def plan_extend_split(extend_lens: Sequence[int], threshold: float) -> ExtendSplit:
    """The TBO split of an extend batch: balanced sequence boundary, or a two-chunk cut.

    (seq_index, token_index) always equal upstream's (compute_split_seq_index,
    compute_split_token_index). Only `two_chunk` differs, in one case: a cut with no tokens left
    for child A is planned as the boundary split at the same indices (see the module docstring).
    """
    cut = plan_two_chunk_cut(extend_lens, threshold)
    if cut is not None:
        return ExtendSplit(cut.seq_index, cut.token_index, cut.left_len > 0, cut.left_len)
    seq_index = balanced_split_index(extend_lens)
    return ExtendSplit(seq_index, sum(extend_lens[:seq_index]), False, 0)


__all__ = [
    "THRESHOLD_FLAG",
    "ExtendSplit",
    "TwoChunkCut",
    "balanced_split_index",
    "check_threshold",
    "cum_half_index",
    "plan_extend_split",
    "plan_two_chunk_cut",
    "wants_two_chunk",
]
