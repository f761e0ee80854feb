"""`--moe-a2a-backend torch_a2a`: expert parallelism over torch.distributed all-to-all.

For machines without DeepEP (a CPU box, a GPU without NVSHMEM): the MoE layers dispatch and
combine with the engine's `AllToAllDispatcher` over the tensor-parallel group (gloo on CPU, NCCL
on GPU), and the routed experts run per local expert on their valid rows (`a2a_impl.py`).
Everything else is SGLang's DeepEP machinery, unchanged: tokens scattered over the attention-TP
ranks before the MoE and gathered after, the MLP sync that decides TBO, the TBO child batches
and stage operations, the SBO dispatch hook. How:

  * resolution: `torch_a2a` resolves to `deepep` (so every `is_deepep()` branch applies, and
    ep_size = tp_size); the user's choice stays on the plugin's settings;
  * `DeepEPDispatcher.__init__`: builds the plugin's impls instead of DeepEP's buffers;
  * `DeepEPMoE.run_moe_core`: SGLang 0.5.23 has no CPU or unquantized expert path for DeepEP's
    layouts, so the plugin computes the local experts (with SBO, marking the engine's signal
    units for combine-send to take).

Legend: T tokens of this rank, K top-k, H hidden, E_local local experts, C LL capacity.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap import stats
from sglang_overlap.sglang import runtime
from sglang_overlap.sglang.hooks import HookSpec

BACKEND = "torch_a2a"
RESOLUTION_STEP = "handle_a2a_moe"
DEEPEP = "sglang.srt.layers.moe.token_dispatcher.deepep"
DISPATCHER_INIT = f"{DEEPEP}.DeepEPDispatcher.__init__"
RUN_MOE_CORE = "sglang.srt.layers.moe.ep_moe.layer.DeepEPMoE.run_moe_core"


def alias_to_deepep(server_args: Any, previous: Any) -> None:
    """Resolution step `handle_a2a_moe`: torch_a2a takes DeepEP's code paths."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolved_view

    if resolved_view(server_args).moe_a2a_backend == BACKEND:
        declare_resolution(server_args, "sglang_overlap", moe_a2a_backend="deepep")
    previous(server_args)


def dispatcher_init(orig: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """With torch_a2a, DeepEPDispatcher builds the plugin's impls (its own code, other classes)."""
    if runtime.settings().moe_a2a_backend != BACKEND:
        orig(self, *args, **kwargs)
        return
    from sglang.srt.layers.moe.token_dispatcher import deepep

    from sglang_overlap.sglang.a2a_impl import LL_IMPL, NORMAL_IMPL

    saved = deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal
    deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal = (
        LL_IMPL, NORMAL_IMPL)
    try:
        orig(self, *args, **kwargs)
    finally:
        deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal = saved


def run_moe_core(orig: Any, self: Any, dispatch_output: Any) -> Any:
    """The local experts on a torch_a2a dispatch (SGLang has no such path for DeepEP layouts)."""
    if runtime.settings().moe_a2a_backend != BACKEND:
        return orig(self, dispatch_output)
    from sglang_overlap.sglang.a2a_impl import find_impl, run_local_experts

    impl = find_impl(self, dispatch_output)
    if impl is None:
        return orig(self, dispatch_output)
    combine_input, signalled = run_local_experts(self, impl, dispatch_output)
    if signalled:
        stats.count("sbo_down_gemm_signal")
    return combine_input


RESOLUTION_HOOKS: tuple[tuple[str, Any], ...] = ((RESOLUTION_STEP, alias_to_deepep),)

A2A_HOOKS: tuple[HookSpec, ...] = (
    HookSpec(DISPATCHER_INIT, dispatcher_init, "around",
             "torch_a2a: DeepEPDispatcher builds all-to-all impls instead of DeepEP buffers"),
    HookSpec(RUN_MOE_CORE, run_moe_core, "around",
             "torch_a2a: local experts in torch (SGLang has no CPU path for DeepEP layouts)"),
)
