"""`--deepep-mode normal` / `auto` on the CPU: what SGLang 0.5.23's normal-mode DeepEP path
(`_DeepEPDispatcherImplNormal`) needs beyond the kit's deep_ep stand-in (deep_ep_normal.py),
on with SGLANG_CPU_SHIM_DEEPEP=1. Nothing of the dispatcher's own code is replaced.

1. `_DeepEPDispatcherImplNormal.combine_a` (around): SGLang hands the experts' output on to the
   combine only where DeepGEMM's JIT is on (`deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM`, CUDA
   only), on AMD (aiter) or on Ascend; elsewhere it raises NotImplementedError (its Triton
   runner is disabled). The hook runs that branch's two lines on the CPU: the output is the
   experts' [R, H] as given, and `Buffer.capture()` is the previous event when the dispatcher
   finishes asynchronously.
2. The local experts of a normal dispatch (`run`, from deepep.run_moe_core): SGLang runs them
   only through DeepGEMM's contiguous runner on CUDA (`DeepEPMoE.run_moe_core` refuses an
   unquantized normal dispatch; an fp8 checkpoint takes `moe_runner/deep_gemm.py`), so this
   computes what that runner computes: ep_scatter's layout (received rows grouped per local
   expert in received order, each expert's block starting at a multiple of deep_gemm's
   `get_mk_alignment_for_contiguous_layout()`, padding rows zero and marked -1 in m_indices),
   gate-up and down as the installed deep_gemm's contiguous grouped GEMMs (the stand-in's
   `m_grouped_bf16_gemm_nt_contiguous`, or with SGLANG_CPU_SHIM_DEEPEP_FP8=1
   `m_grouped_fp8_gemm_nt_contiguous` on 128 x 128 block-scaled weights and 1 x 128-scaled
   rows, as deepep.py's masked path), SiLU-and-mul between (then 1 x 128 quantization in
   fp8), and ep_gather: row r's output = sum over k in k order, in float32, of
   recv_topk_weights[r, k] * down[row of (r, k)] for the local experts of r, written in the
   model's dtype (DeepGEMM writes bf16). On a GPU the dispatcher quantizes before an fp8
   dispatch (JIT DeepGEMM only); here the dispatch is in the model's dtype and the rows are
   quantized after it, the same values (1 x 128 groups lie within a row).
   On the CPU the dispatcher asks DeepEP for expert_alignment 1 (JIT DeepGEMM off), so the
   received counts are exact; they are checked against the rows' expert ids.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

COMBINE_A = ("sglang.srt.layers.moe.token_dispatcher.deepep._DeepEPDispatcherImplNormal."
             "combine_a")


def combine_a(orig: Any, self: Any, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> tuple[torch.Tensor, Any]:
    """SGLang's JIT-DeepGEMM branch of the normal combine_a (module docstring, 1)."""
    from sglang.srt.layers import deep_gemm_wrapper
    from sglang.srt.layers.moe.token_dispatcher import deepep

    if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM:
        return orig(self, hidden_states, topk_ids, topk_weights)  # type: ignore[no-any-return]
    previous_event = deepep.Buffer.capture() if self.async_finish else None
    return hidden_states, previous_event


def contiguous_layout(topk_ids: torch.Tensor, num_experts: int,
                      align: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [R, K] local expert ids (-1: not this rank's) -> (src_row [M] int64, the
    received row each contiguous row holds (-1: padding), m_indices [M] int32 (-1: padding),
    output_index [R, K] int64, the contiguous row of (r, k) (-1 where topk_ids is -1)), with
    M = sum over experts of their row count rounded up to `align` (ep_scatter's layout)."""
    blocks = []
    out_idx = torch.full_like(topk_ids, -1, dtype=torch.int64)
    start = 0
    for e in range(num_experts):
        r, k = (topk_ids == e).nonzero(as_tuple=True)  # in received-row order
        n = r.numel()
        out_idx[r, k] = torch.arange(start, start + n)
        size = -(-n // align) * align
        blocks.append((r, e, size))
        start += size
    src = torch.full((start,), -1, dtype=torch.int64)
    m_indices = torch.full((start,), -1, dtype=torch.int32)
    at = 0
    for r, e, size in blocks:
        src[at : at + r.numel()] = r
        m_indices[at : at + r.numel()] = e
        at += size
    return src, m_indices, out_idx


def _take(x: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
    """x [R, ...] -> [M, ...]: row src[m] of x, zero where src[m] is -1."""
    out = x[src.clamp(min=0)]
    out.view(torch.uint8 if out.dtype == torch.float8_e4m3fn else out.dtype)[src < 0] = 0
    return out


def _experts_bf16(layer: Any, hidden: torch.Tensor, src: torch.Tensor,
                  m_indices: torch.Tensor) -> torch.Tensor:
    import deep_gemm

    w13, w2 = layer.w13_weight, layer.w2_weight  # [E, 2I, H], [E, H, I]
    a = _take(hidden, src)  # [M, H]
    gate_up = a.new_zeros((a.shape[0], w13.shape[1]))
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(a, w13, gate_up, m_indices)
    gate, up = gate_up.chunk(2, dim=-1)
    down = a.new_zeros((a.shape[0], w2.shape[1]))
    deep_gemm.m_grouped_bf16_gemm_nt_contiguous(F.silu(gate) * up, w2, down, m_indices)
    return down


def _experts_fp8(layer: Any, hidden: torch.Tensor, scale: torch.Tensor | None,
                 src: torch.Tensor, m_indices: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    import deep_gemm

    from sglang_cpu_shim.deep_ep_gloo import COUNTERS, quantize_fp8
    from sglang_cpu_shim.deepep import _fp8_weights

    COUNTERS["fp8_experts"] += 1
    w13, w13_s, w2, w2_s = _fp8_weights(layer)
    x, x_s = (hidden, scale) if scale is not None else quantize_fp8(hidden)  # [R, H], [R, H/128]
    a, a_s = _take(x, src), _take(x_s, src)
    gate_up = torch.zeros((a.shape[0], w13.shape[1]), dtype=dtype)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a, a_s), (w13, w13_s), gate_up, m_indices)
    gate, up = gate_up.float().chunk(2, dim=-1)
    act, act_s = quantize_fp8(F.silu(gate) * up)
    down = torch.zeros((a.shape[0], w2.shape[1]), dtype=dtype)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((act, act_s), (w2, w2_s), down, m_indices)
    return down


def experts_output(layer: Any, hidden: torch.Tensor, scale: torch.Tensor | None,
                   topk_ids: torch.Tensor, topk_weights: torch.Tensor, counts: list[int],
                   fp8: bool) -> torch.Tensor:
    """A normal dispatch's rows hidden [R, H] (fp8 with scale [R, H / 128], or the model's
    dtype), topk_ids [R, K] local ids (-1 = another rank's), topk_weights [R, K] float32,
    counts [E_local] -> [R, H] in the model's dtype: each row's weighted sum of its local
    experts' outputs (module docstring, 2)."""
    import deep_gemm

    num_experts = len(counts)  # E_local
    have = [int((topk_ids == e).any(-1).sum()) for e in range(num_experts)]
    if list(counts) != have:
        raise ValueError(f"cpu_shim: num_recv_tokens_per_expert {list(counts)} != the rows' "
                         f"expert ids {have}")
    dtype = layer.w13_weight.dtype
    src, m_indices, out_idx = contiguous_layout(
        topk_ids, num_experts, deep_gemm.get_mk_alignment_for_contiguous_layout())
    if fp8:
        down = _experts_fp8(layer, hidden, scale, src, m_indices, dtype)
    else:
        if scale is not None:  # dequantized: what DeepGEMM's fp8 kernels compute with
            hidden = (hidden.float() * scale.repeat_interleave(128, -1)).to(dtype)
        down = _experts_bf16(layer, hidden, src, m_indices)
    acc_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    acc = torch.zeros((hidden.shape[0], down.shape[1]), dtype=acc_dtype)  # [R, H]
    for k in range(topk_ids.shape[1]):  # ep_gather
        row = out_idx[:, k]
        part = topk_weights[:, k, None].to(acc_dtype) * down[row.clamp(min=0)].to(acc_dtype)
        acc = acc + torch.where((row >= 0)[:, None], part, 0.0)
    return acc.to(dtype)


def run(layer: Any, dispatch_output: Any, fp8: bool) -> Any:
    """A DeepEPNormalDispatchOutput -> DeepEPNormalCombineInput (`experts_output`)."""
    from sglang.srt.layers.moe.token_dispatcher import deepep

    hidden, scale, topk_ids, topk_weights, counts = dispatch_output
    out = experts_output(layer, hidden, scale, topk_ids, topk_weights, counts, fp8)
    return deepep.DeepEPNormalCombineInput(hidden_states=out, topk_ids=topk_ids,
                                           topk_weights=topk_weights)
