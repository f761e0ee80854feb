"""Hook on `sglang.srt.batch_overlap.operations_strategy` (CPU only): the DeepSeek prefill TBO
strategy asks CUDA for its SM count; without CUDA the same operations run with no SM budget."""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.sglang.hooks import HookSpec

PREFILL_STRATEGY = (
    "sglang.srt.batch_overlap.operations_strategy._compute_moe_deepseek_blog_prefill")


def prefill_strategy(orig: Any, layer: Any) -> Any:
    """Upstream's DeepSeek prefill TBO operations; without CUDA no SM budget for DeepGEMM."""
    import torch

    if torch.cuda.is_available():
        return orig(layer)
    from sglang.srt.batch_overlap import operations
    from sglang.srt.batch_overlap.operations_strategy import OperationsStrategy

    mlp = layer.mlp
    return OperationsStrategy(
        deep_gemm_num_sms=None,
        tbo_delta_stages=0,
        operations=[
            layer.op_comm_prepare_attn, layer.self_attn.op_prepare, layer.self_attn.op_core,
            layer.op_comm_prepare_mlp, mlp.op_gate, mlp.op_select_experts, mlp.op_dispatch_a,
            operations.YieldOperation(),
            mlp.op_dispatch_b, mlp.op_experts, mlp.op_combine_a,
            operations.YieldOperation(),
            mlp.op_shared_experts, mlp.op_combine_b, mlp.op_output,
            layer.op_comm_postprocess_layer,
        ],
    )


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(PREFILL_STRATEGY, prefill_strategy, "around",
             "CPU: the prefill TBO strategy asks CUDA for SMs", "src:fdbf3fdde058",
             feature=Feature.TBO, cpu_only=True),
)
