"""The oracle's own row placement: received rows into DeepEP's two layouts and back, and the
weighted sum over top-k. Written apart from the served `kernels/layouts.py` (a cumulative count
per expert instead of a stable sort) so the oracle does not share the code it checks.

Sync-free like the served path: sizes come from host ints, never from `.item()`.

Legend: R received rows (one per routed (token, k) pair), H hidden, E_local local experts,
C capacity (rows per local expert, low-latency layout), T tokens, K top-k.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_overlap.kernels.contracts import (
    Layout,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
    SignalContract,
)


@dataclass(frozen=True)
class Placement:
    """Where each received row went (the oracle dispatcher's combine handle)."""

    layout: Layout
    position: torch.Tensor  # [R] int64: LL e*C + c (E_local*C = dropped); normal: packed row
    capacity: int


def place(rows: torch.Tensor, expert: torch.Tensor, *, num_local_experts: int, capacity: int,
          layout: Layout, expected_m: int,
          handle_extra: object = None) -> LowLatencyDispatchOutput | NormalDispatchOutput:
    """rows [R, H]; expert [R] int64 local expert, num_local_experts = unrouted (dropped).

    Row c of expert e is the c-th row received for e. The handle is (Placement, handle_extra).
    """
    e_local, r = num_local_experts, rows.shape[0]
    onehot = torch.nn.functional.one_hot(expert, e_local + 1)  # [R, E_local + 1]
    seen_before = onehot.cumsum(0) - onehot  # [R, E_local + 1]: earlier rows of each expert
    slot = seen_before.gather(1, expert[:, None])[:, 0]  # [R]
    counts = onehot.sum(0)  # [E_local + 1]
    routed = expert < e_local
    recv_count = counts[:e_local].to(torch.int32)  # [E_local]
    if layout == "normal":
        first = torch.cumsum(counts, 0) - counts  # [E_local + 1]: unrouted rows go last
        position = first[expert] + slot  # [R]
        hidden = rows.new_empty(rows.shape)
        hidden[position] = rows
        row_expert = torch.full((r,), -1, dtype=torch.int32, device=rows.device)
        row_expert[position] = torch.where(routed, expert, -1).to(torch.int32)
        return NormalDispatchOutput(hidden, row_expert, recv_count,
                                    (Placement("normal", position, capacity), handle_extra))
    torch._assert_async(
        (slot < capacity).logical_or(~routed).all(),
        f"low-latency dispatch: an expert received more than capacity={capacity} rows")
    dropped = e_local * capacity
    position = torch.where(routed, expert * capacity + slot, dropped)  # [R]
    cells = rows.new_zeros((dropped + 1, rows.shape[1]))  # [E_local*C + 1, H]
    cells[position] = rows
    hidden = cells[:dropped].view(e_local, capacity, rows.shape[1])  # [E_local, C, H]
    return LowLatencyDispatchOutput(hidden, recv_count, expected_m,
                                    (Placement("low_latency", position, capacity), handle_extra))


def gather_back(expert_out: torch.Tensor, placement: Placement,
                signal: SignalContract | None = None) -> torch.Tensor:
    """[E_local, C, H] or [R, H] expert outputs -> [R, H] in received order; dropped rows 0.

    With `signal` (low latency), each unit's cells are read only after `signal.wait(unit)`.
    """
    h = expert_out.shape[-1]
    if placement.layout == "normal":
        return expert_out[placement.position]
    cells = expert_out.reshape(-1, h)  # [E_local*C, H], a view: the producer's writes show
    dropped = placement.position == cells.shape[0]
    index = placement.position.clamp(max=cells.shape[0] - 1)
    out = expert_out.new_zeros((placement.position.shape[0], h))
    if signal is None:
        return torch.where(dropped[:, None], out, cells[index])
    cap = placement.capacity
    for unit in range(signal.num_units):
        e, start, end = signal.unit_rows(unit)
        signal.wait(unit)  # the unit's cells are final only now
        mine = (placement.position >= e * cap + start) & (placement.position < e * cap + end)
        out = torch.where(mine[:, None], cells[index], out)
    return out


def weighted_sum(pair_out: torch.Tensor, topk_ids: torch.Tensor,
                 topk_weights: torch.Tensor) -> torch.Tensor:
    """pair_out [T*K, H] (row t*K + k), topk_ids [T, K] int64 (-1 = unrouted), topk_weights
    [T, K] float32 -> [T, H] in pair_out's dtype; accumulated in float32 (float64 stays
    float64), k in order, unrouted slots skipped (their rows may hold anything, even NaN)."""
    t, k = topk_ids.shape
    acc_dtype = torch.float64 if pair_out.dtype == torch.float64 else torch.float32
    acc = pair_out.new_zeros((t, pair_out.shape[-1]), dtype=acc_dtype)
    for j in range(k):
        term = topk_weights[:, j, None].to(acc_dtype) * pair_out[j::k].to(acc_dtype)  # [T, H]
        acc = acc + torch.where(topk_ids[:, j, None] >= 0, term, 0.0)
    return acc.to(pair_out.dtype)
