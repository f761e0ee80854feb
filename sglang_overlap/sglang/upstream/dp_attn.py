"""Hook on `sglang.srt.managers.scheduler_components.dp_attn`: --overlap-gating auto per step.

`_update_gather_batch` (BEFORE): after SGLang's DP sync every rank holds the same global token
counts, forward modes and TBO verdict. The mode selector (`selector_runtime.py`) first counts the
call (`tick`; with attention DP, every --overlap-gating-sync-steps calls, an all-reduce of new
measurements, reached at the same call on every rank, since every rank runs this hook for the same
steps; without it the measurements ride the request broadcast, `request_receiver.py`), then picks
this step's `StepDecision` and hands it to the step's forward (`state.hand_over`); SGLang's TBO
split is turned off for the step when another mode (or none) is chosen. TBO is
a candidate only where SGLang can run it and the split gives both micro-batches tokens on some rank
(`planning.two_batch.split_overlaps`): a one-sequence decode step "in TBO" is the serial step plus
an empty micro-batch, and measuring it would only teach the selector noise. Same inputs on every
rank, same decision: collectives never mismatch. Every change of mode, and the step after an
exploration that settles on the same mode for its own reason, is logged at INFO with the step
number, so the ranks' logs can be compared line for line.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import SELECTOR_MODES, SPLITS_BATCH, Feature, Mode, Phase
from sglang_overlap.planning.two_batch import ForwardKind, split_overlaps
from sglang_overlap.sglang import selector_setup, state
from sglang_overlap.sglang.hooks import HookSpec, Pin

logger = logging.getLogger("sglang_overlap")

UPDATE_GATHER_BATCH = "sglang.srt.managers.scheduler_components.dp_attn._update_gather_batch"
# The row tp0_info_cpu gathers per rank (its column order is pinned: step_phase reads column 5)
TP0_INFO_COLUMNS = ("sglang.srt.managers.scheduler_components.dp_attn.MLPSyncBatchInfo."
                    "_get_local_tensor")

_PREFILL_MODES: set[int] = set()
_STATS_KEY = {m: f"gate_{m}" for m in SELECTOR_MODES}


def _prefill_modes() -> set[int]:
    if not _PREFILL_MODES:
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        _PREFILL_MODES.update(m.value for m in ForwardMode
                              if state.batch_phase(m) == Phase.PREFILL)
    return _PREFILL_MODES


def step_phase(mlp_sync_info: Any) -> Phase:
    """prefill when any rank extends (not target-verify), else decode: from gathered data."""
    mode = mlp_sync_info.global_forward_mode
    if mode is not None:
        return Phase.PREFILL if int(mode) in _prefill_modes() else Phase.DECODE
    info = mlp_sync_info.tp0_info_cpu  # column 5: every rank's local forward mode
    modes = info[:, 5].tolist() if info is not None else []
    return Phase.PREFILL if any(m in _prefill_modes() for m in modes) else Phase.DECODE


def _tokens_per_seq(mlp_sync_info: Any) -> int:
    """Tokens per sequence of this step's decode-phase batches, the same on every rank: the
    draft-token count for target-verify (the server's speculative config), else 1."""
    mode = mlp_sync_info.global_forward_mode
    if mode is None or int(mode) != _target_verify():
        return 1
    from sglang.srt.runtime_context import get_spec

    return int(get_spec().speculative_num_draft_tokens or 1)


@functools.cache
def _target_verify() -> int:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return int(ForwardMode.TARGET_VERIFY.value)


def select_step(batch: Any, mlp_sync_info: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_update_gather_batch`: with --overlap-gating auto, keep TBO for this step only if
    the mode selector picks it. Reads only what every rank shares after the DP all-gather."""
    s = state.settings()
    if s.overlap_gating != "auto":
        return
    if kwargs.get("skip_global_metadata"):
        state.hand_over(None)  # undecided: SGLang's own rule, not the last step's decision
        return
    rt = selector_setup.runtime()
    if rt is None:
        return  # no model runner started a selector in this process (not a serving scheduler)
    rt.tick()
    phase = step_phase(mlp_sync_info)
    tokens = list(mlp_sync_info.global_num_tokens or [mlp_sync_info.num_tokens])
    # a mode that splits the batch can run only where SGLang split it with tokens on both sides
    split = mlp_sync_info.tbo_split_seq_index is not None and split_overlaps(
        ForwardKind.EXTEND if phase == Phase.PREFILL else ForwardKind.DECODE,
        max(tokens, default=0), _tokens_per_seq(mlp_sync_info))
    available = {m for m in s.enabled_modes if split or m not in SPLITS_BATCH}
    decision = rt.decide(phase, tokens, frozenset(available))
    state.hand_over(decision)
    stats.count(_STATS_KEY[decision.mode])
    if decision.busiest > 0:  # an idle step decides nothing (the selector's `chosen` skips it)
        stats.add("decisions", phase, decision.mode)
        if decision.explored:
            stats.add("explored_steps", phase, decision.mode)
    if decision.changed:
        stats.add("decision_changes", phase)
        logger.info("sglang-overlap gate: %s -> %s (%s)", phase, decision.mode, decision.reason)
    if decision.mode != Mode.TBO:
        mlp_sync_info.tbo_split_seq_index = None
        mlp_sync_info.global_forward_mode = None


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(UPDATE_GATHER_BATCH, select_step, "before",
             "--overlap-gating auto: the selector decides each step alike on every rank; the "
             "decision goes to the step's forward",
             "src:4286710a7e2d", feature=Feature.GATE,
             relies_on=(Pin(TP0_INFO_COLUMNS, "src:33594465f0fd",
                            "step_phase: column 5 of tp0_info_cpu is local_forward_mode"),)),
)
