"""TBO execution and automatic gating inside SGLang, plus what a2a MoE needs on a CPU.

* `execute_overlapped_operations` (REPLACE): SGLang's per-layer stage operations of the two
  child batches run in the order of `planning.interleave.interleaved_order` - the engine's TBO
  executor order - through SGLang's own stage executor (which enters each child's attention
  context). While it runs, `runtime.in_tbo()` is true (SBO does not apply inside TBO).
* `_update_gather_batch` (BEFORE), with --overlap-gating auto: after SGLang's DP sync every rank
  holds the same global token counts and TBO verdict; the `planning.gating.Gate` turns TBO off
  for the step when another mode (or none) is predicted faster. Same inputs on every rank, same
  decision: collectives never mismatch.
* CPU only: torch_native attention has no `get_cpu_graph_seq_len_fill_value` (SGLang asks for it
  when it pads a batch for the attention-TP scatter, which every a2a backend needs), and the
  DeepSeek prefill TBO strategy asks CUDA for its SM count.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from sglang_overlap import stats
from sglang_overlap.planning.interleave import interleaved_order
from sglang_overlap.sglang import runtime
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

OPERATIONS = "sglang.srt.batch_overlap.operations"
EXECUTE_OVERLAPPED = f"{OPERATIONS}.execute_overlapped_operations"
UPDATE_GATHER_BATCH = "sglang.srt.managers.scheduler_components.dp_attn._update_gather_batch"
PAD_INPUTS = "sglang.srt.model_executor.forward_batch_info.ForwardBatch._pad_inputs_to_size"
PREFILL_STRATEGY = (
    "sglang.srt.batch_overlap.operations_strategy._compute_moe_deepseek_blog_prefill")


def execute_overlapped_operations(inputs_arr: Any, operations_arr: Any,
                                  delta_stages: Any) -> list[Any]:
    from sglang.srt.batch_overlap import operations as ops

    (inputs_a, inputs_b), (operations_a, operations_b) = inputs_arr, operations_arr
    delta_a, delta_b = delta_stages
    if delta_a != 0:
        raise ValueError(
            f"sglang-overlap TBO: micro-batch A must lead (delta_stages={delta_stages})")
    ctx_a, ctx_b = ops._resolve_tbo_child_contexts()
    executors = (
        ops._StageExecutor("a", ops._convert_operations_to_stages(operations_a), inputs=inputs_a,
                           child_ctx=ctx_a),
        ops._StageExecutor("b", ops._convert_operations_to_stages(operations_b), inputs=inputs_b,
                           child_ctx=ctx_b),
    )
    if executors[0].num_stages != executors[1].num_stages:
        raise ValueError(f"sglang-overlap TBO: the children have {executors[0].num_stages} and "
                         f"{executors[1].num_stages} stages")
    with runtime.tbo_running():
        for which, _ in interleaved_order(executors[0].num_stages, delta_b):
            executors[which].next()
    if not (executors[0].done and executors[1].done):
        raise RuntimeError("sglang-overlap TBO: a child batch did not run all its stages")
    stats.count("tbo_executor")
    return [executors[0].output, executors[1].output]


@functools.cache
def _gate() -> Any:
    """This process's gate, built on first use (its hysteresis state lives for the process)."""
    return runtime.build_gate()


_last_mode: dict[str, str] = {}


def gate_step(batch: Any, mlp_sync_info: Any, *args: Any, **kwargs: Any) -> None:
    """BEFORE `_update_gather_batch`: with --overlap-gating auto, keep TBO for this step only if
    the gate picks it. Reads only what every rank shares after the DP all-gather."""
    s = runtime.settings()
    if s.overlap_gating != "auto" or kwargs.get("skip_global_metadata"):
        return
    if mlp_sync_info.tbo_split_seq_index is None and not s.enable_single_batch_overlap:
        return
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    mode = mlp_sync_info.global_forward_mode
    extend = mode is not None and ForwardMode(mode).is_extend() and not (
        ForwardMode(mode).is_target_verify())
    tokens = list(mlp_sync_info.global_num_tokens or [mlp_sync_info.num_tokens])
    phase = "prefill" if extend else "decode"
    decision = _gate().decide(phase, tokens)
    runtime.set_step_mode(decision.mode)
    stats.count(f"gate_{decision.mode}")
    if _last_mode.get(phase) != decision.mode:
        _last_mode[phase] = decision.mode
        logger.info("sglang-overlap gate: %s -> %s (%s)", phase, decision.mode, decision.reason)
    else:
        logger.debug("sglang-overlap gate: %s", decision.reason)
    if decision.mode not in ("tbo", "two_chunk"):
        mlp_sync_info.tbo_split_seq_index = None
        mlp_sync_info.global_forward_mode = None


class _FillValueBackend:
    """An attention backend seen through, plus the CPU padding fill value SGLang asks for."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    @staticmethod
    def get_cpu_graph_seq_len_fill_value() -> int:
        return 1  # what SGLang's CPU backends (intel_amx) use: a padded sequence of length 1


class _RunnerView:
    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.attn_backend = _FillValueBackend(runner.attn_backend)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)


def pad_inputs_to_size(orig: Any, self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> Any:
    if not hasattr(model_runner.attn_backend, "get_cpu_graph_seq_len_fill_value"):
        model_runner = _RunnerView(model_runner)
    return orig(self, model_runner, *args, **kwargs)


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


MOE_HOOKS: tuple[HookSpec, ...] = (
    HookSpec(EXECUTE_OVERLAPPED, execute_overlapped_operations, "replace",
             "TBO stages run in the plugin's interleaved order"),
    HookSpec(UPDATE_GATHER_BATCH, gate_step, "before",
             "--overlap-gating auto: the cost model decides TBO per step, same on every rank"),
    HookSpec(PAD_INPUTS, pad_inputs_to_size, "around",
             "CPU: torch_native attention lacks the padding fill value a2a batches need"),
    HookSpec(PREFILL_STRATEGY, prefill_strategy, "around",
             "CPU: the prefill TBO strategy asks CUDA for SMs"),
)
