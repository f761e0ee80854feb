"""GPU: every SBO signal producer through the served entry `down_gemm.signal_down_gemm`, on the
installed deep_gemm release (run once per release: benchmarks/run_gpu.sh releases).

Producers: deepgemm (DeepGEMM's kernel with the release's signal patch, where `producer_for`
serves it), fused (the Triton kernel), sliced (DeepGEMM's own launch per expert slice; only
where the release's `_C.so` loads). Shapes: DeepGEMM's own masked-GEMM test shapes (its tests'
`enumerate_m_grouped_masked`: groups x expected m, four (N, K), max_m 4096, masked_m drawn in
[0.7, 1.3] x m) and its criterion `calc_diff < 0.001` against the dequantised fp32 product, plus
the DeepSeek-V3 down projection. Every output is NaN-poisoned first; every signal must end at
exactly its final value; a consumer spinning on the signals must never read a poisoned row.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from tests.gpu.test_signal_gemm import (
    FP8_TOL,
    calc_diff,
    check_overlapped,
    make_case,
    run_overlapped,
    valid_rows,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              # make_case at E 32 x C 256 x N 7168 x K 2048, fp32 reference
              pytest.mark.gpu_mem(10)]

MAX_M = 4096
DG_GROUPS = [(32, 192), (6, 1024), (32, 20), (6, 20)]  # DeepGEMM's (num_groups, expected m)
DG_NK = [(6144, 7168), (7168, 3072), (4096, 4096), (4096, 2048)]
COMM_SMS = 4


def _deep_gemm_loads() -> str | None:
    try:
        from sglang_overlap.kernels import deepgemm

        deepgemm.api()
    except Exception as exc:  # noqa: BLE001 - any import failure means: no DeepGEMM launch
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


def producers() -> list[str]:
    from sglang_overlap.kernels.signal_deepgemm import probe

    out = ["fused"]
    if probe() is None and torch.cuda.get_device_capability() == (9, 0):
        out.append("deepgemm")
    elif os.environ.get("SGLANG_OVERLAP_REQUIRE_DGSIGNAL") == "1":
        raise RuntimeError(f"SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1: {probe()}")
    if _deep_gemm_loads() is None:
        out.append("sliced")
    return out


PRODUCERS = producers() if torch.cuda.is_available() else []


def plan_for(producer: str, e: int, expected_m: int, cap: int, k: int):
    from sglang_overlap.kernels.down_gemm import SignalPlan, dg_signal_config

    if producer == "deepgemm":
        return SignalPlan("deepgemm", dg_config=dg_signal_config(e, expected_m, cap, k))
    if producer == "sliced":
        return SignalPlan("sliced", max(1, e // 4), 2)
    return SignalPlan("fused")


def layout_of(plan, case, expected_m: int, granularity: str):
    from sglang_overlap.kernels.capabilities import device_num_sms
    from sglang_overlap.kernels.down_gemm import plan_tiles
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    e, cap, _ = case.a.shape
    block_m, block_n = plan_tiles(plan, expected_m, granularity)  # type: ignore[arg-type]
    return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=block_m, block_n=block_n,
                           hidden=case.b.shape[1], num_sms=device_num_sms(),
                           comm_num_sms=COMM_SMS, granularity=granularity)  # type: ignore[arg-type]


def run(plan, case, layout, expected_m: int, out=None, signal=None):
    from sglang_overlap.kernels.down_gemm import signal_down_gemm
    from sglang_overlap.kernels.signals import new_signal

    e, cap, _ = case.a.shape
    if out is None:
        out = torch.full((e, cap, case.b.shape[1]), float("nan"), dtype=torch.bfloat16,
                         device="cuda")
    if signal is None:
        signal = new_signal(layout, "cuda")
    ran = signal_down_gemm(case.a, case.a_s, case.b, case.b_s, out, case.masked_m, expected_m,
                           signal=signal, layout=layout, plan=plan)
    assert ran.path == plan.path, f"asked for {plan.path}, ran {ran.path}: {ran.why}"
    return out, signal


def fp32_reference(case, valid) -> torch.Tensor:
    from tests.oracle import fp8

    out = torch.zeros(case.a.shape[0], case.a.shape[1], case.b.shape[1], device="cuda")
    for g in range(case.a.shape[0]):
        m = int(case.masked_m[g])
        if m:
            a = fp8.dequant_per_token_group(case.a[g:g + 1, :m], case.a_s[g:g + 1, :m],
                                             torch.float32)[0]
            b = fp8.dequant_per_block(case.b[g:g + 1], case.b_s[g:g + 1], torch.float32)[0]
            out[g, :m] = a @ b.T
    return out


def deepgemm_masked_case(seed: int, groups: int, m: int, n: int, k: int):
    case = make_case(seed, groups, MAX_M, n, k)
    rng = random.Random(seed)
    case.masked_m = torch.tensor([int(m * rng.uniform(0.7, 1.3)) for _ in range(groups)],
                                 dtype=torch.int32, device="cuda")
    return case


def check_signals(sig: torch.Tensor, layout, msg: str) -> None:
    got = sig.view(torch.int32).tolist()
    assert got == [layout.expect_value] * layout.num_signals, f"signals {got}: {msg}"


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize(("n", "k"), DG_NK)
@pytest.mark.parametrize(("groups", "m"), DG_GROUPS)
@pytest.mark.parametrize("producer", PRODUCERS)
# 32 groups x 4096 rows x N 6144 x K 7168: fp32 quantisation, reference; 26.7 GiB on an H100
@pytest.mark.gpu_mem(28)
def test_deepgemm_masked_shapes(producer: str, groups: int, m: int, n: int, k: int,
                                granularity: str) -> None:
    case = deepgemm_masked_case(groups * 131 + m + n + k, groups, m, n, k)
    plan = plan_for(producer, groups, m, MAX_M, k)
    layout = layout_of(plan, case, m, granularity)
    out, sig = run(plan, case, layout, m)
    torch.cuda.synchronize()
    valid = valid_rows(case)
    msg = f"{producer=} {groups=} {m=} {n=} {k=} {granularity=}"
    assert not bool(out[valid].isnan().any()), f"unwritten valid rows: {msg}"
    diff = calc_diff(out[valid], fp32_reference(case, valid)[valid])
    assert diff < FP8_TOL, f"{diff=} {msg}"
    check_signals(sig, layout, msg)
    del case, out


DSV3 = [(8, 64, 64), (8, 256, 200), (16, 128, 128), (32, 256, 256), (32, 64, 16)]  # E, C, rows


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize("shape", DSV3, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("producer", PRODUCERS)
def test_consumer_never_reads_a_poisoned_row(producer: str, shape: tuple, granularity: str) -> None:
    """A consumer spinning on the signals on its own SMs, launched before the producer, sums NaN
    if any unit is final before its rows are in memory; zero-token experts included."""
    e, cap, rows = shape
    case = make_case(7 * e + cap, e, cap, 7168, 2048, zero_experts=min(e // 4, 3))
    case.masked_m.clamp_(max=rows)
    plan = plan_for(producer, e, rows, cap, 2048)
    layout = layout_of(plan, case, rows, granularity)

    def producer_fn(down: torch.Tensor, sig: torch.Tensor) -> None:
        run(plan, case, layout, rows, out=down, signal=sig)

    check_overlapped(case, layout, *run_overlapped(case, layout, None, producer=producer_fn))


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize("producer", PRODUCERS)
def test_zero_token_experts(producer: str, granularity: str) -> None:
    """All experts empty: nothing written, every unit still final (nothing waits forever)."""
    case = make_case(5, 8, 256, 7168, 2048, zero_experts=8)
    plan = plan_for(producer, 8, 1, 256, 2048)
    layout = layout_of(plan, case, 1, granularity)
    out, sig = run(plan, case, layout, 1)
    torch.cuda.synchronize()
    if producer != "sliced":  # DeepGEMM's own launch may write padding rows of empty experts
        assert bool(out.isnan().all()), "an empty expert was written"
    check_signals(sig, layout, f"{producer=} {granularity=}")


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize("producer", PRODUCERS)
def test_cuda_graph_replay(producer: str, granularity: str) -> None:
    """Captured once, replayed with the signal re-zeroed: same valid rows, every unit final."""
    from sglang_overlap.kernels.signals import new_signal

    case = make_case(9, 16, 256, 7168, 2048, zero_experts=3)
    case.masked_m.clamp_(max=48)
    plan = plan_for(producer, 16, 32, 256, 2048)
    layout = layout_of(plan, case, 32, granularity)
    sig = new_signal(layout, "cuda")
    out = torch.full((16, 256, 7168), float("nan"), dtype=torch.bfloat16, device="cuda")
    run(plan, case, layout, 32, out=out, signal=sig)  # build and load outside the capture
    torch.cuda.synchronize()
    first = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sig.zero_()
        run(plan, case, layout, 32, out=out, signal=sig)
    valid = valid_rows(case)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_signals(sig, layout, f"{producer=} {granularity=}")
        assert torch.equal(out[valid], first[valid])
