"""Predict each overlap mode's step time and throughput for a deployment.

`predict(model, hw, deploy)` builds the micro-batches each mode runs (the whole batch for none
and SBO; `plan_two_batch`'s children for TBO and two-chunk), prices their stages
(`stage_costs.py`), runs the two-stream schedule (`schedule.py`) to the steady-state time of one
MoE layer, and adds the dense layers and the LM head:

    step = dense_layers x dense_layer + moe_layers x layer(mode) + head
    throughput per GPU = tokens produced per step / step;   gain(mode) = step(none) / step(mode) - 1

Which modes apply: decode runs none, SBO and TBO (two-chunk only splits prefill); prefill runs
none, TBO and two-chunk (SGLang 0.5.23's SBO needs the low-latency dispatch layout, so decode only;
TBO and two-chunk differ only when the sequence boundary is unbalanced).

Validated against public results (tests/planning/test_cost_model.py checks each):
- SGLang PR #9660 (Single Batch Overlap), DeepSeek-V3 decode on 2 x 8 H20, DP16 + EP16, input 4096,
  32 sequences per GPU: SBO +6.7% output throughput (6667 -> 7111 tok/s; mean ITL 73.11 -> 67.35
  ms). The model predicts the gain within 3 points and the step time within 10%.
- The same PR's motivation: on H20 decode, TBO only pays at larger batches (64, 128 per GPU) because
  each half pads the expert GEMMs to block_m 64. The model predicts a TBO loss at 32 sequences per
  GPU (about -34%; the project brief quotes -27%, a figure whose source we could not find).
  The model has TBO turning positive only near 130-200 sequences per GPU on H20 with a 400 Gb/s NIC
  per GPU (the PR says 64-128 on its cluster): it is pessimistic about TBO on H20.
- Prefill, recalibrated against LMSYS "Deploying DeepSeek with PD Disaggregation and Large-scale
  EP on 96 H100 GPUs" (2025-05-05): 4 prefill nodes (EP32, DP attention, TBO) serve 57,674 /
  54,543 / 50,302 input tokens/s per node at 1K / 2K / 4K-token prompts, and TBO raises prefill
  throughput by 27-35%. Two prefill-only parameters of the hardware profile carry the fit
  (`profiles.py`): achieved prefill compute is 1.5x the roofline (the efficiencies were fitted on
  decode-shaped masked GEMMs), and 20% of each prefill all-to-all stays exposed under TBO
  (DeepEP normal mode synchronises the CPU on the received-token counts). 16K tokens per GPU
  (DeepSeek's published prefill profile: EP32, 4K prompts, 16K tokens per GPU, two micro-batches).

Residual error per phase (tests/planning/test_cost_model.py checks each row):

    phase    published (source)                          predicted              error
    prefill  57,674 tok/s/node, 1K prompts (LMSYS)       57,088                 -1.0%
    prefill  54,543 tok/s/node, 2K prompts (LMSYS)       54,528                 -0.0%
    prefill  50,302 tok/s/node, 4K prompts (LMSYS)       50,042                 -0.5%
    prefill  TBO gain +27..+35% (LMSYS)                  +28.0 / +30.5 / +32.0%  inside
    decode   SBO +6.7%, 32 seqs/GPU, H20 (PR #9660)      +6.6%                  -0.1 pt
    decode   ITL 73.11 ms with none (PR #9660)           79.7 ms step           +9%
    decode   TBO loses at 32 seqs/GPU on H20 (PR #9660)  -34%                   sign right
    decode   22.3k output tok/s/node, EP72, 2K (LMSYS)   28.9k (TBO, 256 seqs)  +30% (not refitted)

Two parameters fitted on four prefill numbers of one cluster: other GPUs reuse them (like the
efficiencies), and prefill on a machine unlike LMSYS's H100 + 400 Gb/s NICs is an extrapolation;
decode keeps its +30% optimism. DeepSeek's own H800 figures (73.7k input tok/s per prefill node,
14.8k output per decode node) count prefix-cache hits as served tokens and are not comparable.
Plain Python; mypy --strict.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_overlap.modes import PLAN_MODES, Mode, Phase, mode_of
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
    local = max(1, model.num_experts // deploy.ep_size)
    rows = moe_tokens * model.topk * deploy.ep_size / model.num_experts
    capacity = max(1, int(rows + 0.999999))
    layout = plan_sbo_layout(
        num_local_experts=local, capacity=capacity, block_m=hw.block_m, block_n=SBO_BLOCK_N,
        hidden=model.hidden, num_sms=hw.num_sms, comm_num_sms=hw.sbo_comm_sms,
        granularity="block")
    return layout.num_signals


def _applicability(mode: Mode, deploy: Deployment) -> str:
    if mode == Mode.SBO and deploy.phase != Phase.DECODE:
        return "SBO needs the low-latency dispatch (decode only in SGLang 0.5.23)"
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

