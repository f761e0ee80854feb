"""Hook on `sglang.srt.layers.moe.ep_moe.layer`: with `--moe-a2a-backend torch_a2a` the local
experts run in torch (`torch_a2a.py`), because the supported SGLang has no CPU or unquantized
expert path for DeepEP's layouts; with SBO they mark the kernels' signal units for combine-send
to take."""

from __future__ import annotations

from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.upstream.server_args import TORCH_A2A

RUN_MOE_CORE = "sglang.srt.layers.moe.ep_moe.layer.DeepEPMoE.run_moe_core"


def run_moe_core(orig: Any, self: Any, dispatch_output: Any) -> Any:
    """The local experts on a torch_a2a dispatch (SGLang has no such path for DeepEP layouts)."""
    if state.settings().requested_a2a_backend != TORCH_A2A:
        return orig(self, dispatch_output)
    from sglang_overlap.sglang.torch_a2a import find_impl, run_local_experts

    impl = find_impl(self, dispatch_output)
    if impl is None:
        return orig(self, dispatch_output)
    combine_input, signalled = run_local_experts(self, impl, dispatch_output)
    if signalled:
        stats.count("sbo_down_gemm_signal")
    return combine_input


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(RUN_MOE_CORE, run_moe_core, "around",
             "torch_a2a: local experts in torch (SGLang has no CPU path for DeepEP layouts)",
             "src:b1eeddaea0b0", feature=Feature.TORCH_A2A),
)
