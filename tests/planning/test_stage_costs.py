"""Tests for planning/cost/stage_costs.py: the per-kernel rooflines of one MoE layer.

The hardware here is synthetic with round numbers (fp8 peak x efficiency = 5e8 flop/us, HBM x
efficiency = 5e5 B/us, NVLink 5e4 B/us, NIC 2.5e4 B/us) so each expected value is worked out by
hand from the module's contract: `fixed + max(bytes / bandwidth, flops / peak)`, rows padded to
block_m per group, transfers a latency plus the slower of NVLink and NIC, balanced routing, and
prefill compute (not transfers) scaled by the profile's prefill_compute_scale.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from sglang_overlap.planning.cost import stage_costs as sc
from sglang_overlap.planning.cost.profiles import Deployment, HardwareProfile, ModelProfile
from sglang_overlap.planning.cost.stage_costs import (
    SCALE_GROUP,
    MicroBatch,
    attention_core_us,
    dense_layer_us,
    grouped_gemm_us,
    head_us,
    memory_kernel_us,
    stage_costs,
    transfer_us,
)

HW = HardwareProfile(
    name="round", arch="hopper", num_sms=100, fp8_tflops=1000.0, bf16_tflops=500.0,
    hbm_gbps=1000.0, nvlink_gbps=100.0, rdma_gbps=50.0, gemm_efficiency=0.5,
    attn_efficiency=0.5, hbm_efficiency=0.5, nvlink_efficiency=0.5, rdma_efficiency=0.5,
    gemm_fixed_us=3.0, kernel_us=2.0, a2a_latency_us=10.0, a2a_kernel_us=4.0, block_m=64,
    contiguous_block_m=128, sbo_comm_sms=20, deepep_normal_sms=24,
    prefill_compute_scale=1.5, prefill_a2a_exposed=0.2)
FAST_HBM = dataclasses.replace(HW, hbm_gbps=1e6)  # 5e8 B/us: GEMMs become compute-bound

GQA = ModelProfile(
    name="tiny-gqa", hidden=256, num_layers=4, num_dense_layers=1, num_experts=16, topk=2,
    moe_intermediate=128, num_shared_experts=0, dense_intermediate=512, vocab=1000,
    attn_kind="gqa", num_heads=8, num_kv_heads=2, head_dim=32, v_head_dim=32, rope_head_dim=0,
    q_lora_rank=0, kv_lora_rank=0)
MLA = dataclasses.replace(
    GQA, name="tiny-mla", attn_kind="mla", num_kv_heads=1, head_dim=32, v_head_dim=32,
    rope_head_dim=16, q_lora_rank=64, kv_lora_rank=64, num_shared_experts=1)


# --- the rooflines ------------------------------------------------------------------------------

def test_grouped_gemm_memory_bound_pads_nothing_in_bytes() -> None:
    # 2 groups of 10 x 128 x 256: flops on 2 x 64 padded rows = 8,388,608 -> 0.0168 us;
    # bytes 2 x (128*256 weights + 10*256 in + 10*128*2 out) = 75,776 -> 0.151552 us
    assert grouped_gemm_us(HW, 2, 10, 128, 256) == pytest.approx(3.0 + 0.151552, rel=1e-12)
    # bf16 weights double the weight bytes: 2 x (65,536 + 2,560 + 2,560) = 141,312
    assert grouped_gemm_us(HW, 2, 10, 128, 256, weight_bytes=2.0) == pytest.approx(
        3.0 + 141312 / 5e5, rel=1e-12)


def test_grouped_gemm_compute_bound_pads_rows_to_block_m_and_shares_sms() -> None:
    n = k = 4096
    def compute(rows: int) -> float:
        return 2.0 * rows * n * k / 5e8
    # 4000 rows pad to 63 x 64 = 4032 (default block_m) or 32 x 128 = 4096
    assert grouped_gemm_us(HW, 1, 4000, n, k) == pytest.approx(3.0 + compute(4032), rel=1e-12)
    assert grouped_gemm_us(HW, 1, 4000, n, k, block_m=128) == pytest.approx(
        3.0 + compute(4096), rel=1e-12)
    # half the SMs: the compute-bound part takes twice as long
    assert grouped_gemm_us(HW, 1, 4000, n, k, sms=50) == pytest.approx(
        3.0 + 2 * compute(4032), rel=1e-12)
    assert grouped_gemm_us(HW, 1, 4000, n, k, sms=100) == grouped_gemm_us(HW, 1, 4000, n, k)
    # 3 groups of a fractional mean 0.5 row: each pads to a full block
    assert grouped_gemm_us(HW, 3, 0.5, n, k) == pytest.approx(
        3.0 + max(compute(3 * 64), 3 * (n * k + 0.5 * k + 0.5 * n * 2) / 5e5), rel=1e-12)


def test_grouped_gemm_with_no_rows_still_reads_its_weights() -> None:
    assert grouped_gemm_us(HW, 4, 0, 128, 256) == pytest.approx(3.0 + 4 * 128 * 256 / 5e5)


def test_small_decode_batches_pay_the_same_padded_gemm() -> None:
    """Eight rows per expert pad to the same 64 as sixteen do: halving costs the compute."""
    n = k = 8192
    one, half = grouped_gemm_us(FAST_HBM, 8, 16, n, k), grouped_gemm_us(FAST_HBM, 8, 8, n, k)
    assert one == pytest.approx(half, rel=1e-12)
    assert one == pytest.approx(3.0 + 2.0 * 8 * 64 * n * k / 5e8, rel=1e-12)


def test_memory_kernel_attention_core_and_transfer() -> None:
    assert memory_kernel_us(HW, 1e6) == pytest.approx(2.0 + 2.0)
    assert memory_kernel_us(HW, 1e6, kernels=3) == pytest.approx(6.0 + 2.0)
    assert memory_kernel_us(HW, 1e6, kernels=0) == pytest.approx(2.0)
    # attention: bf16 peak x efficiency = 2.5e8 flop/us against 5e5 B/us
    assert attention_core_us(HW, 5e8, 1e5) == pytest.approx(2.0 + 2.0)
    assert attention_core_us(HW, 5e7, 1e6) == pytest.approx(2.0 + 2.0)
    # transfers: latency plus the slower of NVLink (5e4 B/us) and NIC (2.5e4 B/us)
    assert transfer_us(HW, 1e5, 0.0) == pytest.approx(10.0 + 2.0)
    assert transfer_us(HW, 1e5, 1e5) == pytest.approx(10.0 + 4.0)
    assert transfer_us(HW, 1e6, 1e4) == pytest.approx(10.0 + 20.0)
    assert transfer_us(HW, 0.0, 0.0) == pytest.approx(10.0)


# --- routing: expected destinations -------------------------------------------------------------

@pytest.mark.parametrize(("total", "members", "topk"), [(8, 2, 3), (12, 4, 2), (8, 1, 2)])
def test_distinct_hits_is_the_expected_number_of_groups_hit(total: int, members: int,
                                                           topk: int) -> None:
    picks = list(itertools.combinations(range(total), topk))
    brute = sum(len({e // members for e in p}) for p in picks) / len(picks)
    assert sc._distinct_hits(total, members, topk) == pytest.approx(brute, rel=1e-12)
    assert sc._distinct_hits(total, total, topk) == 1.0
    assert sc._distinct_hits(total, 2 * total, topk) == 1.0


def test_traffic_low_latency_sends_one_message_per_token_and_expert() -> None:
    deploy = Deployment(ep_size=16, gpus_per_node=8)  # half the ranks on the other node
    assert sc._traffic(GQA, deploy, 10.0, 100.0, True) == pytest.approx((1000.0, 1000.0))
    one_node = Deployment(ep_size=8, gpus_per_node=8)
    assert sc._traffic(GQA, one_node, 10.0, 100.0, True) == pytest.approx((2000.0, 0.0))
    assert sc._traffic(GQA, Deployment(ep_size=1), 10.0, 100.0, True) == (0.0, 0.0)
    assert sc._traffic(GQA, Deployment(ep_size=1), 10.0, 100.0, False) == (0.0, 0.0)


def test_traffic_normal_mode_sends_one_copy_per_rank_and_per_remote_node() -> None:
    deploy = Deployment(phase="prefill", ep_size=4, gpus_per_node=2)
    # 16 experts, 4 per rank, 8 per node, top-2: brute-force the distinct ranks and nodes hit
    picks = list(itertools.combinations(range(16), 2))
    ranks = sum(len({e // 4 for e in p}) for p in picks) / len(picks)
    nodes = sum(len({e // 8 for e in p}) for p in picks) / len(picks)
    local, remote = sc._traffic(GQA, deploy, 10.0, 100.0, False)
    assert local == pytest.approx(10.0 * ranks * 100.0, rel=1e-12)
    assert remote == pytest.approx(10.0 * nodes * 0.5 * 100.0, rel=1e-12)
    # gpus_per_node above ep_size counts as one node: nothing crosses the NIC
    assert sc._traffic(GQA, Deployment(ep_size=4, gpus_per_node=8), 10.0, 100.0, False)[1] == 0


# --- one layer ----------------------------------------------------------------------------------

def _decode_mb(seqs: int = 8, kv: int = 1024) -> MicroBatch:
    return MicroBatch(q_lens=(1,) * seqs, kv_lens=(kv,) * seqs, moe_tokens=float(seqs),
                      causal=False)


def test_micro_batch_counts_query_tokens() -> None:
    assert MicroBatch(q_lens=(3, 5), kv_lens=(10, 5), moe_tokens=8.0, causal=True).num_tokens == 8


def test_moe_stages_assume_balanced_routing() -> None:
    deploy = Deployment(phase="decode", ep_size=4, gpus_per_node=8)
    mb = MicroBatch(q_lens=(1,) * 32, kv_lens=(100,) * 32, moe_tokens=48.0, causal=False)
    s = stage_costs(GQA, HW, deploy, mb)
    m = 48.0 * 2 * 4 / 16  # rows per local expert: tokens x topk x ep / experts = 24
    assert s.gate_up == grouped_gemm_us(HW, 4, m, 256, 256, block_m=64)
    assert s.down == grouped_gemm_us(HW, 4, m, 256, 128, block_m=64)
    assert s.down_sbo == grouped_gemm_us(HW, 4, m, 256, 128, block_m=64, sms=80)
    assert s.act == pytest.approx(2.0 + 4 * m * (128 * 4 + 128) / 5e5, rel=1e-12)
    assert s.gate == pytest.approx(grouped_gemm_us(HW, 1, 32, 16, 256, weight_bytes=2.0)
                                   + 2.0 + 32 * 16 * 4 / 5e5, rel=1e-12)
    fp8_row = 256 + 256 / SCALE_GROUP * 4
    assert fp8_row == 264
    assert s.dispatch_send == s.combine_send == 4.0
    # one node: low-latency traffic is all NVLink, moe_tokens x topk rows
    assert s.dispatch_xfer == pytest.approx(10.0 + 48 * 2 * fp8_row / 5e4, rel=1e-12)
    assert s.combine_xfer == pytest.approx(10.0 + 48 * 2 * 256 * 2 / 5e4, rel=1e-12)
    assert s.dispatch_recv == pytest.approx(4.0 + 4 * m * fp8_row / 5e5, rel=1e-12)
    assert s.combine_recv == pytest.approx(4.0 + 32 * 2 * 256 * 2 / 5e5, rel=1e-12)
    assert s.output == pytest.approx(2.0 + 3 * 32 * 256 * 2 / 5e5, rel=1e-12)
    assert s.shared == 0.0 and s.a2a_exposed == 0.0 and s.sbo_units == 1


def test_sbo_down_gemm_runs_on_the_sms_left_to_it() -> None:
    deploy = Deployment(phase="decode", ep_size=4, gpus_per_node=8)
    big = dataclasses.replace(GQA, hidden=4096, moe_intermediate=4096)
    mb = MicroBatch(q_lens=(1,) * 512, kv_lens=(10,) * 512, moe_tokens=512.0, causal=False)
    s = stage_costs(big, FAST_HBM, deploy, mb, sbo_units=7)
    assert s.sbo_units == 7
    assert s.down_sbo > s.down  # compute-bound: 80 of 100 SMs
    assert s.down_sbo - 3.0 == pytest.approx((s.down - 3.0) * 100 / 80, rel=1e-12)
    on60 = stage_costs(big, FAST_HBM, deploy, mb, sms=60)
    assert on60.down - 3.0 == pytest.approx((s.down - 3.0) * 100 / 60, rel=1e-12)
    assert on60.down_sbo - 3.0 == pytest.approx((s.down - 3.0) * 100 / 40, rel=1e-12)


def test_shared_experts_are_priced_only_when_the_model_has_them() -> None:
    deploy = Deployment(phase="decode", ep_size=4, gpus_per_node=8)
    mb = _decode_mb()
    with_shared = dataclasses.replace(GQA, num_shared_experts=2)
    s = stage_costs(with_shared, HW, deploy, mb)
    want = (grouped_gemm_us(HW, 1, 8, 512, 256) + 2.0 + 8 * 3 * 256 / 5e5
            + grouped_gemm_us(HW, 1, 8, 256, 256))
    assert s.shared == pytest.approx(want, rel=1e-12)
    assert stage_costs(GQA, HW, deploy, mb).shared == 0.0


def test_prefill_scales_compute_not_transfers() -> None:
    """With equal block sizes, prefill's compute stages are prefill_compute_scale x decode's."""
    hw = dataclasses.replace(HW, contiguous_block_m=64)
    mb = MicroBatch(q_lens=(64, 64), kv_lens=(64, 64), moe_tokens=128.0, causal=True)
    dec = stage_costs(MLA, hw, Deployment(phase="decode", ep_size=4, gpus_per_node=2), mb)
    pre = stage_costs(MLA, hw, Deployment(phase="prefill", ep_size=4, gpus_per_node=2), mb)
    for f in ("attn_prep", "attn_core", "gate", "shared", "gate_up", "act", "down", "down_sbo",
              "output"):
        assert getattr(pre, f) == pytest.approx(1.5 * getattr(dec, f), rel=1e-12), f
    for f in ("dispatch_recv", "combine_recv"):
        assert getattr(pre, f) - 4.0 == pytest.approx(1.5 * (getattr(dec, f) - 4.0), rel=1e-12)
    assert pre.dispatch_send == dec.dispatch_send == 4.0
    assert pre.a2a_exposed == 0.2 and dec.a2a_exposed == 0.0
    # prefill uses normal-mode traffic: one copy per destination rank, not per expert
    local, remote = sc._traffic(MLA, Deployment(phase="prefill", ep_size=4, gpus_per_node=2),
                                128.0, 264.0, False)
    assert pre.dispatch_xfer == transfer_us(hw, local, remote)
    assert dec.dispatch_xfer == pytest.approx(10.0 + 128 * 2 * 0.5 * 264 / 2.5e4, rel=1e-12)


def test_prefill_pads_expert_rows_to_the_contiguous_block() -> None:
    mb = MicroBatch(q_lens=(8,), kv_lens=(8,), moe_tokens=8.0, causal=True)
    deploy = Deployment(phase="prefill", ep_size=4, gpus_per_node=8)
    big = dataclasses.replace(GQA, hidden=8192, moe_intermediate=8192)
    s = stage_costs(big, FAST_HBM, deploy, mb)
    m = 8.0 * 2 * 4 / 16
    assert s.down == pytest.approx(1.5 * (3.0 + 2.0 * 4 * 128 * 8192 * 8192 / 5e8), rel=1e-12)
    assert s.gate_up == pytest.approx(1.5 * grouped_gemm_us(FAST_HBM, 4, m, 2 * 8192, 8192,
                                                            block_m=128), rel=1e-12)


def test_attention_tp_splits_heads_and_moe_tokens() -> None:
    """Without DP attention, attention runs TP over a node: heads and MoE tokens divide by it."""
    mb = _decode_mb(seqs=64)
    dp = stage_costs(GQA, HW, Deployment(ep_size=4, gpus_per_node=4, dp_attention=True), mb)
    tp = stage_costs(GQA, HW, Deployment(ep_size=4, gpus_per_node=4, dp_attention=False), mb)
    assert tp.gate_up == grouped_gemm_us(HW, 4, 64 / 4 * 2 * 4 / 16, 256, 256, block_m=64)
    assert dp.gate_up == grouped_gemm_us(HW, 4, 64 * 2 * 4 / 16, 256, 256, block_m=64)
    # tp 4: 2 query heads, 1 KV head -> qkv projection of (2 + 2) x 32 columns
    want_prep = grouped_gemm_us(HW, 1, 64, 4 * 32, 256) + 2 * 2.0 + 2 * 64 * 256 * 2 / 5e5
    assert tp.attn_prep == pytest.approx(want_prep, rel=1e-12)


def test_gqa_decode_attention_reads_the_kv_cache() -> None:
    mb = _decode_mb(seqs=8, kv=1000)
    s = stage_costs(GQA, HW, Deployment(ep_size=4), mb)
    # qkv: (8 + 2 x 2) heads x 32; norms and rope: two kernels over 2 x t x h x 2 bytes
    prep = grouped_gemm_us(HW, 1, 8, 12 * 32, 256) + 2 * 2.0 + 2 * 8 * 256 * 2 / 5e5
    assert s.attn_prep == pytest.approx(prep, rel=1e-12)
    kv_bytes = 8 * 1000 * 2 * 2 * 32 * 2.0
    flops = 2.0 * 8 * 2 * 32 * 8 * 1000
    core = 2.0 + max(flops / 2.5e8, kv_bytes / 5e5) + grouped_gemm_us(HW, 1, 8, 256, 8 * 32)
    assert s.attn_core == pytest.approx(core, rel=1e-12)


def test_causal_attention_sees_the_prefix_and_half_its_own_chunk() -> None:
    compute_bound = dataclasses.replace(HW, hbm_gbps=1e9)
    q, prefix = 512, 1000
    mb = MicroBatch(q_lens=(q,), kv_lens=(prefix + q,), moe_tokens=float(q), causal=True)
    flat = dataclasses.replace(mb, causal=False)
    dep = Deployment(phase="decode", ep_size=4)  # phase only scales; causal is the batch's
    causal_core = stage_costs(GQA, compute_bound, dep, mb).attn_core
    full_core = stage_costs(GQA, compute_bound, dep, flat).attn_core
    per_kv = 2.0 * 8 * 2 * 32 / 2.5e8  # flops per (query, key) pair, in us
    assert full_core - causal_core == pytest.approx(
        per_kv * (q * (prefix + q) - q * (prefix + (q + 1) / 2)), rel=1e-9)


def test_mla_decode_absorbs_kv_b_and_prefill_expands_it() -> None:
    dep = Deployment(phase="decode", ep_size=4)
    dec = MicroBatch(q_lens=(1,) * 4, kv_lens=(100,) * 4, moe_tokens=4.0, causal=False)
    s = stage_costs(MLA, HW, dep, dec)
    qk, latent = 32 + 16, 64 + 16
    q_params = 256 * 64 + 64 * 8 * qk
    prep = (grouped_gemm_us(HW, 1, 4, q_params // 256, 256)
            + grouped_gemm_us(HW, 1, 4, latent, 256)
            + grouped_gemm_us(HW, 8, 4, 64, 32, weight_bytes=2.0)
            + 2 * 2.0 + 2 * 4 * 256 * 2 / 5e5)
    assert s.attn_prep == pytest.approx(prep, rel=1e-12)
    flops = 2.0 * 8 * (latent + 64) * 400
    core = (2.0 + max(flops / 2.5e8, 400 * latent * 2.0 / 5e5)
            + grouped_gemm_us(HW, 8, 4, 32, 64, weight_bytes=2.0)
            + grouped_gemm_us(HW, 1, 4, 256, 8 * 32))
    assert s.attn_core == pytest.approx(core, rel=1e-12)
    # prefill: MHA over the expanded KV (kv_b for every KV token), no absorbed output GEMM
    pre = MicroBatch(q_lens=(4,), kv_lens=(10,), moe_tokens=4.0, causal=True)
    p = stage_costs(MLA, HW, dep, pre)
    kv_work = 4 * (10 - 4 + 2.5)
    prep = (grouped_gemm_us(HW, 1, 4, q_params // 256, 256)
            + grouped_gemm_us(HW, 1, 4, latent, 256)
            + grouped_gemm_us(HW, 1, 10, 8 * (32 + 32), 64)
            + 2 * 2.0 + 2 * 4 * 256 * 2 / 5e5)
    assert p.attn_prep == pytest.approx(prep, rel=1e-12)
    core = (2.0 + max(2.0 * 8 * (qk + 32) * kv_work / 2.5e8, 10 * latent * 2.0 / 5e5)
            + grouped_gemm_us(HW, 1, 4, 256, 8 * 32))
    assert p.attn_core == pytest.approx(core, rel=1e-12)
    # without q compression the query projection is one h x heads x qk GEMM
    no_lora = stage_costs(dataclasses.replace(MLA, q_lora_rank=0), HW, dep, dec)
    assert no_lora.attn_prep - s.attn_prep == pytest.approx(
        grouped_gemm_us(HW, 1, 4, 8 * qk, 256) - grouped_gemm_us(HW, 1, 4, q_params // 256, 256),
        rel=1e-9, abs=1e-12)


def test_dense_layer_and_head() -> None:
    mb = _decode_mb(seqs=16, kv=100)
    dec = dense_layer_us(GQA, HW, Deployment(phase="decode", ep_size=4), mb)
    layer = stage_costs(GQA, HW, Deployment(phase="decode", ep_size=4), mb)
    mlp = grouped_gemm_us(HW, 1, 16, 1024, 256) + grouped_gemm_us(HW, 1, 16, 256, 512)
    mem = 2 * 2.0 + (16 * 3.0 * 512 + 3.0 * 16 * 256 * 2) / 5e5
    assert dec == pytest.approx(layer.attn_prep + layer.attn_core + mlp + mem, rel=1e-12)
    pre = dense_layer_us(GQA, HW, Deployment(phase="prefill", ep_size=4), mb)
    assert pre == pytest.approx(1.5 * dec, rel=1e-12)
    assert head_us(GQA, HW, 16) == grouped_gemm_us(HW, 1, 16, 1000, 256, weight_bytes=2.0)
    assert head_us(GQA, HW, 16) == pytest.approx(3.0 + (1000 * 256 * 2 + 16 * 256 + 16 * 1000 * 2)
                                                 / 5e5, rel=1e-12)
    assert math.isfinite(dec)
