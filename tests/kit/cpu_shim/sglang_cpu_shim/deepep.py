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
   With SGLANG_CPU_SHIM_DEEPEP_FP8=1 the experts run as SGLang's DeepGEMM runner runs an fp8
   checkpoint's (`moe_runner/deep_gemm.py`, masked path): weights in fp8 with 128 x 128 block
   scales (quantized once from the checkpoint's), the dispatched rows in fp8 with 1 x 128
   scales (DeepEP's fp8 dispatch, or quantized here after a bf16 one), gate-up and down as the
   stand-in's fp8 masked GEMMs, SiLU-and-mul then 1 x 128 quantization between. The down GEMM
   of an SBO step (`down_gemm_overlap_args` set by SGLang's `compute_overlap_args`) goes where
   SGLang's runner sends it: `start_event.record()`, then
   `deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_masked(..., overlap_args=...)`, whose plugin hook
   runs the signal GEMM; a (block_m, threshold) it returns lands in `meta_overlap_args`. The
   outputs are written in the model's dtype (the stand-in's GEMMs cast to their output's dtype;
   DeepGEMM writes bf16), so the fp8 servers differ from the unquantized ones only by the fp8
   rounding of the expert GEMMs' operands.
   A normal-mode dispatch (`--deepep-mode normal`, or `auto`'s prefill) goes to
   normal_experts.py, which also lets SGLang's normal combine_a run without JIT DeepGEMM.
3. CUDA streams and events on the CPU for SGLang's stream code (streams.py): the MoE layer's
   side stream, SBO's combine stream and events.
4. Evidence of what ran, for the e2e tests: every call of a DeepEP dispatcher's dispatch hooks
   (`DeepEPPDispatchHooks.__call__`, where SGLang's SBO runs the shared expert between dispatch
   send and receive) adds its number of registered hooks to the stand-in's call counters
   (`deep_ep_gloo.COUNTERS["dispatch_hooks"]`, written with the graph counters); every fp8
   experts call (low-latency or normal) adds one to `COUNTERS["fp8_experts"]`.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F

DEEPEP_ENV = "SGLANG_CPU_SHIM_DEEPEP"
FP8_ENV = "SGLANG_CPU_SHIM_DEEPEP_FP8"
H100_SXM = SimpleNamespace(name="NVIDIA H100 80GB HBM3 (cpu_shim emulation)", major=9, minor=0,
                           multi_processor_count=132, total_memory=80 * (1 << 30))
RUN_MOE_CORE = "sglang.srt.layers.moe.ep_moe.layer.DeepEPMoE.run_moe_core"
DISPATCH_HOOKS = "sglang.srt.layers.moe.token_dispatcher.deepep.DeepEPPDispatchHooks.__call__"


def enabled() -> bool:
    return os.environ.get(DEEPEP_ENV, "0") == "1"


def fp8_experts() -> bool:
    return os.environ.get(FP8_ENV, "0") == "1"


def _fp8_weights(layer: Any) -> tuple[torch.Tensor, ...]:
    """The layer's (w13, w13 scales, w2, w2 scales) in fp8 with 128 x 128 block scales (the
    plugin's `kernels.fp8.quant_per_block`), quantized once."""
    from sglang_overlap.kernels.fp8 import quant_per_block

    cached = layer.__dict__.get("_cpu_shim_fp8")
    if cached is None:
        cached = (*quant_per_block(layer.w13_weight.data),
                  *quant_per_block(layer.w2_weight.data))
        layer._cpu_shim_fp8 = cached
    return cached  # type: ignore[no-any-return]


def _overlap_args(layer: Any) -> tuple[Any, Any]:
    """(down_gemm_overlap_args, meta_overlap_args) SGLang set on the layer for this call."""
    holder = layer.runner if getattr(layer, "runner", None) is not None else layer
    return (getattr(holder, "down_gemm_overlap_args", None),
            getattr(holder, "meta_overlap_args", None))


def run_fp8_experts(layer: Any, hidden: torch.Tensor, scale: torch.Tensor | None,
                    masked_m: torch.Tensor, expected_m: int, dtype: torch.dtype) -> torch.Tensor:
    """[E, C, H] dispatched rows (fp8 with [E, C, H / 128] scales, or float) -> [E, C, H] in
    `dtype`, as SGLang's DeepGEMM runner computes an fp8 checkpoint's experts."""
    import deep_gemm
    from sglang.srt.layers import deep_gemm_wrapper

    from sglang_cpu_shim.deep_ep_gloo import COUNTERS, quantize_fp8

    COUNTERS["fp8_experts"] += 1
    w13, w13_s, w2, w2_s = _fp8_weights(layer)
    x, x_s = (hidden, scale) if scale is not None else quantize_fp8(hidden)
    e, c, _ = x.shape
    gate_up = torch.zeros((e, c, w13.shape[1]), dtype=dtype)
    deep_gemm.m_grouped_fp8_gemm_nt_masked((x, x_s), (w13, w13_s), gate_up, masked_m,
                                           expected_m)
    gate, up = gate_up.float().chunk(2, dim=-1)
    act, act_s = quantize_fp8(F.silu(gate) * up)  # 1 x 128 groups
    out = torch.zeros((e, c, w2.shape[1]), dtype=dtype)  # rows past masked_m stay 0
    down_args, meta = _overlap_args(layer)
    if down_args is None:
        deep_gemm.m_grouped_fp8_gemm_nt_masked((act, act_s), (w2, w2_s), out, masked_m,
                                               expected_m)
        return out
    down_args.start_event.record()
    ret = deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_masked(
        (act, act_s), (w2, w2_s), out, masked_m, expected_m, overlap_args=down_args,
        max_block_n=256)
    if meta is not None and ret is not None:
        meta["block_m"], meta["threshold"] = ret
    return out


def run_moe_core(orig: Any, self: Any, dispatch_output: Any) -> Any:
    from sglang.srt.layers.moe.token_dispatcher import DispatchOutputChecker, deepep

    if self.deprecate_flag or self.quant_config is not None:
        return orig(self, dispatch_output)
    if DispatchOutputChecker.format_is_deepep_normal(dispatch_output):
        from sglang_cpu_shim import normal_experts

        return normal_experts.run(self, dispatch_output, fp8_experts())
    if not DispatchOutputChecker.format_is_deepep_ll(dispatch_output):
        return orig(self, dispatch_output)
    if fp8_experts():
        out = run_fp8_experts(self, dispatch_output.hidden_states,
                              dispatch_output.hidden_states_scale, dispatch_output.masked_m,
                              int(dispatch_output.expected_m), self.w13_weight.dtype)
        return deepep.DeepEPLLCombineInput(hidden_states=out, topk_ids=dispatch_output.topk_ids,
                                           topk_weights=dispatch_output.topk_weights)
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

    from sglang_cpu_shim import normal_experts, streams

    streams.install()
    if not torch.cuda.is_available():
        torch.cuda.get_device_properties = lambda device=None: H100_SXM  # type: ignore
    HookRegistry.register(RUN_MOE_CORE, run_moe_core, HookType.AROUND)
    HookRegistry.register(DISPATCH_HOOKS, dispatch_hooks, HookType.AROUND)
    HookRegistry.register(normal_experts.COMBINE_A, normal_experts.combine_a, HookType.AROUND)
