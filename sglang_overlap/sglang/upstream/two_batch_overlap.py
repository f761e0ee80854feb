"""Hooks on `sglang.srt.batch_overlap.two_batch_overlap`: TBO and two-chunk decisions, taken by
`sglang_overlap.planning`.

The supported SGLang decides where a batch is split in three free functions of
`sglang.srt.batch_overlap.two_batch_overlap`. With --enable-two-batch-overlap the plugin answers
each (AROUND, upstream's is not called) from one plan of `planning.plan_two_batch`, so the split
index, the token index and the two-chunk flag can never disagree; otherwise it hands back to
upstream's. SGLang's generic machinery (child ForwardBatch construction in
`TboForwardBatchPreparer`, the TBO attention wrapper, the CUDA-graph plugin) is kept: it only
consumes these decisions.

One deliberate difference from upstream (planning/two_chunk.py): a two-chunk cut that falls
exactly on a request boundary is planned as a plain boundary split, at the same indices, instead
of a two-chunk split with a zero-token copy of the request in child A.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature, Mode
from sglang_overlap.planning.two_batch import ForwardKind, TwoBatchPlan, plan_two_batch
from sglang_overlap.sglang.hooks import HookSpec

TBO = "sglang.srt.batch_overlap.two_batch_overlap"
SPLIT_SEQ_INDEX = f"{TBO}.compute_split_seq_index"
SPLIT_TOKEN_INDEX = f"{TBO}.compute_split_token_index"
TWO_CHUNK_ENABLED = f"{TBO}._is_two_chunk_split_enabled"
PREPARE_RAW = f"{TBO}.TboForwardBatchPreparer.prepare_raw"


def forward_kind(forward_mode: Any) -> ForwardKind:
    """SGLang's ForwardMode -> the planning layer's kind (MIXED plans like EXTEND, as upstream)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if forward_mode in (ForwardMode.EXTEND, ForwardMode.MIXED):
        return ForwardKind.EXTEND
    if forward_mode.is_target_verify():
        return ForwardKind.TARGET_VERIFY
    if forward_mode.is_decode():
        return ForwardKind.DECODE
    if forward_mode.is_idle() or forward_mode.is_prebuilt():
        return ForwardKind.IDLE
    raise NotImplementedError(f"sglang-overlap: no two-batch plan for forward mode {forward_mode}")


def _threshold() -> float:
    from sglang.srt.layers.moe.utils import get_tbo_token_distribution_threshold

    return float(get_tbo_token_distribution_threshold())


@functools.lru_cache(maxsize=4096)
def _plan(kind: ForwardKind, num_tokens: int, extend_lens: tuple[int, ...] | None,
          tokens_per_seq: int, threshold: float) -> TwoBatchPlan:
    if kind is ForwardKind.EXTEND:
        assert extend_lens is not None
        return plan_two_batch(kind, sum(extend_lens), extend_lens=extend_lens,
                              two_chunk_threshold=threshold)
    return plan_two_batch(kind, num_tokens, tokens_per_seq=max(tokens_per_seq, 1))


def plan_for(forward_mode: Any, num_tokens: int, extend_lens: Sequence[int] | None,
             token_num_per_seq: int | None) -> TwoBatchPlan:
    kind = forward_kind(forward_mode)
    if kind is ForwardKind.EXTEND:
        if extend_lens is None:
            raise ValueError("sglang-overlap: an extend batch needs extend_lens to be split")
        return _plan(kind, 0, tuple(int(x) for x in extend_lens), 1, _threshold())
    if kind is ForwardKind.IDLE:
        return _plan(kind, 0, None, 1, 0.0)
    if token_num_per_seq is None:
        raise ValueError(f"sglang-overlap: {kind.value} needs token_num_per_seq")
    return _plan(kind, int(num_tokens), None, int(token_num_per_seq), 0.0)


def compute_split_seq_index(forward_mode: Any, num_tokens: int,
                            extend_lens: Sequence[int] | None,
                            token_num_per_seq: int | None) -> int:
    return plan_for(forward_mode, num_tokens, extend_lens, token_num_per_seq).split_seq_index


def compute_split_token_index(split_seq_index: int, forward_mode: Any,
                              extend_seq_lens: Sequence[int] | None,
                              token_num_per_seq: int | None) -> int:
    kind = forward_kind(forward_mode)
    if kind is ForwardKind.EXTEND:
        plan = plan_for(forward_mode, 0, extend_seq_lens, None)
    else:
        # Decode/verify callers pass the split, not the token count: rebuild from it.
        tnps = max(int(token_num_per_seq or 1), 1)
        return int(split_seq_index) * tnps if kind is not ForwardKind.IDLE else 0
    if plan.split_seq_index != split_seq_index:
        raise ValueError(f"sglang-overlap: split_seq_index={split_seq_index} is not the planned "
                         f"{plan.split_seq_index} for extend_seq_lens="
                         f"{list(extend_seq_lens or [])}")
    return plan.split_token_index


def is_two_chunk_split_enabled(extend_lens: Sequence[int] | None) -> bool:
    if extend_lens is None:
        return False
    return plan_for_extend(extend_lens).two_chunk


def plan_for_extend(extend_lens: Sequence[int]) -> TwoBatchPlan:
    return _plan(ForwardKind.EXTEND, 0, tuple(int(x) for x in extend_lens), 1, _threshold())


def _count_tbo_step(result: Any, cls: Any, batch: Any, *args: Any, **kwargs: Any) -> None:
    """After SGLang built the two children: count the step by the path it took."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    two_chunk = batch.forward_mode == ForwardMode.EXTEND and is_two_chunk_split_enabled(
        batch.extend_seq_lens_cpu)
    stats.count(Mode.TWO_CHUNK if two_chunk else Mode.TBO)


def _plugin_tbo() -> bool:
    from sglang_overlap.sglang import state

    return state.settings().enable_two_batch_overlap


def split_seq_index_hook(orig: Any, *args: Any, **kwargs: Any) -> int:
    """AROUND: the planned split with the plugin's TBO on, upstream's otherwise."""
    return compute_split_seq_index(*args, **kwargs) if _plugin_tbo() else orig(*args, **kwargs)


def split_token_index_hook(orig: Any, *args: Any, **kwargs: Any) -> int:
    return compute_split_token_index(*args, **kwargs) if _plugin_tbo() else orig(*args, **kwargs)


def two_chunk_hook(orig: Any, *args: Any, **kwargs: Any) -> bool:
    return is_two_chunk_split_enabled(*args, **kwargs) if _plugin_tbo() else orig(*args, **kwargs)


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(SPLIT_SEQ_INDEX, split_seq_index_hook, "around",
             "the TBO split index comes from planning.plan_two_batch", "src:f1f807e45e6d",
             feature=Feature.TBO),
    HookSpec(SPLIT_TOKEN_INDEX, split_token_index_hook, "around",
             "the TBO token index comes from the same plan", "src:d3ac7cbb814e",
             feature=Feature.TBO),
    HookSpec(TWO_CHUNK_ENABLED, two_chunk_hook, "around",
             "the two-chunk decision comes from the same plan", "src:467bc0aa49e6",
             feature=Feature.TBO),
    HookSpec(PREPARE_RAW, _count_tbo_step, "after",
             "count TBO / two-chunk steps (evidence in the server log)", "src:7f7e765312cf",
             feature=Feature.TBO),
)
