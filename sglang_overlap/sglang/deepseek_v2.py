"""Hook on `sglang.srt.models.deepseek_v2`: a step runs SBO only when its mode is SBO.

Upstream decides SBO once per process: `moe.sbo_enabled` (read live by every `SboFlags` method)
and `DeepseekV2MoE._fuse_shared_experts_inside_sbo` (cached when the layer is built). With the
mode selector (--overlap-gating auto) and SBO enabled, `forward_deepep` (around) runs with both
set to whether SBO applies to this call (`state.sbo_active()`), restored after. A call in any
other mode then takes upstream's own non-SBO branch: shared experts on the side stream before
the experts, no dispatch hook, no `compute_overlap_args`, so no combine signal and no signal
GEMM. Under CUDA graphs the same switch runs while each mode's graph is captured
(`decode_cuda_graph_runner.py`), so the choice is baked into that mode's graph.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec

FORWARD_DEEPEP = "sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_deepep"
_CAPABLE = "_sglang_overlap_sbo_capable"  # the layer's own value of the cached SBO choice


def forward_deepep(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    s = state.settings()
    if not s.enable_single_batch_overlap or s.overlap_gating != "auto":
        return orig(self, *args, **kwargs)
    capable = self.__dict__.setdefault(_CAPABLE, bool(self._fuse_shared_experts_inside_sbo))
    active = state.sbo_active()
    self._fuse_shared_experts_inside_sbo = capable and active
    try:
        with state.upstream_flags(sbo=active):
            return orig(self, *args, **kwargs)
    finally:
        self._fuse_shared_experts_inside_sbo = capable


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(FORWARD_DEEPEP, forward_deepep, "around",
             "--overlap-gating auto: SBO (shared-expert overlap, signal GEMM) only in SBO steps",
             "src:f170561734f8"),
)
