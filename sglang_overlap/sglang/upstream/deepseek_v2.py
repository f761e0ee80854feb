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

from sglang_overlap.modes import Feature
from sglang_overlap.settings import SettingsError
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec

FORWARD_DEEPEP = "sglang.srt.models.deepseek_v2.DeepseekV2MoE.forward_deepep"
_CAPABLE = "_sglang_overlap_sbo_capable"  # the layer's own value of the cached SBO choice
_CACHED = "_fuse_shared_experts_inside_sbo"  # upstream's per-layer SBO choice


def check_model(model: Any) -> None:
    """Refuse (SettingsError naming the flags) a model with an SBO-capable MoE layer other than
    `DeepseekV2MoE` under the selector with SBO: its SBO could not be switched per step."""
    s = state.settings()
    if not s.enable_single_batch_overlap or s.overlap_gating != "auto":
        return
    from sglang.srt.models.deepseek_v2 import DeepseekV2MoE

    others = sorted({type(m).__name__ for m in model.modules()
                     if hasattr(m, _CACHED) and not isinstance(m, DeepseekV2MoE)})
    if others:
        raise SettingsError(
            f"sglang-overlap: --overlap-gating auto with --enable-single-batch-overlap switches "
            f"SBO per step only in DeepseekV2MoE layers; this model's {', '.join(others)} would "
            f"run SBO in every step whatever the selector chose. Drop --overlap-gating auto or "
            f"--enable-single-batch-overlap")


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
             "src:07bd38bfef0e", feature=Feature.GATE),
)
