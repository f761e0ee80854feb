"""Per-kernel time estimates for one MoE decoder layer, on one GPU, for one micro-batch.

Every estimate is a roofline with fixed costs: `fixed + max(bytes / (HBM x eff), flops / (peak x
eff))`, where a grouped GEMM pads each expert's rows up to the kernel's block_m (64 rows on Hopper
WGMMA). That padding is why splitting a small decode batch in two costs twice the GEMM time: eight
rows per expert pad to the same 64 as sixteen do. Transfers are a fixed latency plus bytes over
NVLink (same node) and the NIC (other nodes) at their achieved efficiencies.

Routing is assumed balanced (every expert slot that receives tokens gets tokens x topk x ep /
slots rows; EPLB keeps real deployments close to this). Redundant experts
(--ep-num-redundant-experts, `experts.py`) add grouped-GEMM groups and weights per rank and, when
SGLang dispatches to them, spread the same rows over more slots. Plain Python; mypy --strict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sglang_overlap.modes import Phase
from sglang_overlap.planning.cost.experts import layout_of
from sglang_overlap.planning.cost.profiles import Deployment, HardwareProfile, ModelProfile

SCALE_GROUP = 128  # fp8 activations carry one fp32 scale per 128 channels


def grouped_gemm_us(hw: HardwareProfile, num_groups: int, m: float, n: int, k: int, *,
                    block_m: int | None = None, sms: int | None = None,
                    weight_bytes: float = 1.0) -> float:
    """One fp8 grouped GEMM: `num_groups` problems of m x n x k (m may be a fractional mean).

    Rows pad to block_m per group; `sms` < num_sms slows the compute-bound part proportionally.
    hw's efficiencies and fixed time are fitted with this very function, so a profile's numbers
    mean what this function makes of them.
    """
    bm = block_m or hw.block_m
    rows = num_groups * math.ceil(m / bm) * bm if m > 0 else 0
    flops = 2.0 * rows * n * k
    nbytes = num_groups * (n * k * weight_bytes + m * k + m * n * 2.0)
    share = hw.num_sms / max(1, sms or hw.num_sms)
    compute = flops / (hw.fp8_tflops * 1e6 * hw.gemm_efficiency) * share
    memory = nbytes / (hw.hbm_gbps * 1e3 * hw.hbm_efficiency)
    return hw.gemm_fixed_us + max(compute, memory)


def memory_kernel_us(hw: HardwareProfile, nbytes: float, kernels: int = 1) -> float:
    return kernels * hw.kernel_us + nbytes / (hw.hbm_gbps * 1e3 * hw.hbm_efficiency)


def attention_core_us(hw: HardwareProfile, flops: float, nbytes: float) -> float:
    compute = flops / (hw.bf16_tflops * 1e6 * hw.attn_efficiency)
    return hw.kernel_us + max(compute, nbytes / (hw.hbm_gbps * 1e3 * hw.hbm_efficiency))


def transfer_us(hw: HardwareProfile, local_bytes: float, remote_bytes: float) -> float:
    """One all-to-all phase: fixed latency, then NVLink and NIC traffic at once (slower wins)."""
    nvlink = local_bytes / (hw.nvlink_gbps * 1e3 * hw.nvlink_efficiency)
    rdma = remote_bytes / (hw.rdma_gbps * 1e3 * hw.rdma_efficiency) if remote_bytes else 0.0
    return hw.a2a_latency_us + max(nvlink, rdma)


@dataclass(frozen=True)
class MicroBatch:
    """What one micro-batch computes: its sequences as (query tokens, KV length) pairs."""

    q_lens: tuple[int, ...]
    kv_lens: tuple[int, ...]  # KV length each query attends to, including its own tokens
    moe_tokens: float  # tokens per rank entering the MoE (a mean over ranks after DP sync)
    causal: bool  # prefill: queries attend causally within their own tokens

    @property
    def num_tokens(self) -> int:
        return sum(self.q_lens)


@dataclass(frozen=True)
class StageCosts:
    """Microseconds per stage of one MoE layer for one micro-batch (compute unless noted)."""

    attn_prep: float  # input norm, q / kv projections
    attn_core: float  # attention kernel and output projection
    gate: float  # router GEMM and top-k
    shared: float  # shared experts (0 when the model has none)
    dispatch_send: float  # send kernel
    dispatch_xfer: float  # transfer (comm stream)
    dispatch_recv: float  # receive kernel
    gate_up: float
    act: float  # SiLU-and-mul + fp8 quant
    down: float
    down_sbo: float  # down GEMM on the SMs SBO leaves it
    combine_send: float
    combine_xfer: float  # transfer (comm stream)
    combine_recv: float
    output: float  # residual add, post-attention norm
    sbo_units: int  # units the SBO down GEMM signals (combine streams them)
    a2a_exposed: float = 0.0  # share of each transfer that blocks the compute stream under TBO


def _attention(model: ModelProfile, hw: HardwareProfile, mb: MicroBatch, tp: int,
               sms: int | None) -> tuple[float, float]:
    """(prep, core) microseconds of the attention block."""
    t = mb.num_tokens
    h = model.hidden
    heads = max(1, model.num_heads // tp)
    pairs = list(zip(mb.q_lens, mb.kv_lens, strict=True))
    if mb.causal:  # each query sees the prefix plus, on average, half its own chunk
        kv_work = sum(q * (kv - q + (q + 1) / 2) for q, kv in pairs)
    else:
        kv_work = sum(q * kv for q, kv in pairs)
    if model.attn_kind == "mla":
        qk = model.head_dim + model.rope_head_dim
        q_params = (h * model.q_lora_rank + model.q_lora_rank * heads * qk if model.q_lora_rank
                    else h * heads * qk)
        kv_a = h * (model.kv_lora_rank + model.rope_head_dim)
        prep = grouped_gemm_us(hw, 1, t, q_params // h, h, sms=sms)
        prep += grouped_gemm_us(hw, 1, t, kv_a // h, h, sms=sms)
        latent = model.kv_lora_rank + model.rope_head_dim
        if mb.causal:  # prefill runs MHA: expand the latent KV with kv_b for every KV token
            kv_tokens = sum(mb.kv_lens)
            prep += grouped_gemm_us(hw, 1, kv_tokens, heads * (model.head_dim + model.v_head_dim),
                                    model.kv_lora_rank, sms=sms)
            flops = 2.0 * heads * (qk + model.v_head_dim) * kv_work
        else:  # decode absorbs kv_b into q and o: attention runs on the latent vectors
            prep += grouped_gemm_us(hw, heads, t, model.kv_lora_rank, model.head_dim,
                                    weight_bytes=2.0, sms=sms)
            flops = 2.0 * heads * (latent + model.kv_lora_rank) * kv_work
        kv_bytes = sum(mb.kv_lens) * latent * model.kv_cache_bytes
        core = attention_core_us(hw, flops, kv_bytes)
        if not mb.causal:
            core += grouped_gemm_us(hw, heads, t, model.v_head_dim, model.kv_lora_rank,
                                    weight_bytes=2.0, sms=sms)
    else:
        kv_heads = max(1, model.num_kv_heads // tp)
        prep = grouped_gemm_us(hw, 1, t, (heads + 2 * kv_heads) * model.head_dim, h, sms=sms)
        flops = 2.0 * heads * 2 * model.head_dim * kv_work
        kv_bytes = sum(mb.kv_lens) * 2 * kv_heads * model.head_dim * model.kv_cache_bytes
        core = attention_core_us(hw, flops, kv_bytes)
    prep += memory_kernel_us(hw, 2.0 * t * h * 2, kernels=2)  # norms, rope
    core += grouped_gemm_us(hw, 1, t, h, heads * model.v_head_dim, sms=sms)
    return prep, core


def _distinct_hits(total: int, members: int, topk: int) -> float:
    """Expected number of the groups of `members` experts (out of `total`) a token's top-k hits."""
    if members >= total:
        return 1.0
    miss = math.comb(total - members, topk) / math.comb(total, topk)
    return (total / members) * (1.0 - miss)


def _traffic(model: ModelProfile, deploy: Deployment, tokens: float, bytes_per_row: float,
             low_latency: bool) -> tuple[float, float]:
    """(NVLink bytes, NIC bytes) one rank sends in one all-to-all phase."""
    ep, gpn = deploy.ep_size, min(deploy.gpus_per_node, deploy.ep_size)
    if ep <= 1:
        return 0.0, 0.0
    remote_frac = (ep - gpn) / ep
    if low_latency:  # one message per (token, expert)
        rows = tokens * model.topk
        return rows * (1 - remote_frac) * bytes_per_row, rows * remote_frac * bytes_per_row
    # normal mode: one copy per destination rank; across nodes, one copy per destination node
    # (a token's top-k land among the slots that receive tokens, redundant copies included)
    layout = layout_of(model, deploy)
    slots, per_rank = layout.receiving, layout.per_rank
    ranks = _distinct_hits(slots, per_rank, model.topk)
    nodes = _distinct_hits(slots, per_rank * gpn, model.topk)
    remote_nodes = nodes * remote_frac
    return tokens * ranks * bytes_per_row, tokens * remote_nodes * bytes_per_row


def stage_costs(model: ModelProfile, hw: HardwareProfile, deploy: Deployment, mb: MicroBatch,
                *, sms: int | None = None, sbo_units: int = 1) -> StageCosts:
    """The stage times of one MoE layer for micro-batch `mb` (GEMMs on `sms` SMs if given)."""
    h, t = model.hidden, mb.num_tokens
    tp = deploy.attn_tp_size
    prep, core = _attention(model, hw, mb, tp, sms)
    gate = grouped_gemm_us(hw, 1, t, model.num_experts, h, weight_bytes=2.0, sms=sms)
    gate += memory_kernel_us(hw, t * model.num_experts * 4.0)
    moe_t = mb.moe_tokens / tp
    layout = layout_of(model, deploy)  # redundant experts: more groups, fewer rows each
    local_experts = layout.per_rank
    m = layout.rows_per_expert(moe_t, model.topk)  # rows per local expert, busiest rank
    low_latency = deploy.phase == Phase.DECODE
    bm = hw.block_m if low_latency else hw.contiguous_block_m
    inter = model.moe_intermediate
    gate_up = grouped_gemm_us(hw, local_experts, m, 2 * inter, h, block_m=bm, sms=sms)
    down = grouped_gemm_us(hw, local_experts, m, h, inter, block_m=bm, sms=sms)
    down_sbo = grouped_gemm_us(hw, local_experts, m, h, inter, block_m=bm,
                               sms=(sms or hw.num_sms) - hw.sbo_comm_sms)
    rows = local_experts * m
    act = memory_kernel_us(hw, rows * (2 * inter * 2.0 + inter * 1.0))
    shared = 0.0
    if model.num_shared_experts:
        s_inter = inter * model.num_shared_experts
        shared = grouped_gemm_us(hw, 1, t, 2 * s_inter, h, sms=sms)
        shared += memory_kernel_us(hw, t * 3.0 * s_inter)
        shared += grouped_gemm_us(hw, 1, t, h, s_inter, sms=sms)
    fp8_row = h + h / SCALE_GROUP * 4.0
    d_local, d_remote = _traffic(model, deploy, moe_t, fp8_row, low_latency)
    c_local, c_remote = _traffic(model, deploy, moe_t, h * 2.0, low_latency)
    kernel = hw.a2a_kernel_us
    # Prefill's achieved compute is slower than these rooflines (fitted per GPU profile: the
    # efficiencies come from decode-shaped GEMMs); transfers are not scaled.
    x = hw.prefill_compute_scale if deploy.phase == Phase.PREFILL else 1.0
    return StageCosts(
        attn_prep=x * prep, attn_core=x * core, gate=x * gate, shared=x * shared,
        dispatch_send=kernel, dispatch_xfer=transfer_us(hw, d_local, d_remote),
        dispatch_recv=kernel + x * memory_kernel_us(hw, rows * fp8_row, kernels=0),
        gate_up=x * gate_up, act=x * act, down=x * down, down_sbo=x * down_sbo,
        combine_send=kernel, combine_xfer=transfer_us(hw, c_local, c_remote),
        combine_recv=kernel + x * memory_kernel_us(hw, t * model.topk * h * 2.0, kernels=0),
        output=x * memory_kernel_us(hw, 3.0 * t * h * 2, kernels=1),
        sbo_units=sbo_units,
        a2a_exposed=hw.prefill_a2a_exposed if deploy.phase == Phase.PREFILL else 0.0,
    )


def dense_layer_us(model: ModelProfile, hw: HardwareProfile, deploy: Deployment,
                   mb: MicroBatch) -> float:
    """A leading dense layer (attention + dense MLP) on the whole batch."""
    prep, core = _attention(model, hw, mb, deploy.attn_tp_size, None)
    t, h, inter = mb.num_tokens, model.hidden, model.dense_intermediate
    mlp = grouped_gemm_us(hw, 1, t, 2 * inter, h) + grouped_gemm_us(hw, 1, t, h, inter)
    x = hw.prefill_compute_scale if deploy.phase == Phase.PREFILL else 1.0
    return x * (prep + core + mlp + memory_kernel_us(hw, t * 3.0 * inter + 3.0 * t * h * 2, 2))


def head_us(model: ModelProfile, hw: HardwareProfile, tokens: int) -> float:
    """Final norm and LM head (bf16) for the tokens that are sampled."""
    return grouped_gemm_us(hw, 1, tokens, model.vocab, model.hidden, weight_bytes=2.0)
