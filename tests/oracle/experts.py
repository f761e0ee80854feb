"""The oracle backend: pure torch experts, a shared expert, and a local dispatcher (EP = 1).

Every row is computed independently of the other rows in its batch (`rowwise`), so on CPU the
result of a token does not depend on how the batch was split into micro-batches: this is what
makes the executors' outputs bitwise comparable.

Legend: T tokens, K top-k, H hidden, I intermediate, E_local local experts, C capacity,
R routed rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from sglang_overlap.kernels import rowwise
from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.streams import StreamPair
from tests.oracle.packing import Placement, gather_back, place, weighted_sum


def swiglu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    """One dense SwiGLU MLP: x [M, H], w13 [2I, H], w2 [H, I] -> [M, H]."""
    return rowwise.linear(rowwise.silu_and_mul(rowwise.linear(x, w13)), w2)


class ReferenceExperts:
    """ExpertRunner over local experts w13 [E_local, 2I, H], w2 [E_local, H, I]."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        if w13.shape[0] != w2.shape[0] or w13.shape[1] != 2 * w2.shape[2]:
            raise ValueError(f"expert weights: want w13 [E, 2I, H] and w2 [E, H, I]; got "
                             f"w13={tuple(w13.shape)} w2={tuple(w2.shape)}")
        self.w13, self.w2 = w13, w2

    def run_low_latency(
        self, dispatched: LowLatencyDispatchOutput, *, signal: SignalContract | None = None
    ) -> torch.Tensor:
        x = dispatched.hidden  # [E_local, C, H]
        act = rowwise.silu_and_mul(rowwise.batched_linear(x, self.w13))  # [E_local, C, I]
        if signal is None:
            return rowwise.batched_linear(act, self.w2)  # [E_local, C, H]
        out = torch.empty_like(x)  # [E_local, C, H]
        signal.attach_producer(self._down_units(act, out, signal))
        return out

    def _down_units(
        self, act: torch.Tensor, out: torch.Tensor, signal: SignalContract
    ) -> Iterator[None]:
        """The down GEMM one SBO unit at a time, marking each unit once its rows are written."""
        for unit in range(signal.num_units):
            e, start, end = signal.unit_rows(unit)
            out[e, start:end] = rowwise.linear(act[e, start:end], self.w2[e])
            signal.mark(unit)
            yield

    def run_normal(self, dispatched: NormalDispatchOutput) -> torch.Tensor:
        idx = dispatched.row_expert.clamp(min=0).long()  # [R]; padding rows use expert 0
        act = rowwise.silu_and_mul(rowwise.gathered_linear(dispatched.hidden, self.w13, idx))
        return rowwise.gathered_linear(act, self.w2, idx)  # [R, H]


@dataclass
class _LocalPending:
    dispatched: LowLatencyDispatchOutput | NormalDispatchOutput | None
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor
    event: Any
    out: torch.Tensor | None = None


class LocalDispatcher:
    """Dispatcher for EP = 1: every expert is local; rows are only re-laid out.

    Rows are one per (token, k) pair, unrouted pairs (-1) dropped. Runs on the communication
    stream like a real dispatcher so the executors' stream handling is exercised on one GPU.
    """

    world_size = 1

    def __init__(
        self, num_experts: int, capacity: int, streams: StreamPair | None = None
    ) -> None:
        self.num_experts = num_experts
        self.capacity = capacity
        self.streams = streams or StreamPair("cpu")

    def dispatch_send(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        layout: Layout,
        slot: int,
    ) -> _LocalPending:
        t, k = topk_ids.shape
        e = self.num_experts
        with self.streams.comm("dispatch_send") as done:
            self.streams.hand_over(hidden, topk_ids)
            h = hidden.shape[1]
            rows = hidden[:, None, :].expand(t, k, h).reshape(t * k, h)  # [T*K, H]
            flat_ids = topk_ids.reshape(t * k)  # [T*K]
            expert = torch.where(flat_ids >= 0, flat_ids, e)
            expected_m = (t * k + e) // e
            out = place(rows, expert, num_local_experts=e, capacity=self.capacity,
                       layout=layout, expected_m=expected_m,
                       handle_extra=(topk_ids, topk_weights))
        return _LocalPending(out, topk_ids, topk_weights, done[0])

    def dispatch_recv(
        self, pending: _LocalPending
    ) -> LowLatencyDispatchOutput | NormalDispatchOutput:
        self.streams.wait(pending.event)
        d = pending.dispatched
        assert d is not None
        placement = d.handle[0]
        extra = (d.masked_m,) if isinstance(d, LowLatencyDispatchOutput) else (
            d.row_expert, d.num_tokens_per_expert)
        self.streams.hand_back(d.hidden, placement.position, *extra)
        return d

    def combine_send(
        self,
        expert_out: torch.Tensor,
        dispatched: LowLatencyDispatchOutput | NormalDispatchOutput,
        *,
        signal: SignalContract | None = None,
    ) -> _LocalPending:
        placement, extra = dispatched.handle
        assert isinstance(placement, Placement)
        topk_ids, topk_weights = extra
        with self.streams.comm("combine_send") as done:
            self.streams.hand_over(expert_out)
            pair_out = gather_back(expert_out, placement, signal)  # [T*K, H]
            out = weighted_sum(pair_out, topk_ids, topk_weights)  # [T, H]
        return _LocalPending(None, topk_ids, topk_weights, done[0], out)

    def combine_recv(self, pending: _LocalPending) -> torch.Tensor:
        self.streams.wait(pending.event)
        assert pending.out is not None
        self.streams.hand_back(pending.out)
        return pending.out
