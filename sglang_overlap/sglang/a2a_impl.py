"""The torch_a2a dispatcher impl and expert runner (imported only when torch_a2a is in use).

See `a2a_backend.py` for how SGLang is routed here.

Legend: T tokens of this rank, K top-k, H hidden, E_local local experts, C LL capacity.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F

from sglang_overlap.kernels.a2a import AllToAllDispatcher
from sglang_overlap.kernels.contracts import (
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.streams import StreamPair
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from sglang_overlap.sglang import runtime

# DeepEP sizes its low-latency buffer by this; the all-to-all dispatcher uses it as capacity.
MAX_DISPATCH_TOKENS_ENV = "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"


class TorchA2AImpl:
    """Stands in for `_DeepEPDispatcherImpl{Normal,LowLatency}` (same calls, same outputs)."""

    def __init__(self, *, group: Any, num_experts: int, num_local_experts: int,
                 low_latency: bool, **_: Any) -> None:
        cuda = torch.cuda.is_available()
        self.layout = "low_latency" if low_latency else "normal"
        self.engine = AllToAllDispatcher(
            num_experts, int(os.environ.get(MAX_DISPATCH_TOKENS_ENV, "128")), group=group,
            streams=StreamPair("cuda" if cuda else "cpu"))
        if self.engine.num_local_experts != num_local_experts:
            raise ValueError(f"torch_a2a: {num_experts} experts over {self.engine.world_size} "
                             f"ranks is not SGLang's {num_local_experts} local experts")
        self.quant_config: Any = None
        self.overlap_args: Any = None
        self.meta_overlap_args: Any = None
        self.last: tuple[Any, Any] | None = None  # (SGLang's dispatch output, the engine's)
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
        pending = self.engine.dispatch_send(hidden_states, ids, weights, layout=self.layout,
                                            slot=0)
        return pending, topk_output.topk_ids, topk_output.topk_weights

    def dispatch_b(self, pending: Any, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> Any:
        from sglang.srt.layers.moe.token_dispatcher import deepep

        d = self.engine.dispatch_recv(pending)
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
        pending = self.engine.combine_send(hidden_states, dispatched, signal=signal)
        if signal is not None:
            signal.finish()
        return (pending,)

    def combine_b(self, pending: Any) -> torch.Tensor:
        return self.engine.combine_recv(pending)


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


class ValidRowsExperts:
    """The local experts of one SGLang layer, computed on valid rows only.

    w13 [E_local, 2I, H] (gate rows first, SGLang's layout) and w2 [E_local, H, I]. Unlike the
    engine's batch-independent reference runner this uses the library matmuls (SGLang's other
    layers do too) and skips the empty capacity rows of the low-latency layout: it reads the
    per-expert counts on the host, free on CPU, one sync on GPU (where DeepEP is the fast path).
    """

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        self.w13, self.w2 = w13, w2

    def _mlp(self, x: torch.Tensor, e: int) -> torch.Tensor:  # [M, H] -> [M, H]
        gate, up = F.linear(x, self.w13[e]).chunk(2, dim=-1)  # [M, I] each
        return F.linear(F.silu(gate) * up, self.w2[e])

    def run_low_latency(self, d: LowLatencyDispatchOutput, *,
                        signal: SignalContract | None = None) -> torch.Tensor:
        counts = d.masked_m.tolist()  # the host sync (see the class docstring)
        out = torch.zeros_like(d.hidden)  # [E_local, C, H]; rows past masked_m stay 0
        units = self._produce(d.hidden, out, counts, signal)
        if signal is None:
            for _ in units:
                pass
        else:
            signal.attach_producer(units)
        return out

    def _produce(self, hidden: torch.Tensor, out: torch.Tensor, counts: list[int],
                 signal: SignalContract | None) -> Iterator[None]:
        """One expert at a time; with SBO, marks that expert's units once its rows are final."""
        for e, m in enumerate(counts):
            if m:
                out[e, :m] = self._mlp(hidden[e, :m], e)
            if signal is not None:
                for unit in signal.units_of_expert(e):
                    signal.mark(unit)
            yield

    def run_normal(self, d: NormalDispatchOutput) -> torch.Tensor:
        out = torch.zeros_like(d.hidden)  # [R, H]: rows grouped by expert, padding rows last
        start = 0
        for e, m in enumerate(d.num_tokens_per_expert.tolist()):
            if m:
                out[start : start + m] = self._mlp(d.hidden[start : start + m], e)
            start += m
        return out


def experts_of(moe: Any) -> ValidRowsExperts:
    runner = getattr(moe, "_sglang_overlap_experts", None)
    if runner is None:
        runner = ValidRowsExperts(moe.w13_weight, moe.w2_weight)
        moe._sglang_overlap_experts = runner
    return runner


def sbo_signal(d: LowLatencyDispatchOutput) -> SignalContract | None:
    if not runtime.sbo_active():
        return None
    e_local, capacity, hidden = d.hidden.shape
    s = runtime.settings()
    layout = plan_sbo_layout(
        num_local_experts=e_local, capacity=capacity, block_m=64, block_n=128, hidden=hidden,
        num_sms=runtime.num_sms(), comm_num_sms=runtime.combine_num_sms(),
        granularity="expert" if s.sbo_signal_granularity == "expert" else "block")
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
