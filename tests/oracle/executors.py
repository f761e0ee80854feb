"""Executors: serial, TBO (two interleaved micro-batches; two-chunk is a TBO plan), SBO.

All of them run the same stage ops (`stages.py`) and only differ in order and streams:
- serial: every op of the whole batch in order, slot 0;
- TBO: the planning layer's two children as micro-batches A and B; A runs `delta` stages ahead,
  then A and B alternate stage by stage (SGLang's `execute_overlapped_operations`), so each
  one's dispatch/combine is in flight while the other computes. A two-chunk plan (child B holds
  the tail of a request whose head is in A) needs no special casing: with delta >= 0, A's
  attention of layer L always runs before B's, so B reads the KV that A wrote;
- SBO: one batch; the shared expert runs inside the dispatch window, and the down GEMM feeds
  combine-send unit by unit through the signal contract.
On CUDA the dispatchers put communication on their own stream (`streams.StreamPair`); on CPU
everything runs in program order. No op here reads a device value on the host.

Legend: N parent tokens, H hidden; T child tokens (+ pad rows up to the child's padded_len).
"""

from __future__ import annotations

from typing import Literal

import torch

from sglang_overlap.kernels.contracts import Layout
from sglang_overlap.planning.interleave import interleaved_order
from sglang_overlap.planning.two_batch import TwoBatchPlan
from tests.oracle.stages import (
    SCHEDULE_DELTA,
    AttentionOps,
    MicroBatch,
    MoeLayer,
    Program,
    SboConfig,
    build_program,
    split_stages,
)


def run_program(program: Program, mb: MicroBatch) -> None:
    """Every op of `program` on one micro-batch, YIELD markers ignored."""
    for stage in split_stages(program):
        for op in stage:
            op.fn(mb)


def run_interleaved(program: Program, a: MicroBatch, b: MicroBatch, delta: int) -> list[str]:
    """A runs `delta` stages ahead, then A and B alternate; returns the order as 'A3', 'B0'..."""
    stages = split_stages(program)
    order: list[str] = []
    for which, idx in interleaved_order(len(stages), delta):
        mb = (a, b)[which]
        for op in stages[idx]:
            op.fn(mb)
        order.append(f"{'AB'[which]}{idx}")
    return order


def execute_serial(
    layers: list[MoeLayer],
    hidden: torch.Tensor,
    *,
    attention: AttentionOps | None = None,
    layout: Layout = "low_latency",
) -> torch.Tensor:
    """[N, H] -> [N, H], the whole batch as one micro-batch."""
    mb = MicroBatch(hidden, slot=0, token_start=0, num_tokens=hidden.shape[0])
    run_program(build_program(layers, attention, "serial", layout=layout), mb)
    return mb.hidden


def execute_sbo(
    layers: list[MoeLayer],
    hidden: torch.Tensor,
    sbo: SboConfig,
    *,
    attention: AttentionOps | None = None,
) -> torch.Tensor:
    """[N, H] -> [N, H] with single-batch overlap (low-latency layout)."""
    mb = MicroBatch(hidden, slot=0, token_start=0, num_tokens=hidden.shape[0])
    run_program(build_program(layers, attention, "sbo", sbo=sbo), mb)
    return mb.hidden


def split_micro_batches(hidden: torch.Tensor, plan: TwoBatchPlan) -> tuple[MicroBatch, MicroBatch]:
    """Slice the parent rows by each child's token range, zero-padded to its padded_len."""
    mbs = []
    for slot, child in enumerate(plan.children):
        rows = hidden[child.token_start : child.token_end]  # [T, H]
        if child.pad:
            rows = torch.cat([rows, rows.new_zeros((child.pad, hidden.shape[1]))])
        mbs.append(MicroBatch(rows, slot, child.token_start, child.num_tokens, child))
    return mbs[0], mbs[1]


def merge_micro_batches(a: MicroBatch, b: MicroBatch) -> torch.Tensor:
    """The children's real rows back in parent order: [N, H]."""
    return torch.cat([a.hidden[: a.num_tokens], b.hidden[: b.num_tokens]])


def execute_tbo(
    layers: list[MoeLayer],
    hidden: torch.Tensor,
    plan: TwoBatchPlan,
    *,
    schedule: Literal["decode", "prefill"] = "decode",
    attention: AttentionOps | None = None,
    layout: Layout | None = None,
    order_out: list[str] | None = None,
) -> torch.Tensor:
    """[N, H] -> [N, H] as two interleaved micro-batches; `schedule` is 'decode' or 'prefill'.

    Every rank of an expert-parallel group must run the same schedule (an idle rank runs it with
    two empty children), since each micro-batch's dispatch and combine are collectives.
    """
    if schedule not in SCHEDULE_DELTA:
        raise ValueError(f"TBO schedule must be one of {sorted(SCHEDULE_DELTA)} (got {schedule!r})")
    first, second = plan.children
    if first.token_start != 0 or second.token_start != first.token_end or (
        second.token_end != hidden.shape[0]
    ):
        raise ValueError(f"TBO plan does not tile the batch: children {first.token_start}:"
                         f"{first.token_end}, {second.token_start}:{second.token_end}, "
                         f"N={hidden.shape[0]}")
    program = build_program(layers, attention, schedule, layout=layout)
    a, b = split_micro_batches(hidden, plan)
    order = run_interleaved(program, a, b, SCHEDULE_DELTA[schedule])
    if order_out is not None:
        order_out.extend(order)
    return merge_micro_batches(a, b)
