"""Predict each overlap mode's step time and throughput for a deployment.

`predict(model, hw, deploy)` builds the micro-batches each mode runs (the whole batch for none
and SBO; `plan_two_batch`'s children for TBO and two-chunk), prices their stages
(`stage_costs.py`), runs the two-stream schedule (`schedule.py`) to the steady-state time of one
MoE layer, and adds the dense layers and the LM head:

    step = dense_layers x dense_layer + moe_layers x layer(mode) + head
    throughput per GPU = tokens produced per step / step;   gain(mode) = step(none) / step(mode) - 1

Which modes apply: decode runs none, SBO and TBO (two-chunk only splits prefill); prefill runs
none, TBO and two-chunk (SBO needs the low-latency dispatch layout, so decode only; TBO and
two-chunk differ only when the sequence boundary is unbalanced).

Prefill uses two prefill-only parameters of the hardware profile (`profiles.py`): achieved
prefill compute as a multiple of the roofline estimate, and the share of each prefill
all-to-all left exposed under TBO. Predictions are estimates for ranking modes, not
measurements: a deployment unlike the ones the profiles were fitted on is an extrapolation.

Plain Python; mypy --strict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_overlap.modes import PLAN_MODES, Mode, Phase, mode_of
from sglang_overlap.planning.cost.experts import layout_of
from sglang_overlap.planning.cost.profiles import Deployment, HardwareProfile, ModelProfile
from sglang_overlap.planning.cost.stage_costs import (
    MicroBatch,
    StageCosts,
    dense_layer_us,
    head_us,
    stage_costs,
)
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from sglang_overlap.planning.schedule import Segment, steady_layer
from sglang_overlap.planning.two_batch import ForwardKind, plan_two_batch

SBO_BLOCK_N = 128  # DeepGEMM's down-GEMM tile width on Hopper


@dataclass(frozen=True)
class ModeEstimate:
    mode: Mode
    applicable: bool
    note: str  # why not applicable, or what the estimate assumes
    layer_us: float  # steady-state time of one MoE layer
    step_us: float
    throughput_per_gpu: float  # output tokens/s (decode) or input tokens/s (prefill) per GPU
    gain_vs_none: float  # fraction: step(none) / step(mode) - 1
    timeline: tuple[Segment, ...]  # one MoE layer's window on both streams


@dataclass(frozen=True)
class Prediction:
    model: ModelProfile
    hardware: HardwareProfile
    deployment: Deployment
    estimates: Mapping[Mode, ModeEstimate]
    recommended: Mode

    def applicable(self) -> list[ModeEstimate]:
        return [e for e in self.estimates.values() if e.applicable]


def _batch(deploy: Deployment, tokens: int) -> tuple[list[int], list[int]]:
    """(q_lens, kv_lens) of the batch one GPU runs."""
    if deploy.phase == Phase.DECODE:
        seqs = tokens // deploy.tokens_per_seq
        return [deploy.tokens_per_seq] * seqs, [deploy.context_len] * seqs
    full, rest = divmod(tokens, deploy.context_len)
    lens = [deploy.context_len] * full + ([rest] if rest else [])
    return lens, list(lens)


def micro_batches(mode: Mode, deploy: Deployment,
                  moe_tokens: float | None = None) -> tuple[MicroBatch, ...]:
    """The micro-batches `mode` runs on one GPU (one for none/SBO, `plan_two_batch`'s two)."""
    tokens = deploy.tokens_per_gpu
    moe = float(tokens if moe_tokens is None else moe_tokens)
    q_lens, kv_lens = _batch(deploy, tokens)
    causal = deploy.phase == Phase.PREFILL
    if mode in (Mode.NONE, Mode.SBO):
        return (MicroBatch(tuple(q_lens), tuple(kv_lens), moe, causal),)
    if deploy.phase == Phase.DECODE:
        plan = plan_two_batch(ForwardKind.DECODE, sum(q_lens), tokens_per_seq=deploy.tokens_per_seq)
        children = [(c.num_tokens, [deploy.tokens_per_seq] * c.num_seqs,
                     [deploy.context_len] * c.num_seqs) for c in plan.children]
    else:
        threshold = deploy.two_chunk_threshold if mode == Mode.TWO_CHUNK else 0.0
        plan = plan_two_batch(ForwardKind.EXTEND, sum(q_lens), extend_lens=q_lens,
                              two_chunk_threshold=threshold)
        children = [(c.num_tokens, list(c.extend_lens), list(c.seq_lens)) for c in plan.children]
    total = max(1, sum(q_lens))
    return tuple(MicroBatch(tuple(q), tuple(kv), moe * n / total, causal)
                 for n, q, kv in children)


def _sbo_units(model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
               moe_tokens: float) -> int:
    """Units the down GEMM signals in which rows actually arrive (block granularity)."""
    experts = layout_of(model, deploy)
    local = experts.per_rank
    rows = experts.rows_per_expert(moe_tokens, model.topk)
    capacity = max(1, int(rows + 0.999999))
    layout = plan_sbo_layout(
        num_local_experts=local, capacity=capacity, block_m=hw.block_m, block_n=SBO_BLOCK_N,
        hidden=model.hidden, num_sms=hw.num_sms, comm_num_sms=hw.sbo_comm_sms,
        granularity="block")
    return layout.num_signals


def _applicability(mode: Mode, deploy: Deployment) -> str:
    if mode == Mode.SBO and deploy.phase != Phase.DECODE:
        return "SBO needs the low-latency dispatch (decode only in the supported SGLang)"
    if mode == Mode.TWO_CHUNK and deploy.phase != Phase.PREFILL:
        return "two-chunk splits prefill batches only"
    if mode in (Mode.TBO, Mode.SBO, Mode.TWO_CHUNK) and deploy.ep_size <= 1:
        return "needs expert parallelism (--ep > 1)"
    return ""


def mode_costs(mode: Mode, model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
               moe_tokens: float | None = None) -> tuple[StageCosts, ...]:
    mbs = micro_batches(mode, deploy, moe_tokens)
    sms = None
    if mode in (Mode.TBO, Mode.TWO_CHUNK) and deploy.phase == Phase.PREFILL:
        sms = hw.num_sms - hw.deepep_normal_sms  # DeepEP normal mode holds SMs while it runs
    units = _sbo_units(model, hw, deploy, mbs[0].moe_tokens) if mode == Mode.SBO else 1
    return tuple(stage_costs(model, hw, deploy, mb, sms=sms, sbo_units=units) for mb in mbs)


def _step_extras(model: ModelProfile, hw: HardwareProfile, deploy: Deployment) -> tuple[float, int]:
    """(dense layers + LM head time, tokens produced per step)."""
    q_lens, kv_lens = _batch(deploy, deploy.tokens_per_gpu)
    whole = MicroBatch(tuple(q_lens), tuple(kv_lens), float(deploy.tokens_per_gpu),
                       deploy.phase == Phase.PREFILL)
    sampled = len(q_lens) * (deploy.tokens_per_seq if deploy.phase == Phase.DECODE else 1)
    extras = model.num_dense_layers * dense_layer_us(model, hw, deploy, whole)
    extras += head_us(model, hw, sampled)
    produced = len(q_lens) if deploy.phase == Phase.DECODE else deploy.tokens_per_gpu
    return extras, produced


def predict(model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
            modes: Sequence[Mode | str] = PLAN_MODES, *, moe_tokens: float | None = None,
            timelines: bool = True) -> Prediction:
    """Every mode's estimate and the recommended (fastest applicable) mode.

    `moe_tokens`: mean tokens per rank entering the MoE when ranks differ (the gate passes the
    all-gathered mean; `deploy.tokens_per_gpu` is then the busiest rank's batch).
    """
    asked = [mode_of(m) for m in modes]  # ValueError naming the known modes
    extras, produced = _step_extras(model, hw, deploy)
    decode = deploy.phase == Phase.DECODE
    raw: dict[Mode, tuple[str, float, tuple[Segment, ...]]] = {}
    for mode in dict.fromkeys((Mode.NONE, *asked)):
        note = _applicability(mode, deploy)
        costs = mode_costs(mode if not note else Mode.NONE, model, hw, deploy, moe_tokens)
        layer, segments = steady_layer(mode if not note else Mode.NONE, costs, decode)
        raw[mode] = (note, layer, tuple(segments) if timelines else ())
    none_step = extras + model.num_moe_layers * raw[Mode.NONE][1]
    estimates: dict[Mode, ModeEstimate] = {}
    for mode in asked if Mode.NONE in asked else (Mode.NONE, *asked):
        note, layer, window = raw[mode]
        step = extras + model.num_moe_layers * layer
        estimates[mode] = ModeEstimate(
            mode=mode, applicable=not note, note=note, layer_us=layer, step_us=step,
            throughput_per_gpu=produced / step * 1e6 if step > 0 else 0.0,
            gain_vs_none=none_step / step - 1.0 if step > 0 else 0.0, timeline=window)
    candidates = [e for e in estimates.values() if e.applicable]
    recommended = min(candidates, key=lambda e: (e.step_us, PLAN_MODES.index(e.mode))).mode
    return Prediction(model, hw, deploy, estimates, recommended)

