"""Where a prefill (extend) batch is cut in two, and when one request is cut across both halves.

The sequence-boundary split and the two-chunk trigger follow the supported SGLang
(`sglang.srt.batch_overlap.two_batch_overlap`: `_split_array_by_balanced_sum`,
`_split_array_by_cum_less_than_half`, `_is_two_chunk_split_enabled`) exactly, with one deliberate
difference, kept in `plan_extend_split`: when the half-token cut lands exactly on a sequence
boundary (the cut request would give child A zero tokens), upstream still plans a two-chunk split
and puts a zero-token copy of that request in child A; we plan the plain boundary split at the
same (sequence, token) indices instead: same token counts, one request fewer in child A.

Plain Python on ints; no torch, no sglang.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

THRESHOLD_FLAG = "--tbo-token-distribution-threshold"


@dataclass(frozen=True)
class TwoChunkCut:
    """A cut at half the tokens through request `seq_index`.

    Child A takes sequences [0, seq_index] and tokens [0, token_index); child B takes sequences
    [seq_index, n) and tokens [token_index, total). Request `seq_index` appears in both: its first
    `left_len` extend tokens go to A, the rest to B.
    """

    seq_index: int
    token_index: int  # = total // 2
    left_len: int  # tokens of request seq_index that child A computes (0: cut on a boundary)


def check_threshold(threshold: float) -> None:
    """Raise ValueError unless 0 <= threshold <= 0.5 (0 disables two-chunk)."""
    if not (isinstance(threshold, (int, float)) and 0.0 <= threshold <= 0.5):
        raise ValueError(
            f"{THRESHOLD_FLAG} must be in [0, 0.5] (got {threshold!r}); 0 disables two-chunk"
        )


def prefix_sums(extend_lens: Sequence[int]) -> list[int]:
    """[0, l0, l0 + l1, ..., total]: every boundary's left token count, in one C-speed pass."""
    return list(accumulate(extend_lens, initial=0))


def _balanced_from_cum(cum: list[int]) -> int:
    """`balanced_split_index` on prefix sums (len n + 1), by bisection."""
    n = len(cum) - 1
    if n < 2:
        return 0
    total = cum[n]
    # first boundary j in [1, n) whose left half holds at least half the tokens (d(j) >= 0)
    j = bisect_left(cum, (total + 1) // 2, 1, n)
    if j == n:  # every boundary leaves less than half on the left: |d| falls to the last one
        return n - 1
    if j > 1 and total - 2 * cum[j - 1] < 2 * cum[j] - total:
        return j - 1
    return bisect_right(cum, cum[j], j, n) - 1  # ties (zero-length requests): the latest


def balanced_split_index(extend_lens: Sequence[int]) -> int:
    """The sequence boundary i in 1..n-1 with the smallest |sum(lens[:i]) - sum(lens[i:])|.

    Ties go to the later boundary; 0 when there are fewer than two sequences (upstream walks the
    boundaries and stops as soon as the difference grows). With non-negative lengths
    d(i) = 2*sum(lens[:i]) - total is non-decreasing in i, so |d| falls, then rises: the minimum
    sits next to where d turns non-negative, found by bisection on the prefix sums (the tests
    check this against a brute force).
    """
    return _balanced_from_cum(prefix_sums(extend_lens))


def _cum_half_from_cum(cum: list[int]) -> int:
    k = bisect_right(cum, cum[-1] // 2, 1)
    return k - 1 if k < len(cum) else 0


def cum_half_index(extend_lens: Sequence[int]) -> int:
    """The first sequence whose running token sum exceeds total // 2 (0 if none does)."""
    return _cum_half_from_cum(prefix_sums(extend_lens))


def _wants(cum: list[int], threshold: float) -> bool:
    total = cum[-1]
    left = cum[_balanced_from_cum(cum)]
    return left < total * threshold or left > total * (1 - threshold)


def wants_two_chunk(extend_lens: Sequence[int], threshold: float) -> bool:
    """True when the balanced boundary leaves child A under t or over 1 - t of the tokens.

    The comparison is done in floats exactly as upstream does, so borderline batches agree.
    """
    check_threshold(threshold)
    return _wants(prefix_sums(extend_lens), threshold)


def _cut_from_cum(extend_lens: Sequence[int], cum: list[int],
                  threshold: float) -> TwoChunkCut | None:
    if not _wants(cum, threshold):
        return None
    half = cum[-1] // 2
    seq_index = _cum_half_from_cum(cum)
    if seq_index + 1 > half:
        return None  # upstream's guard: child A would hold more sequences than query tokens
    left_len = half - cum[seq_index]
    return TwoChunkCut(seq_index=seq_index, token_index=half, left_len=left_len)


def plan_two_chunk_cut(extend_lens: Sequence[int], threshold: float) -> TwoChunkCut | None:
    """The two-chunk cut for these extend lengths, or None when upstream would not cut.

    None when the threshold is 0, when the balanced boundary is within [t, 1 - t] of the tokens,
    or when child A would get more sequences than tokens (upstream's guard, e.g. a single 1-token
    request). The returned cut may have `left_len == 0` (the cut falls on a sequence boundary);
    `plan_extend_split` turns that into a boundary split.
    """
    check_threshold(threshold)
    return _cut_from_cum(extend_lens, prefix_sums(extend_lens), threshold)


@dataclass(frozen=True)
class ExtendSplit:
    """Where an extend batch is split: the decision `plan_two_batch` turns into two children."""

    seq_index: int  # boundary: A = seqs [0, seq_index); two-chunk: the request in both children
    token_index: int  # A = tokens [0, token_index)
    two_chunk: bool
    left_len: int  # two-chunk: tokens of request seq_index in child A (>= 1); 0 otherwise


def plan_extend_split(extend_lens: Sequence[int], threshold: float,
                      cum: list[int] | None = None) -> ExtendSplit:
    """The TBO split of an extend batch: balanced sequence boundary, or a two-chunk cut.

    (seq_index, token_index) always equal upstream's (compute_split_seq_index,
    compute_split_token_index). Only `two_chunk` differs, in one case: a cut with no tokens left
    for child A is planned as the boundary split at the same indices (see the module docstring).
    `cum`: the prefix sums of `extend_lens` when the caller has them (`prefix_sums`).
    """
    check_threshold(threshold)
    cum = prefix_sums(extend_lens) if cum is None else cum
    cut = _cut_from_cum(extend_lens, cum, threshold) if threshold > 0 else None
    if cut is not None:
        return ExtendSplit(cut.seq_index, cut.token_index, cut.left_len > 0, cut.left_len)
    seq_index = _balanced_from_cum(cum)
    return ExtendSplit(seq_index, cum[seq_index], False, 0)


__all__ = [
    "THRESHOLD_FLAG",
    "ExtendSplit",
    "TwoChunkCut",
    "balanced_split_index",
    "check_threshold",
    "cum_half_index",
    "plan_extend_split",
    "plan_two_chunk_cut",
    "prefix_sums",
    "wants_two_chunk",
]
