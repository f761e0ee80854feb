"""Packing received rows into DeepEP's two layouts, unpacking expert outputs, the weighted sum.

Shared by the torch dispatchers (`a2a.AllToAllDispatcher` and the test oracle's EP = 1 local
dispatcher). All of it is sync-free: sizes come from host ints the caller already has, never
from `.item()`.

Legend: R received rows (one per routed (token, k) pair), H hidden, E_local local experts,
C capacity (rows per local expert, low-latency layout), T tokens, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_overlap.kernels import rowwise
from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)


@dataclass(frozen=True)
class PackInfo:
    """How packed rows map back to received rows (the torch dispatchers' combine handle)."""

    layout: Layout
    num_rows: int  # R
    order: torch.Tensor  # [R] int64: packed position p holds received row order[p]
    flat_index: torch.Tensor  # [R] int64: LL only, e*C + c of packed row p (E_local*C = dropped)
    capacity: int


def pack(
    rows: torch.Tensor,
    expert: torch.Tensor,
    *,
    num_local_experts: int,
    capacity: int,
    layout: Layout,
    expected_m: int,
    handle_extra: object = None,
) -> LowLatencyDispatchOutput | NormalDispatchOutput:
    """rows [R, H], expert [R] int64 local expert, or num_local_experts = padding (dropped).

    Rows keep their received order inside each expert (a stable sort), so row c of expert e is
    the c-th row received for e. The handle is (PackInfo, handle_extra).
    """
    e_local = num_local_experts
    order = torch.sort(expert, stable=True).indices  # [R]
    sorted_expert = expert[order]  # [R]
    counts = torch.zeros(e_local + 1, dtype=torch.int64, device=rows.device)
    counts.scatter_add_(0, expert, torch.ones_like(expert))
    counts_local = counts[:e_local].to(torch.int32)  # [E_local]
    if layout == "normal":
        info = PackInfo("normal", rows.shape[0], order, order[:0], capacity)
        row_expert = torch.where(sorted_expert < e_local, sorted_expert, -1).to(torch.int32)
        return NormalDispatchOutput(rows[order], row_expert, counts_local, (info, handle_extra))
    starts = torch.cumsum(counts, 0) - counts  # [E_local + 1]
    slot = torch.arange(rows.shape[0], device=rows.device) - starts[sorted_expert]  # [R]
    dropped = e_local * capacity
    flat_index = torch.where(sorted_expert < e_local, sorted_expert * capacity + slot, dropped)
    # A row past capacity would land in the next expert: make it fail loudly instead
    # (DeepEP has the same contract: at most num_max_dispatch_tokens_per_rank tokens per rank).
    torch._assert_async(
        (slot < capacity).logical_or(sorted_expert == e_local).all(),
        f"low-latency dispatch: an expert received more than capacity={capacity} rows",
    )
    flat = rows.new_zeros((dropped + 1, rows.shape[1]))  # [E_local*C + 1, H], last = drop row
    flat[flat_index] = rows[order]
    hidden = flat[:dropped].view(e_local, capacity, rows.shape[1])  # [E_local, C, H]
    info = PackInfo("low_latency", rows.shape[0], order, flat_index, capacity)
    return LowLatencyDispatchOutput(hidden, counts_local, expected_m, (info, handle_extra))


def unpack(
    expert_out: torch.Tensor, info: PackInfo, signal: SignalContract | None = None
) -> torch.Tensor:
    """Expert outputs back to received order: [E_local, C, H] or [R, H] -> [R, H].

    Dropped/padding rows come back as zeros. With `signal` (low latency), the rows of each unit
    are read only after `signal.wait(unit)`, in unit order.
    """
    r, h = info.num_rows, expert_out.shape[-1]
    out = expert_out.new_zeros((r + 1, h))  # last row takes every write of a dropped row
    if info.layout == "normal":
        out[info.order] = expert_out
        return out[:r]
    e_local, cap = expert_out.shape[0], info.capacity
    # received position of each (e, c) cell; cells nobody filled point at the drop row
    cell_to_row = torch.full((e_local * cap + 1,), r, dtype=torch.int64, device=out.device)
    cell_to_row[info.flat_index] = info.order
    if signal is None:
        out[cell_to_row[: e_local * cap]] = expert_out.reshape(e_local * cap, h)
        return out[:r]
    for unit in range(signal.num_units):
        e, start, end = signal.unit_rows(unit)
        signal.wait(unit)
        out[cell_to_row[e * cap + start : e * cap + end]] = expert_out[e, start:end]
    return out[:r]


def weighted_sum(
    pair_out: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> torch.Tensor:
    """pair_out [T*K, H] (row t*K + k), topk_ids [T, K] int64 (-1 = unrouted), topk_weights
    [T, K] float32 -> [T, H] in pair_out's dtype, summed in float32 (float64 for float64)
    in k order."""
    t, k = topk_ids.shape
    acc_dtype = rowwise.acc_dtype(pair_out.dtype)
    vals = pair_out.view(t, k, pair_out.shape[-1]).to(acc_dtype)  # [T, K, H]
    routed = (topk_ids >= 0)[:, :, None]  # [T, K, 1]
    w = topk_weights.to(acc_dtype)[:, :, None]  # [T, K, 1]
    acc = vals.new_zeros((t, vals.shape[-1]))
    for j in range(k):
        # `where`, not a zero weight: an unrouted slot's row may hold anything, even NaN
        acc = acc + torch.where(routed[:, j], w[:, j] * vals[:, j], 0.0)
    return acc.to(pair_out.dtype)
