"""Hook on `sglang.srt.managers.scheduler_components.dp_attn`: --overlap-gating auto per step.

`_update_gather_batch` (BEFORE): after SGLang's DP sync every rank holds the same global token
counts and TBO verdict; the gate (`gate.py`) turns TBO off for the step when another mode (or
none) is predicted faster. Same inputs on every rank, same decision: collectives never mismatch.
"""

from __future__ import annotations

import logging
from typing import Any

from sglang_overlap import stats
from sglang_overlap.sglang import state
from sglang_overlap.sglang.gate import gate
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

UPDATE_GATHER_BATCH = "sglang.srt.managers.scheduler_components.dp_attn._update_gather_batch"

_last_mode: dict[str, str] = {}


def gate_step(batch: Any, mlp_sync_info: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_update_gather_batch`: with --overlap-gating auto, keep TBO for this step only if
    the gate picks it. Reads only what every rank shares after the DP all-gather."""
    s = state.settings()
    if s.overlap_gating != "auto" or kwargs.get("skip_global_metadata"):
        return
    if mlp_sync_info.tbo_split_seq_index is None and not s.enable_single_batch_overlap:
        return
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = mlp_sync_info.global_forward_mode
    extend = mode is not None and ForwardMode(mode).is_extend() and not (
        ForwardMode(mode).is_target_verify())
    tokens = list(mlp_sync_info.global_num_tokens or [mlp_sync_info.num_tokens])
    phase = "prefill" if extend else "decode"
    decision = gate().decide(phase, tokens)
    state.set_step_mode(decision.mode)
    stats.count(f"gate_{decision.mode}")
    if _last_mode.get(phase) != decision.mode:
        _last_mode[phase] = decision.mode
        logger.info("sglang-overlap gate: %s -> %s (%s)", phase, decision.mode, decision.reason)
    else:
        logger.debug("sglang-overlap gate: %s", decision.reason)
    if decision.mode not in ("tbo", "two_chunk"):
        mlp_sync_info.tbo_split_seq_index = None
        mlp_sync_info.global_forward_mode = None


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(UPDATE_GATHER_BATCH, gate_step, "before",
             "--overlap-gating auto: the gate decides TBO per step, same on every rank",
             "src:bb69194a0d6e"),
)
