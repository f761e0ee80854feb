"""Hooks on `sglang.srt.batch_overlap.single_batch_overlap`: whether the down GEMM overlaps the
combine send, and the signal the plugin's down GEMM raises for it.

* `SboFlags.enable_combine_down_gemm_two_stream_overlap` (around): only when the chosen path has a
  signal GEMM and a combine form (`sbo_decision.py`).
* `compute_overlap_args` (around): for the plugin's down GEMM, swap upstream's Hopper per-block
  int32 signal for the one `kernels.down_gemm.combine_signal_layout` lays out (the installed
  DeepEP tree's form: per expert, or per 64-row block).
  The signal is allocated with torch.zeros inside the forward, so a CUDA-graph replay re-zeroes
  it; the layout depends only on static shapes.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.planning.sbo_path import SboDecision
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.sbo_decision import active_decision

SBO = "sglang.srt.batch_overlap.single_batch_overlap"
SBO_DOWN_GEMM_FLAG = f"{SBO}.SboFlags.enable_combine_down_gemm_two_stream_overlap"
COMPUTE_OVERLAP_ARGS = f"{SBO}.compute_overlap_args"


def down_gemm_flag(orig: Any, cls: Any) -> bool:
    decision = active_decision()
    if decision is None:
        return bool(orig(cls))
    from sglang.srt.layers.moe.utils import is_sbo_enabled

    return bool(is_sbo_enabled()) and decision.down_gemm_overlap


def apply_plugin_signal(decision: SboDecision, combine: Any, down: Any, meta: dict[str, Any],
                        shape: tuple[int, int, int], expected_m: int, device: Any,
                        comm_num_sms: int = 0) -> None:
    """Swap upstream's Hopper per-block int32 signal for the plugin signal GEMM's, in place:
    the layout the installed tree's combine reads (`down_gemm.combine_signal_layout`: 64-row
    blocks per block, the GEMM off the send's SMs and on an even count)."""
    from sglang_overlap.kernels.down_gemm import combine_signal_layout
    from sglang_overlap.kernels.signals import new_signal

    total = combine.num_sms + meta["compute_num_sms"]
    comm = comm_num_sms or combine.num_sms
    e_local, capacity, hidden = shape
    assert decision.granularity is not None
    form = decision.combine_form or ("per_expert" if decision.granularity == "expert"
                                     else "per_block")
    layout = combine_signal_layout(form, num_local_experts=e_local, world_size=1,
                                   num_max_dispatch_tokens_per_rank=capacity,  # C = N * W
                                   num_tokens=capacity, hidden=hidden, expected_m=expected_m,
                                   num_sms=total, comm_num_sms=comm)
    signal = new_signal(layout, device)  # zeroed in the forward: re-zeroed on graph replay
    combine.signal = down.signal = signal
    combine.num_sms, combine.threshold = comm, layout.expect_value
    down.num_sms = meta["compute_num_sms"] = layout.compute_num_sms
    down.sbo_layout, down.expected_m = layout, expected_m
    if layout.granularity == "block":
        meta["block_m"], meta["threshold"] = layout.block_m, layout.expect_value


def compute_overlap_args(orig: Any, dispatch_output: Any, alt_stream: Any) -> Any:
    combine, down, meta = orig(dispatch_output, alt_stream)
    decision = active_decision()
    if decision is None or down is None or decision.gemm_signal_source != "plugin":
        return combine, down, meta
    hidden = dispatch_output.hidden_states  # [E_local, C, H]
    apply_plugin_signal(decision, combine, down, meta, tuple(hidden.shape),
                        int(dispatch_output.expected_m), hidden.device,
                        state.settings().sbo_combine_num_sms)
    return combine, down, meta


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(SBO_DOWN_GEMM_FLAG, down_gemm_flag, "around",
             "down-GEMM/combine overlap only when the chosen path has a signal GEMM and form",
             "src:e69ed28837be", feature=Feature.SBO),
    HookSpec(COMPUTE_OVERLAP_ARGS, compute_overlap_args, "around",
             "lay the signal out for the plugin's signal GEMM (per expert or per block)",
             "src:b81cb364ab27", feature=Feature.SBO),
)
