"""GPU: the served patched-DeepGEMM producer against DeepGEMM's own launch of the installed release.

`deep_gemm.fp8_m_grouped_gemm_nt_masked` (its own heuristics and JIT, on the torch 2.14.1 that
sgl-deep-gemm 0.2.x pins) is the reference users compare against; run once per release
(benchmarks/run_gpu.sh dgown: sgl-deep-gemm 0.2.3.post2 and 0.2.5). DeepSeek-V3 down
projection (N 7168, K 2048), E 8 / 16 / 32, rows 32 / 64 / 128 / 256 (the benchmark's shapes,
so DeepGEMM's JIT cache serves both), capacity = rows rounded up to 64, masked_m drawn in
[0.7, 1.3] x rows with empty experts. Per shape and signal form, through
`down_gemm.signal_down_gemm` with the served plan and layout: the valid rows within DeepGEMM's
own tolerance (calc_diff < 1e-3) of its launch and of the dequantised fp32 product, no valid row
left NaN, every signal at exactly its final value.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from tests.gpu.test_signal_down_gemm import fp32_reference
from tests.gpu.test_signal_gemm import FP8_TOL, calc_diff, make_case, valid_rows

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              # make_case at E 32 x C 256 x N 7168 x K 2048, fp32 reference
              pytest.mark.gpu_mem(10)]

N, K = 7168, 2048
COMM_SMS = 4
SHAPES = [(e, rows) for e in (8, 16, 32) for rows in (32, 64, 128, 256)]
REQUIRE_ENV = "SGLANG_OVERLAP_REQUIRE_DGOWN"


def capacity(rows: int) -> int:
    return max(64, -(-rows // 64) * 64)


def unavailable() -> str | None:
    """Why this file cannot run here (None: it can)."""
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels.signal_deepgemm import probe

    if torch.cuda.get_device_capability() != (9, 0):
        return "the patched producer is SM90 only"
    why = probe()
    if why:
        return f"the patched producer: {why}"
    try:
        deepgemm.api()
    except Exception as exc:  # noqa: BLE001 - any import failure: no DeepGEMM launch here
        return f"DeepGEMM's own launch does not load: {type(exc).__name__}: {str(exc)[:200]}"
    return None


@pytest.fixture(scope="module")
def ready() -> None:
    why = unavailable()
    if why and os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1: {why}")
    if why:
        pytest.skip(why)


def served_layout(e: int, rows: int, granularity: str):
    from sglang_overlap.kernels.capabilities import device_num_sms
    from sglang_overlap.kernels.down_gemm import signal_layout

    return signal_layout(num_local_experts=e, capacity=capacity(rows), hidden=N,
                         expected_m=rows, granularity=granularity,  # type: ignore[arg-type]
                         num_sms=device_num_sms(), comm_num_sms=COMM_SMS)


def dg_case(e: int, rows: int):
    seed = 35_000 + e * 1000 + rows
    case = make_case(seed, e, capacity(rows), N, K, zero_experts=max(1, e // 8))
    rng = random.Random(seed)
    empty = case.masked_m.cpu() == 0  # the zero-token experts make_case chose
    drawn = torch.tensor([min(capacity(rows), max(1, int(rows * rng.uniform(0.7, 1.3))))
                          for _ in range(e)], dtype=torch.int32)
    case.masked_m.copy_(drawn.masked_fill(empty, 0))
    return case


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize(("e", "rows"), SHAPES, ids=lambda v: str(v))
def test_served_producer_matches_deepgemms_own_launch(ready: None, e: int, rows: int,
                                                      granularity: str) -> None:
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels.down_gemm import choose_signal_path, signal_down_gemm
    from sglang_overlap.kernels.signals import new_signal

    case = dg_case(e, rows)
    cap = capacity(rows)
    plan = choose_signal_path(e, rows, cap)
    assert plan.path == "deepgemm", plan
    layout = served_layout(e, rows, granularity)
    own = torch.full((e, cap, N), float("nan"), dtype=torch.bfloat16, device="cuda")
    deepgemm.masked_gemm(case.a, case.a_s, case.b, case.b_s, own, case.masked_m, rows)
    out = torch.full_like(own, float("nan"))
    sig = new_signal(layout, "cuda")
    ran = signal_down_gemm(case.a, case.a_s, case.b, case.b_s, out, case.masked_m, rows,
                           signal=sig, layout=layout)
    torch.cuda.synchronize()
    valid = valid_rows(case)
    msg = (f"deep_gemm {deepgemm.api().version} {e=} {rows=} {cap=} {granularity=} "
           f"config={ran.dg_config}")
    assert ran.path == "deepgemm", f"{ran.why}: {msg}"
    assert not bool(out[valid].isnan().any()), f"unwritten valid rows: {msg}"
    assert not bool(own[valid].isnan().any()), f"DeepGEMM left valid rows unwritten: {msg}"
    diff_own = calc_diff(out[valid], own[valid])
    diff_ref = calc_diff(out[valid], fp32_reference(case, valid)[valid])
    assert diff_own < FP8_TOL and diff_ref < FP8_TOL, f"{diff_own=} {diff_ref=} {msg}"
    got = sig.view(torch.int32).tolist()
    assert got == [layout.expect_value] * layout.num_signals, f"signals {got}: {msg}"
