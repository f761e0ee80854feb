"""The MoE layer as named stage ops with explicit yield points.

A program is a flat list of `Op`s and `YIELD` markers covering every layer; the executors cut
it at the markers into stages and run the stages of one or two micro-batches. Each op reads and
writes one `MicroBatch`: `hidden` [T, H] (the layer's running activations) and `state`, the
values that live between ops of one layer.

Per layer, in order (SGLang's DeepSeek ops in brackets):
    attn_prepare, attn_core   caller-supplied attention; must update mb.hidden [op_prepare/core]
    gate                      router logits [T, E] float32                          [op_gate]
    select_experts            topk_ids [T, K] int64, topk_weights [T, K] f32  [op_select_experts]
    dispatch_send             issue the dispatch                                    [op_dispatch_a]
    dispatch_recv             complete it: DispatchOutput                           [op_dispatch_b]
    experts                   unweighted expert outputs in the dispatch layout      [op_experts]
    combine_send              issue the combine                                     [op_combine_a]
    combine_recv              complete it: routed [T, H]                            [op_combine_b]
    shared_experts            shared expert [T, H] (if the layer has one)   [op_shared_experts]
    output                    hidden = hidden + routed + shared (the MoE residual)  [op_output]

Schedules (SGLang's `_compute_moe_deepseek_blog_*`; `|` = YIELD):
    decode  (low latency, B starts 2 stages behind, 5 stages a layer):
        prep | core gate select | dispatch_send shared | dispatch_recv experts combine_send |
        combine_recv | output (+ the next layer's prep)
    prefill (normal, B starts 0 stages behind, 3 stages a layer):
        prep core gate select dispatch_send | dispatch_recv experts combine_send |
        shared combine_recv output (+ the next layer's first stage)
    serial: the decode order without yields (any layout); sbo: the same with the shared expert
        inside the dispatch window and the down GEMM feeding combine_send through a signal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from sglang_overlap.kernels.contracts import Dispatcher, ExpertRunner, Layout, SignalContract
from sglang_overlap.planning.sbo_layout import (
    HOPPER_NUM_SMS,
    Granularity,
    default_comm_num_sms,
    plan_sbo_layout,
)
from sglang_overlap.planning.two_batch import ChildPlan
from tests.oracle import experts as reference
from tests.oracle.router import RouterConfig, gate_logits, select_experts

Schedule = Literal["serial", "decode", "prefill", "sbo"]
SCHEDULE_DELTA = {"decode": 2, "prefill": 0}
"""Stages micro-batch B starts behind A, per TBO schedule."""


@dataclass
class MicroBatch:
    hidden: torch.Tensor  # [T, H] (T includes `pad` zero rows at the end)
    slot: int  # 0 = A (or the whole batch), 1 = B
    token_start: int  # first parent token of this micro-batch
    num_tokens: int  # real tokens (hidden has num_tokens + pad rows)
    child: ChildPlan | None = None  # the planning layer's view; None = the whole batch
    state: dict[str, Any] = field(default_factory=dict)


AttnFn = Callable[[MicroBatch, int], None]
"""(micro-batch, layer index) -> None; updates mb.hidden in place of the attention block."""


@dataclass(frozen=True)
class AttentionOps:
    prepare: AttnFn
    core: AttnFn


@dataclass(frozen=True)
class MoeLayer:
    router: RouterConfig
    gate_w: torch.Tensor  # [E, H]
    bias: torch.Tensor  # [E] float32, e_score_correction_bias
    experts: ExpertRunner
    dispatcher: Dispatcher
    shared_w13: torch.Tensor | None = None  # [2 * I_shared, H]
    shared_w2: torch.Tensor | None = None  # [H, I_shared]
    gate_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Replaces the gate GEMM: hidden [T, H] -> logits [T, E] (e.g. the model's own gate)."""
    shared_fn: Callable[[torch.Tensor], torch.Tensor] | None = None
    """Replaces the shared-expert weights: hidden [T, H] -> [T, H] (e.g. an fp8 shared MLP)."""


@dataclass(frozen=True)
class SboConfig:
    """How the SBO down GEMM is cut into signalled units (see planning.sbo_layout)."""

    granularity: Granularity = "block"
    block_m: int = 64
    block_n: int = 128
    num_sms: int = HOPPER_NUM_SMS
    comm_num_sms: int = default_comm_num_sms(blackwell=False)


@dataclass(frozen=True)
class Op:
    name: str
    fn: Callable[[MicroBatch], None]


YIELD = "yield"
Program = list[Op | str]


def _moe_ops(layer: MoeLayer, layout: Layout, sbo: SboConfig | None) -> dict[str, Op]:
    def gate(mb: MicroBatch) -> None:
        if layer.gate_fn is not None:
            mb.state["logits"] = layer.gate_fn(mb.hidden)  # [T, E]
        else:
            mb.state["logits"] = gate_logits(mb.hidden, layer.gate_w)  # [T, E]

    def select(mb: MicroBatch) -> None:
        ids, weights = select_experts(mb.state.pop("logits"), layer.bias, layer.router)
        mb.state["topk_ids"], mb.state["topk_weights"] = ids, weights  # [T, K] each

    def dispatch_send(mb: MicroBatch) -> None:
        mb.state["pending_dispatch"] = layer.dispatcher.dispatch_send(
            mb.hidden, mb.state["topk_ids"], mb.state["topk_weights"], layout=layout,
            slot=mb.slot)

    def dispatch_recv(mb: MicroBatch) -> None:
        mb.state["dispatched"] = layer.dispatcher.dispatch_recv(mb.state.pop("pending_dispatch"))

    def experts(mb: MicroBatch) -> None:
        d = mb.state["dispatched"]
        if layout == "normal":
            mb.state["expert_out"] = layer.experts.run_normal(d)
            return
        signal = None
        if sbo is not None:
            e_local, cap, hid = d.hidden.shape
            signal = SignalContract(plan_sbo_layout(
                num_local_experts=e_local, capacity=cap, block_m=sbo.block_m,
                block_n=sbo.block_n, hidden=hid, num_sms=sbo.num_sms,
                comm_num_sms=sbo.comm_num_sms, granularity=sbo.granularity), d.hidden.device)
            mb.state["signal"] = signal
        mb.state["expert_out"] = layer.experts.run_low_latency(d, signal=signal)

    def combine_send(mb: MicroBatch) -> None:
        signal = mb.state.pop("signal", None)
        mb.state["pending_combine"] = layer.dispatcher.combine_send(
            mb.state.pop("expert_out"), mb.state.pop("dispatched"), signal=signal)
        if signal is not None:
            signal.finish()

    def combine_recv(mb: MicroBatch) -> None:
        mb.state["routed"] = layer.dispatcher.combine_recv(mb.state.pop("pending_combine"))

    def shared(mb: MicroBatch) -> None:
        if layer.shared_fn is not None:
            mb.state["shared"] = layer.shared_fn(mb.hidden)
        elif layer.shared_w13 is not None and layer.shared_w2 is not None:
            mb.state["shared"] = reference.swiglu(mb.hidden, layer.shared_w13, layer.shared_w2)

    def output(mb: MicroBatch) -> None:
        out = mb.hidden + mb.state.pop("routed")
        if "shared" in mb.state:
            out = out + mb.state.pop("shared")
        mb.hidden = out
        del mb.state["topk_ids"], mb.state["topk_weights"]
        if mb.state:
            raise RuntimeError(f"stage state leaked across layers: {sorted(mb.state)}")

    fns = [gate, select, dispatch_send, dispatch_recv, experts, combine_send, combine_recv,
           shared, output]
    names = ["gate", "select_experts", "dispatch_send", "dispatch_recv", "experts",
             "combine_send", "combine_recv", "shared_experts", "output"]
    return {n: Op(n, f) for n, f in zip(names, fns, strict=True)}


_ORDERS: dict[Schedule, tuple[str, ...]] = {
    "decode": ("attn_prepare", YIELD, "attn_core", "gate", "select_experts", YIELD,
               "dispatch_send", "shared_experts", YIELD, "dispatch_recv", "experts",
               "combine_send", YIELD, "combine_recv", YIELD, "output"),
    "prefill": ("attn_prepare", "attn_core", "gate", "select_experts", "dispatch_send", YIELD,
                "dispatch_recv", "experts", "combine_send", YIELD, "shared_experts",
                "combine_recv", "output"),
    "serial": ("attn_prepare", "attn_core", "gate", "select_experts", "dispatch_send",
               "dispatch_recv", "experts", "combine_send", "combine_recv", "shared_experts",
               "output"),
    "sbo": ("attn_prepare", "attn_core", "gate", "select_experts", "dispatch_send",
            "shared_experts", "dispatch_recv", "experts", "combine_send", "combine_recv",
            "output"),
}

DEFAULT_LAYOUT: dict[Schedule, Layout] = {
    "decode": "low_latency", "prefill": "normal", "serial": "low_latency", "sbo": "low_latency"}


def build_program(
    layers: list[MoeLayer],
    attention: AttentionOps | None,
    schedule: Schedule,
    *,
    layout: Layout | None = None,
    sbo: SboConfig | None = None,
) -> Program:
    """The ops of every layer in `schedule` order, YIELD markers included."""
    layout = layout or DEFAULT_LAYOUT[schedule]
    if schedule == "sbo" and (sbo is None or layout != "low_latency"):
        raise ValueError(f"the sbo schedule needs an SboConfig and the low_latency layout "
                         f"(got sbo={sbo!r}, layout={layout!r})")
    if schedule != "sbo" and sbo is not None:
        raise ValueError(f"an SboConfig only applies to the sbo schedule (got {schedule=})")
    program: Program = []
    for idx, layer in enumerate(layers):
        ops = _moe_ops(layer, layout, sbo)
        if attention is not None:
            ops["attn_prepare"] = Op("attn_prepare", _bind(attention.prepare, idx))
            ops["attn_core"] = Op("attn_core", _bind(attention.core, idx))
        program += [YIELD if n == YIELD else ops[n] for n in _ORDERS[schedule] if n in ops
                    or n == YIELD]
    return program


def _bind(fn: AttnFn, layer: int) -> Callable[[MicroBatch], None]:
    return lambda mb: fn(mb, layer)


def split_stages(program: Program) -> list[list[Op]]:
    """Cut at YIELD markers: stage i = the ops between the (i-1)-th and i-th marker."""
    stages: list[list[Op]] = [[]]
    for item in program:
        if isinstance(item, Op):
            stages[-1].append(item)
        else:
            stages.append([])
    return stages
