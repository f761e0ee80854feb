"""GPU: the DeepGEMM expert runners (engine/deepgemm.py) for both DeepEP layouts, and the sliced
signal path on unmodified DeepGEMM. Skipped without CUDA or deep_gemm.

DeepGEMM JIT-compiles one kernel per (N, K, groups, tiling), so the shapes here are few and fixed.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.oracle import fp8 as oracle_fp8

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

FP8_TOL = 1e-3


@pytest.fixture(scope="module")
def dg():
    pytest.importorskip("deep_gemm")
    from sglang_overlap.kernels import deepgemm

    return deepgemm.api()


def _calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = float((x * x + y * y).sum())
    return 0.0 if denom == 0 else 1.0 - 2.0 * float((x * y).sum()) / denom


def _weights(e: int, n: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn((e, n, k), generator=gen, device="cuda") / math.sqrt(k)


def test_api_is_detected(dg) -> None:
    assert dg.flavour in ("grouped", "legacy"), dg
    assert dg.mk_alignment in (64, 128, 256), dg
    assert not dg.native_signal, "a DeepGEMM with a native signal GEMM: use it instead"


def test_masked_gemm_matches_fp64(dg) -> None:
    from sglang_overlap.kernels import deepgemm, fp8

    e, m_cap, n, k = 4, 128, 7168, 2048
    gen = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn((e, m_cap, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    a, a_s = fp8.quant_per_token_group(x)
    b, b_s = fp8.quant_per_block(_weights(e, n, k, 2))
    masked = torch.tensor([128, 0, 37, 64], dtype=torch.int32, device="cuda")
    out = torch.full((e, m_cap, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, expected_m=64)
    torch.cuda.synchronize()
    want = torch.bmm(oracle_fp8.dequant_per_token_group(a, a_s),
                     oracle_fp8.dequant_per_block(b, b_s).transpose(1, 2))
    valid = torch.arange(m_cap, device="cuda")[None, :] < masked[:, None]
    diff = _calc_diff(out[valid], want[valid])
    assert not bool(out[valid].isnan().any()) and diff < FP8_TOL, f"{diff=} {dg.version=}"


def test_fused_signal_gemm_agrees_with_deepgemm(dg) -> None:
    from sglang_overlap.kernels import deepgemm, fp8
    from sglang_overlap.kernels.signal_fused import default_config, grouped_gemm_fp8_signal

    e, m_cap, n, k = 8, 64, 7168, 2048
    gen = torch.Generator(device="cuda").manual_seed(3)
    x = torch.randn((e, m_cap, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    a, a_s = fp8.quant_per_token_group(x)
    b, b_s = fp8.quant_per_block(_weights(e, n, k, 4))
    masked = torch.full((e,), m_cap, dtype=torch.int32, device="cuda")
    ref = torch.empty((e, m_cap, n), dtype=torch.bfloat16, device="cuda")
    got = torch.empty_like(ref)
    deepgemm.masked_gemm(a, a_s, b, b_s, ref, masked, expected_m=m_cap)
    grouped_gemm_fp8_signal(a, a_s, b, b_s, masked, got, config=default_config(m_cap))
    torch.cuda.synchronize()
    assert _calc_diff(got, ref) < 1e-4


def test_contiguous_gemm_matches_fp64(dg) -> None:
    from sglang_overlap.kernels import deepgemm, fp8

    e, n, k = 4, 4096, 2048
    counts = [130, 0, 7, 256]
    align = dg.mk_alignment
    padded = [-(-c // align) * align for c in counts]
    pieces = [torch.where(torch.arange(p) < c, i, -1)
              for i, (c, p) in enumerate(zip(counts, padded, strict=True))]
    m_indices = torch.cat(pieces).int().cuda()
    t = m_indices.numel()
    gen = torch.Generator(device="cuda").manual_seed(5)
    a, a_s = fp8.quant_per_token_group(
        torch.randn((t, k), generator=gen, device="cuda", dtype=torch.bfloat16))
    b, b_s = fp8.quant_per_block(_weights(e, n, k, 6))
    out = torch.full((t, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.contiguous_gemm(a, a_s, b, b_s, out, m_indices)
    torch.cuda.synchronize()
    da, db = oracle_fp8.dequant_per_token_group(a, a_s), oracle_fp8.dequant_per_block(b, b_s)
    valid = m_indices >= 0
    # per expert, [rows, K] @ [K, N]: gathering each row's [N, K] weight (einsum "tk,tnk->tn")
    # held 25.7 GiB of fp64 on an H100 (2026-12-07)
    want = torch.empty((t, n), dtype=torch.float64, device="cuda")
    for i in range(e):
        rows = m_indices == i
        want[rows] = da[rows] @ db[i].T
    diff = _calc_diff(out[valid], want[valid])
    assert not bool(out[valid].isnan().any()) and diff < FP8_TOL, f"{diff=}"


@pytest.mark.parametrize("layout_kind", ["low_latency", "normal"])
def test_expert_pipeline_matches_reference(dg, layout_kind: str) -> None:
    """up GEMM -> SiLU-and-mul + fp8 quant -> down GEMM against an fp64 SwiGLU on the same fp8
    weights and inputs (the fp8 intermediate adds one quantisation, hence the looser bound)."""
    from sglang_overlap.kernels import deepgemm, fp8

    e, m_cap, hidden, inter = 4, 64, 2048, 512
    gen = torch.Generator(device="cuda").manual_seed(9)
    weights = deepgemm.Fp8ExpertWeights.quantize(_weights(e, 2 * inter, hidden, 7),
                                                 _weights(e, hidden, inter, 8))
    x = torch.randn((e, m_cap, hidden), generator=gen, device="cuda", dtype=torch.bfloat16)
    xq, xs = fp8.quant_per_token_group(x)
    w13 = oracle_fp8.dequant_per_block(weights.w13, weights.w13_scale)
    w2 = oracle_fp8.dequant_per_block(weights.w2, weights.w2_scale)
    up = torch.bmm(oracle_fp8.dequant_per_token_group(xq, xs), w13.transpose(1, 2))
    gate, upv = up.chunk(2, dim=-1)
    want = torch.bmm(torch.nn.functional.silu(gate) * upv, w2.transpose(1, 2))  # [E, M, H]
    if layout_kind == "low_latency":
        masked = torch.tensor([64, 3, 0, 40], dtype=torch.int32, device="cuda")
        got = deepgemm.run_masked_experts(xq, xs, masked, 32, weights)
        valid = torch.arange(m_cap, device="cuda")[None, :] < masked[:, None]
        got_v, want_v = got[valid], want[valid]
    else:
        align = dg.mk_alignment
        m_idx = torch.arange(e, device="cuda").repeat_interleave(align).int()
        rows = torch.arange(align, device="cuda").repeat(e)
        m_idx[rows >= m_cap] = -1
        src = (m_idx.clamp(min=0).long(), rows.clamp(max=m_cap - 1))
        xq_rows = xq.view(torch.uint8)[src].view(xq.dtype)  # index as bytes: fp8 indexing
        got = deepgemm.run_contiguous_experts(xq_rows, xs[src].contiguous(), m_idx, weights)
        got_v, want_v = got[m_idx >= 0], want[src][m_idx >= 0]
    torch.cuda.synchronize()
    diff = _calc_diff(got_v, want_v)
    assert not bool(got_v.isnan().any()) and diff < 5e-3, f"{diff=} {layout_kind=}"


@pytest.mark.parametrize("streams", [1, 2])
@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_sliced_deepgemm_signal_with_consumer(dg, granularity: str, streams: int) -> None:
    from sglang_overlap.kernels import deepgemm, signal_sliced
    from sglang_overlap.kernels.signal_sliced import plan_expert_slices

    from .test_signal_gemm import check_overlapped, layout_for, make_case, run_overlapped

    case = make_case(21, 8, 128, 7168, 2048, zero_experts=2)
    layout = layout_for(case, granularity, 64, 128, comm_sms=4)
    assert len(plan_expert_slices(8, 2)) == 4

    def producer(down: torch.Tensor, sig: torch.Tensor) -> None:
        with deepgemm.num_sms_scope(layout.compute_num_sms):
            signal_sliced.sliced_masked_gemm_signal(case.a, case.a_s, case.b, case.b_s, down,
                                               case.masked_m, 64, signal=sig, layout=layout,
                                               slice_experts=2, streams=streams)

    check_overlapped(case, layout, *run_overlapped(case, layout, None, producer=producer))


def _runner_pair(e: int, hidden: int, inter: int):
    from benchmarks.harness.deepgemm_experts import DeepGemmExpertRunner
    from tests.oracle.experts import ReferenceExperts

    runner = DeepGemmExpertRunner(_weights(e, 2 * inter, hidden, 31),
                                  _weights(e, hidden, inter, 32))
    w = runner.weights  # the reference runs on the same fp8 weights, dequantised to fp64
    ref = ReferenceExperts(oracle_fp8.dequant_per_block(w.w13, w.w13_scale),
                           oracle_fp8.dequant_per_block(w.w2, w.w2_scale))
    return runner, ref


@pytest.mark.parametrize("expected_m", [0, 64, 128, 256])
def test_runner_low_latency_matches_reference(dg, expected_m: int) -> None:
    """expected_m 0: no signal; 64 and 128: DeepGEMM slices on two streams (capacity 128 is
    padded past 64 rows, where the fused kernel is slower); 256: DeepGEMM slices on one stream
    (choose_signal_path)."""
    from sglang_overlap.kernels.contracts import LowLatencyDispatchOutput, SignalContract
    from sglang_overlap.kernels.down_gemm import choose_signal_path
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    e, cap, hidden, inter = 4, 128, 2048, 512
    runner, ref = _runner_pair(e, hidden, inter)
    gen = torch.Generator(device="cuda").manual_seed(33)
    x = torch.randn((e, cap, hidden), generator=gen, device="cuda", dtype=torch.bfloat16)
    masked = torch.tensor([128, 0, 77, 5], dtype=torch.int32, device="cuda")
    signal = None
    if expected_m:
        lay = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=64, block_n=128,
                              hidden=hidden, num_sms=132, comm_num_sms=4, granularity="expert")
        signal = SignalContract(lay, "cuda")
    got = runner.run_low_latency(LowLatencyDispatchOutput(x, masked, max(expected_m, 1), None),
                                 signal=signal)
    want = ref.run_low_latency(LowLatencyDispatchOutput(x.double(), masked, 1, None))
    torch.cuda.synchronize()
    valid = torch.arange(cap, device="cuda")[None, :] < masked[:, None]
    diff = _calc_diff(got[valid], want[valid])
    assert got.dtype == torch.bfloat16 and diff < 5e-3, f"{diff=} {expected_m=}"
    if signal is not None:
        plan = choose_signal_path(e, expected_m, cap)
        assert signal.signal.view(torch.int32).tolist() == [lay.expect_value] * e, plan


def test_runner_normal_matches_reference(dg) -> None:
    from sglang_overlap.kernels.contracts import NormalDispatchOutput

    e, hidden, inter = 4, 2048, 512
    runner, ref = _runner_pair(e, hidden, inter)
    counts = torch.tensor([5, 0, 130, 1], device="cuda")
    row_expert = torch.cat([torch.arange(e, device="cuda").repeat_interleave(counts),
                            torch.full((3,), -1, device="cuda")]).int()  # 3 padding rows
    gen = torch.Generator(device="cuda").manual_seed(34)
    x = torch.randn((row_expert.numel(), hidden), generator=gen, device="cuda",
                    dtype=torch.bfloat16)
    got = runner.run_normal(NormalDispatchOutput(x, row_expert, counts.int(), None))
    want = ref.run_normal(NormalDispatchOutput(x.double(), row_expert, counts.int(), None))
    torch.cuda.synchronize()
    valid = row_expert >= 0
    diff = _calc_diff(got[valid], want[valid])
    assert diff < 5e-3 and bool((got[~valid] == 0).all()), f"{diff=}"
