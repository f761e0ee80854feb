"""torch.distributed all-to-all dispatcher: expert parallelism on any number of ranks.

A real EP path when DeepEP is absent (gloo on CPU, NCCL on GPU), and the one the CPU tests run
with 2 and 4 processes. Rank r owns global experts [r*E_local, (r+1)*E_local).

Dispatch send (per micro-batch):
  1. one row per routed (token, k) pair, ordered by destination rank (stable: within a rank,
     in (token, k) order); unrouted pairs (-1) are not sent;
  2. `_exchange_counts`: rows per destination, exchanged with a blocking all_to_all and read on
     the host - THE one device sync of this backend (all_to_all needs host split sizes);
  3. the rows and their local expert ids go out with two all_to_all_single calls, async
     (gloo: a background thread; NCCL: the communication stream, joined by an event).
Dispatch receive: wait, then lay the rows out (`layouts.pack`): low latency = [E_local, C, H]
plus masked counts; normal = rows grouped by expert plus per-expert counts.
Combine send: expert outputs back to received order (`layouts.unpack`, unit by unit behind the
SBO signal when given) and the reverse all_to_all. Combine receive: the rows land back on their
(token, k) pair and are summed in k order (`layouts.weighted_sum`), so a token's result does not
depend on the micro-batch split or on which rank computed which k.

Legend: T tokens, K top-k, P = T*K pairs, H hidden, W world size, E_local local experts,
C = max_tokens_per_rank * W capacity, S rows sent, V rows received.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.layouts import PackInfo, pack, unpack, weighted_sum
from sglang_overlap.kernels.streams import StreamPair


@dataclass
class _Route:
    """Host split sizes and the sent pairs of one micro-batch (the combine handle)."""

    sent: torch.Tensor  # [S] int64: pair index t*K + k of each sent row
    send_splits: list[int]  # [W] rows to each rank
    recv_splits: list[int]  # [W] rows from each rank
    topk_ids: torch.Tensor  # [T, K] int64
    topk_weights: torch.Tensor  # [T, K] float32


@dataclass
class _Pending:
    works: list[Any]
    event: Any
    route: _Route
    rows: torch.Tensor  # dispatch: [V, H] received rows; combine: [S, H] returned rows
    experts: torch.Tensor | None = None  # dispatch: [V] int64 local expert of each row
    layout: Layout = "normal"
    keep: tuple[torch.Tensor, ...] = ()  # send buffers an async transfer still reads


class AllToAllDispatcher:
    """Dispatcher over a torch.distributed process group (all ranks call it in lockstep)."""

    def __init__(
        self,
        num_experts: int,
        max_tokens_per_rank: int,
        *,
        group: dist.ProcessGroup | None = None,
        streams: StreamPair | None = None,
    ) -> None:
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        if num_experts % self.world_size:
            raise ValueError(f"all-to-all dispatcher: num_experts={num_experts} must be a "
                             f"multiple of the world size {self.world_size}")
        self.num_experts = num_experts
        self.num_local_experts = num_experts // self.world_size
        self.capacity = max_tokens_per_rank * self.world_size
        self.streams = streams or StreamPair("cpu")
        # gloo overlaps through its worker thread; NCCL through the communication stream.
        self._async = not self.streams.cuda

    def _exchange_counts(self, send_counts: torch.Tensor) -> tuple[list[int], list[int]]:
        """[W] int64 rows to each rank -> (send_splits, recv_splits) on the host. Blocking."""
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        both = torch.cat([send_counts, recv_counts]).tolist()  # the device sync
        w = self.world_size
        return both[:w], both[w:]

    def _a2a(self, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int],
             in_splits: list[int]) -> Any:
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group,
                                      async_op=self._async)

    def dispatch_send(
        self,
        hidden: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        *,
        layout: Layout,
        slot: int,
    ) -> _Pending:
        w, e_loc, k = self.world_size, self.num_local_experts, topk_ids.shape[1]
        flat_ids = topk_ids.reshape(-1)  # [P]
        dest = torch.where(flat_ids >= 0, flat_ids // e_loc, w)  # [P]; W = not sent
        perm = torch.sort(dest, stable=True).indices  # [P]
        counts = torch.zeros(w + 1, dtype=torch.int64, device=dest.device)
        counts.scatter_add_(0, dest, torch.ones_like(dest))
        send_splits, recv_splits = self._exchange_counts(counts[:w])
        sent = perm[: sum(send_splits)]  # [S]
        n_recv = sum(recv_splits)
        route = _Route(sent, send_splits, recv_splits, topk_ids, topk_weights)
        recv_rows = hidden.new_empty((n_recv, hidden.shape[1]))  # [V, H]
        recv_experts = flat_ids.new_empty((n_recv,))  # [V]
        with self.streams.comm("dispatch_send") as done:
            self.streams.hand_over(hidden, flat_ids, sent, recv_rows, recv_experts)
            send_rows = hidden[sent // k]  # [S, H]
            send_experts = flat_ids[sent] % e_loc  # [S]
            works = [
                self._a2a(recv_rows, send_rows, recv_splits, send_splits),
                self._a2a(recv_experts, send_experts, recv_splits, send_splits),
            ]
        return _Pending(works, done[0], route, recv_rows, recv_experts, layout,
                        (send_rows, send_experts))

    def _finish(self, pending: _Pending) -> None:
        for work in pending.works:
            if work is not None:
                work.wait()
        self.streams.wait(pending.event)

    def dispatch_recv(
        self, pending: _Pending
    ) -> LowLatencyDispatchOutput | NormalDispatchOutput:
        self._finish(pending)
        assert pending.experts is not None
        e_loc = self.num_local_experts
        return pack(pending.rows, pending.experts, num_local_experts=e_loc,
                    capacity=self.capacity, layout=pending.layout,
                    expected_m=(pending.rows.shape[0] + e_loc) // e_loc,
                    handle_extra=pending.route)

    def combine_send(
        self,
        expert_out: torch.Tensor,
        dispatched: LowLatencyDispatchOutput | NormalDispatchOutput,
        *,
        signal: SignalContract | None = None,
    ) -> _Pending:
        info, route = dispatched.handle
        assert isinstance(info, PackInfo) and isinstance(route, _Route)
        returned = expert_out.new_empty((len(route.sent), expert_out.shape[-1]))  # [S, H]
        with self.streams.comm("combine_send") as done:
            self.streams.hand_over(expert_out, returned)
            back = unpack(expert_out, info, signal)  # [V, H] in received order
            works = [self._a2a(returned, back, route.send_splits, route.recv_splits)]
        return _Pending(works, done[0], route, returned, keep=(back,))

    def combine_recv(self, pending: _Pending) -> torch.Tensor:
        self._finish(pending)
        route = pending.route
        t, k = route.topk_ids.shape
        pair_out = pending.rows.new_zeros((t * k, pending.rows.shape[1]))  # [P, H]
        pair_out[route.sent] = pending.rows
        return weighted_sum(pair_out, route.topk_ids, route.topk_weights)  # [T, H]
