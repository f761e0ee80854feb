"""`--moe-a2a-backend torch_a2a`: SGLang's DeepEP dispatcher impls, on torch.distributed.

For machines without DeepEP (a CPU box, a GPU without NVSHMEM): the MoE layers dispatch and
combine with the kernels' `AllToAllDispatcher` over the tensor-parallel group (gloo on CPU, NCCL
on GPU), and the routed experts run per local expert on their valid rows (`kernels.experts`).
Everything else is SGLang's DeepEP machinery, unchanged: tokens scattered over the attention-TP
ranks before the MoE and gathered after, the MLP sync that decides TBO, the TBO child batches and
stage operations, the SBO dispatch hook. The hooks routing SGLang here, in `upstream/`:
`server_args.py` (resolution to deepep), `token_dispatcher_deepep.py` (the impls),
`ep_moe_layer.py` (the experts).

Legend: T tokens of this rank, K top-k, H hidden, E_local local experts, C LL capacity.
"""

from __future__ import annotations

from typing import Any

import torch

from sglang_overlap.kernels.a2a import AllToAllDispatcher
from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.down_gemm import signal_layout
from sglang_overlap.kernels.experts import TorchExperts
from sglang_overlap.kernels.streams import StreamPair
from sglang_overlap.sglang import state


class TorchA2AImpl:
    """Stands in for `_DeepEPDispatcherImpl{Normal,LowLatency}` (same calls, same outputs)."""

    def __init__(self, *, group: Any, num_experts: int, num_local_experts: int,
                 low_latency: bool, **_: Any) -> None:
        from sglang.srt.environ import envs

        cuda = torch.cuda.is_available()
        self.layout: Layout = "low_latency" if low_latency else "normal"
        self.a2a = AllToAllDispatcher(
            num_experts, envs.SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK.get(), group=group,
            streams=StreamPair("cuda" if cuda else "cpu"))
        if self.a2a.num_local_experts != num_local_experts:
            raise ValueError(f"torch_a2a: {num_experts} experts over {self.a2a.world_size} "
                             f"ranks is not SGLang's {num_local_experts} local experts")
        self.quant_config: Any = None
        self.overlap_args: Any = None
        self.meta_overlap_args: Any = None
        self.last: tuple[Any, Any] | None = None  # (SGLang's dispatch output, the a2a's)
        self.signal: SignalContract | None = None  # SBO: set by run_moe_core for combine_a

    def set_quant_config(self, quant_config: Any) -> None:
        self.quant_config = quant_config

    def set_overlap_args(self, combine_overlap_args: Any, meta_overlap_args: Any) -> None:
        self.overlap_args, self.meta_overlap_args = combine_overlap_args, meta_overlap_args

    def clear_overlap_args(self) -> None:
        self.overlap_args = self.meta_overlap_args = None

    def dispatch_a(self, hidden_states: torch.Tensor, topk_output: Any) -> tuple[Any, ...]:
        ids = topk_output.topk_ids.long()  # [T, K] int64, -1 = unrouted
        weights = topk_output.topk_weights.float()  # [T, K] float32
        pending = self.a2a.dispatch_send(hidden_states, ids, weights, layout=self.layout,
                                            slot=0)
        return pending, topk_output.topk_ids, topk_output.topk_weights

    def dispatch_b(self, pending: Any, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        from sglang.srt.layers.moe.token_dispatcher import deepep

        d = self.a2a.dispatch_recv(pending)
        if isinstance(d, LowLatencyDispatchOutput):
            out = deepep.DeepEPLLDispatchOutput(d.hidden, None, topk_ids, topk_weights,
                                                d.masked_m, d.expected_m)
        else:  # rows grouped by local expert; per-row local expert id as a top-1 "topk"
            out = deepep.DeepEPNormalDispatchOutput(
                d.hidden, None, d.row_expert[:, None], d.row_expert.new_ones(
                    (d.hidden.shape[0], 1), dtype=torch.float32),
                d.num_tokens_per_expert.tolist())  # host list: SGLang's field type
        self.last = (out, d)
        return out

    def combine_a(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor) -> tuple[Any]:
        assert self.last is not None, "torch_a2a: combine without a dispatch"
        _, dispatched = self.last
        self.last = None
        signal, self.signal = self.signal, None
        pending = self.a2a.combine_send(hidden_states, dispatched, signal=signal)
        if signal is not None:
            signal.finish()
        return (pending,)

    def combine_b(self, pending: Any) -> torch.Tensor:
        return self.a2a.combine_recv(pending)


def _impl_class(low_latency: bool) -> type:
    class Impl(TorchA2AImpl):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(low_latency=low_latency, **kwargs)

    Impl.__name__ = Impl.__qualname__ = f"TorchA2AImpl{'LowLatency' if low_latency else 'Normal'}"
    return Impl


LL_IMPL, NORMAL_IMPL = _impl_class(True), _impl_class(False)


def find_impl(moe: Any, dispatch_output: Any) -> TorchA2AImpl | None:
    for inner in getattr(moe.dispatcher, "_inners", ()):
        for name in ("_low_latency_dispatcher", "_normal_dispatcher"):
            impl = getattr(inner, name, None)
            if isinstance(impl, TorchA2AImpl) and impl.last is not None and (
                    impl.last[0] is dispatch_output):
                return impl
    return None


def experts_of(moe: Any) -> TorchExperts:
    runner = getattr(moe, "_sglang_overlap_experts", None)
    if runner is None:
        runner = TorchExperts(moe.w13_weight, moe.w2_weight)
        moe._sglang_overlap_experts = runner
    return runner


def sbo_signal(d: LowLatencyDispatchOutput) -> SignalContract | None:
    if not state.sbo_active():
        return None
    e_local, capacity, hidden = d.hidden.shape
    layout = signal_layout(
        num_local_experts=e_local, capacity=capacity, hidden=hidden, expected_m=d.expected_m,
        num_sms=state.num_sms(), comm_num_sms=state.combine_num_sms(),
        granularity="expert" if state.settings().sbo_signal_granularity == "expert" else "block")
    return SignalContract(layout, d.hidden.device)


def run_local_experts(moe: Any, impl: TorchA2AImpl, dispatch_output: Any) -> tuple[Any, bool]:
    """(SGLang's combine input, whether SBO signals were produced) for `moe`'s local experts."""
    from sglang.srt.layers.moe.token_dispatcher import deepep

    assert impl.last is not None
    _, d = impl.last
    runner = experts_of(moe)
    if isinstance(d, LowLatencyDispatchOutput):
        impl.signal = sbo_signal(d)
        out = runner.run_low_latency(d, signal=impl.signal)  # [E_local, C, H]
        wrap: Any = deepep.DeepEPLLCombineInput
    else:
        out = runner.run_normal(d)  # [R, H]
        wrap = deepep.DeepEPNormalCombineInput
    combine_input = wrap(hidden_states=out, topk_ids=dispatch_output.topk_ids,
                         topk_weights=dispatch_output.topk_weights)
    return combine_input, impl.signal is not None
