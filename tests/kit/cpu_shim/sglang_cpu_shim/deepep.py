"""`--moe-a2a-backend deepep` on the CPU, through SGLang's own DeepEP dispatcher (on with
SGLANG_CPU_SHIM_DEEPEP=1, with the kit's deep_ep / deep_gemm stand-ins on PYTHONPATH:
`Kit.env(..., deepep_form=...)`).

1. An emulated SM90 device for the code that sizes DeepEP by the GPU's properties
   (`DeepEPBuffer.get_deepep_buffer` reads `torch.cuda.get_device_properties().
   multi_processor_count`): `torch.cuda.get_device_properties` answers for an H100 SXM (132 SMs,
   compute capability 9.0) while no CUDA device is usable. Nothing else of torch.cuda changes
   (`is_available()` stays False). The plugin's own view of the GPU is SGLANG_OVERLAP_ASSUME_ARCH.
2. The local experts of a low-latency dispatch of an unquantized model: SGLang 0.5.23 has no such
   path outside DeepGEMM's bf16 runner on CUDA (`DeepEPMoE.run_moe_core` asserts), so
   `run_moe_core` (around, after the plugin's hook) runs gate-up and down as the grouped masked
   GEMMs of the installed `deep_gemm` (the stand-in's `m_grouped_bf16_gemm_nt_masked`) with
   SiLU-and-mul between, on the valid rows (`masked_m`) of the [E_local, C, H] layout. An fp8
   dispatch (`--deepep-dispatcher-output-dtype auto` on an unquantized model) is dequantized
   first; the e2e servers dispatch unquantized (`--deepep-dispatcher-output-dtype bf16`, which
   the stand-in serves in the model's dtype).
3. Evidence of what ran, for the e2e tests: every call of a DeepEP dispatcher's dispatch hooks
   (`DeepEPPDispatchHooks.__call__`, where SGLang's SBO runs the shared expert between dispatch
   send and receive) adds its number of registered hooks to the stand-in's call counters
   (`deep_ep_gloo.COUNTERS["dispatch_hooks"]`, written with the graph counters).
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

DEEPEP_ENV = "SGLANG_CPU_SHIM_DEEPEP"
H100_SXM = SimpleNamespace(name="NVIDIA H100 80GB HBM3 (cpu_shim emulation)", major=9, minor=0,
                           multi_processor_count=132, total_memory=80 * (1 << 30))
RUN_MOE_CORE = "sglang.srt.layers.moe.ep_moe.layer.DeepEPMoE.run_moe_core"
DISPATCH_HOOKS = "sglang.srt.layers.moe.token_dispatcher.deepep.DeepEPPDispatchHooks.__call__"


def enabled() -> bool:
    return os.environ.get(DEEPEP_ENV, "0") == "1"


def run_moe_core(orig: Any, self: Any, dispatch_output: Any) -> Any:
    from sglang.srt.layers.moe.token_dispatcher import DispatchOutputChecker, deepep

    if (self.deprecate_flag or self.quant_config is not None
            or not DispatchOutputChecker.format_is_deepep_ll(dispatch_output)):
        return orig(self, dispatch_output)
    import deep_gemm

    hidden, masked_m = dispatch_output.hidden_states, dispatch_output.masked_m  # [E, C, H]
    scale = dispatch_output.hidden_states_scale  # [E, C, H / 128] with an fp8 dispatch
    if scale is not None:  # dequantized: what DeepGEMM's fp8 kernels compute with
        hidden = (hidden.float() * scale.repeat_interleave(128, -1)).to(self.w13_weight.dtype)
    expected_m = int(dispatch_output.expected_m)
    e, c, _ = hidden.shape
    gate_up = hidden.new_zeros((e, c, self.w13_weight.shape[1]))  # [E, C, 2I]
    deep_gemm.m_grouped_bf16_gemm_nt_masked(hidden, self.w13_weight, gate_up, masked_m,
                                            expected_m)
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.zeros_like(hidden)  # rows past masked_m stay 0
    deep_gemm.m_grouped_bf16_gemm_nt_masked(F.silu(gate) * up, self.w2_weight, out, masked_m,
                                            expected_m)
    return deepep.DeepEPLLCombineInput(hidden_states=out, topk_ids=dispatch_output.topk_ids,
                                       topk_weights=dispatch_output.topk_weights)


def dispatch_hooks(orig: Any, self: Any, dispatcher: Any) -> Any:
    from sglang_cpu_shim.deep_ep_gloo import COUNTERS

    COUNTERS["dispatch_hooks"] += len(self.hook_dict)
    return orig(self, dispatcher)


def install() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not torch.cuda.is_available():
        torch.cuda.get_device_properties = lambda device=None: H100_SXM  # type: ignore
    HookRegistry.register(RUN_MOE_CORE, run_moe_core, HookType.AROUND)
    HookRegistry.register(DISPATCH_HOOKS, dispatch_hooks, HookType.AROUND)
