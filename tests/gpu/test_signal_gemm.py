"""GPU: the fused signal-emitting fp8 GEMM (engine/signal_gemm.py) and the consumer
(engine/combine_consumer.py). Skipped without CUDA + Triton.

Every output is poisoned with NaN before a run; a consumer that reads a unit before it is final
sums NaN into its token rows. `SGLANG_OVERLAP_GPU_SEEDS` raises the number of random cases.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass, replace

import pytest
import torch

from tests.oracle import fp8 as oracle_fp8

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.gpu_mem(6)]  # make_case at E 16 x N 7168 x K 2048

SEEDS = int(os.environ.get("SGLANG_OVERLAP_GPU_SEEDS", "12"))
FP8_TOL = 1e-3  # DeepGEMM's own test bound on calc_diff for fp8 GEMMs


@dataclass
class Case:
    a: torch.Tensor  # [E, M, K] fp8
    a_s: torch.Tensor  # [E, M, K/128] fp32
    b: torch.Tensor  # [E, N, K] fp8
    b_s: torch.Tensor  # [E, N/128, K/128] fp32
    masked_m: torch.Tensor  # [E] int32
    src: torch.Tensor  # [E, M] int32 token of each row
    weight: torch.Tensor  # [E, M] fp32
    num_tokens: int

    def describe(self) -> str:
        e, m, k = self.a.shape
        return f"E={e} M={m} K={k} N={self.b.shape[1]} masked_m={self.masked_m.tolist()}"


def make_case(seed: int, e: int, m_cap: int, n: int, k: int, zero_experts: int = 0) -> Case:
    from sglang_overlap.kernels import fp8

    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn((e, m_cap, k), generator=gen, device="cuda", dtype=torch.bfloat16)
    w = torch.randn((e, n, k), generator=gen, device="cuda") / math.sqrt(k)
    a, a_s = fp8.quant_per_token_group(x)
    b, b_s = fp8.quant_per_block(w)
    masked = torch.randint(0, m_cap + 1, (e,), generator=gen, device="cuda", dtype=torch.int32)
    masked[torch.randperm(e, generator=gen, device="cuda")[:zero_experts]] = 0
    num_tokens = max(1, m_cap)
    src = torch.randint(0, num_tokens, (e, m_cap), generator=gen, device="cuda",
                        dtype=torch.int32)
    weight = torch.rand((e, m_cap), generator=gen, device="cuda")
    return Case(a, a_s, b, b_s, masked, src, weight, num_tokens)


def reference(case: Case) -> torch.Tensor:
    """fp64 [E, M, N] from the dequantised operands."""

    a = oracle_fp8.dequant_per_token_group(case.a, case.a_s)
    b = oracle_fp8.dequant_per_block(case.b, case.b_s)
    return torch.bmm(a, b.transpose(1, 2))


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    x, y = x.double(), y.double()
    denom = float((x * x + y * y).sum())
    return 0.0 if denom == 0 else 1.0 - 2.0 * float((x * y).sum()) / denom


def valid_rows(case: Case) -> torch.Tensor:
    m_cap = case.a.shape[1]
    return torch.arange(m_cap, device="cuda")[None, :] < case.masked_m[:, None].long()  # [E, M]


def layout_for(case: Case, granularity: str, block_m: int, block_n: int, comm_sms: int = 4):
    from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    e, m_cap, _ = case.a.shape
    return plan_sbo_layout(num_local_experts=e, capacity=m_cap, block_m=block_m, block_n=block_n,
                           hidden=case.b.shape[1], num_sms=num_sms(), comm_num_sms=comm_sms,
                           granularity=granularity)  # type: ignore[arg-type]


def run_overlapped(case: Case, layout, config, *, wait: bool = True, producer=None):
    """Consumer on a side stream first, then the producer on the main stream."""
    from benchmarks.kernels.combine_consumer import combine_consume
    from sglang_overlap.kernels.signal_fused import grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal

    e, m_cap, _ = case.a.shape
    if producer is None:
        def producer(down_: torch.Tensor, sig_: torch.Tensor) -> None:
            grouped_gemm_fp8_signal(case.a, case.a_s, case.b, case.b_s, case.masked_m, down_,
                                    config=config, signal=sig_, layout=layout,
                                    num_programs=config.programs(layout.compute_num_sms))
    # run the producer once alone first: a JIT compile must not happen while the consumer spins
    producer(torch.empty((e, m_cap, layout.hidden), dtype=torch.bfloat16, device="cuda"),
             new_signal(layout, "cuda"))
    down = torch.full((e, m_cap, layout.hidden), float("nan"), dtype=torch.bfloat16,
                      device="cuda")
    out = torch.zeros((case.num_tokens, layout.hidden), dtype=torch.float32, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    sig = new_signal(layout, "cuda")
    main, comm = torch.cuda.current_stream(), torch.cuda.Stream()
    comm.wait_stream(main)
    with torch.cuda.stream(comm):
        combine_consume(down, case.masked_m, case.src, case.weight, out, signal=sig,
                        layout=layout, num_programs=layout.comm_num_sms, error=err, wait=wait)
    producer(down, sig)
    main.wait_stream(comm)
    torch.cuda.synchronize()
    return down, out, err, sig


def check_overlapped(case: Case, layout, down, out, err, sig) -> None:
    from benchmarks.kernels.combine_consumer import combine_reference

    msg = f"{case.describe()} {layout.granularity=} {layout.block_m=} {layout.block_n=}"
    assert int(err.item()) == 0, f"a unit never became final: {msg}"
    assert bool((sig.view(torch.int32) == layout.expect_value).all()), f"{sig.tolist()=} {msg}"
    assert not bool(out.isnan().any()), f"consumer read a unit before it was final: {msg}"
    want = combine_reference(down, case.masked_m, case.src, case.weight, case.num_tokens)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-4, msg=lambda m: f"{m} {msg}")


def random_shape(rng: random.Random) -> tuple[int, int, int, int]:
    e = rng.choice([1, 2, 3, 5, 8, 12])
    m_cap = rng.choice([16, 48, 64, 100, 128, 192, 256])
    n = 128 * rng.randint(1, 24)
    k = 128 * rng.randint(1, 8)
    return e, m_cap, n, k


@pytest.mark.parametrize("seed", range(SEEDS))
def test_fused_gemm_matches_fp64(seed: int) -> None:
    from sglang_overlap.kernels.signal_fused import default_config, grouped_gemm_fp8_signal

    e, m_cap, n, k = random_shape(random.Random(seed))
    case = make_case(seed, e, m_cap, n, k, zero_experts=seed % 2)
    config = replace(default_config(expected_m=m_cap if seed % 3 else 256),
                     m_inner=(seed // 2) % 2 == 1)
    down = torch.full((e, m_cap, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    grouped_gemm_fp8_signal(case.a, case.a_s, case.b, case.b_s, case.masked_m, down,
                            config=config)
    torch.cuda.synchronize()
    valid = valid_rows(case)
    got, want = down[valid], reference(case)[valid]
    assert not bool(got.isnan().any()), f"unwritten valid rows: {case.describe()} {config=}"
    assert bool(down[~valid].isnan().all()), f"wrote past masked_m: {case.describe()}"
    diff = calc_diff(got, want)
    assert diff < FP8_TOL, f"{diff=} {case.describe()} {config=}"


@pytest.mark.parametrize("granularity", ["expert", "block"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_consumer_never_reads_a_unit_early(seed: int, granularity: str) -> None:
    from sglang_overlap.kernels.signal_fused import SignalGemmConfig

    rng = random.Random(1000 + seed)
    e, m_cap, n, k = random_shape(rng)
    config = SignalGemmConfig(block_m=rng.choice([64, 128]), block_n=rng.choice([64, 128]),
                              num_warps=4, num_stages=3, ctas_per_sm=rng.choice([0, 1, 2]),
                              m_inner=rng.choice([False, True]))
    case = make_case(seed, e, m_cap, n, k, zero_experts=rng.randint(0, e))
    layout = layout_for(case, granularity, config.block_m, config.block_n,
                        comm_sms=rng.choice([1, 3, 8]))
    check_overlapped(case, layout, *run_overlapped(case, layout, config))


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_all_experts_empty_still_signal_and_finish(granularity: str) -> None:
    from sglang_overlap.kernels.signal_fused import default_config

    case = make_case(7, 6, 128, 1024, 512, zero_experts=6)
    config = default_config(64)
    layout = layout_for(case, granularity, config.block_m, config.block_n)
    down, out, err, sig = run_overlapped(case, layout, config)
    check_overlapped(case, layout, down, out, err, sig)
    assert bool(down.isnan().all()), "empty experts must not be written"


def test_negative_control_reading_without_waiting_is_caught() -> None:
    """The ordering check can fail: a consumer that skips the wait sums poisoned rows."""
    from sglang_overlap.kernels.signal_fused import default_config

    case = make_case(3, 16, 128, 7168, 2048)
    case.masked_m.fill_(128)
    config = default_config(128)
    layout = layout_for(case, "expert", config.block_m, config.block_n)
    _, out, _, _ = run_overlapped(case, layout, config, wait=False)
    assert bool(out.isnan().any()), "a consumer that does not wait was not caught"


def test_signal_values_equal_layout_expectation() -> None:
    from sglang_overlap.kernels.signal_fused import SignalGemmConfig, grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal

    case = make_case(11, 5, 100, 896, 256, zero_experts=2)
    config = SignalGemmConfig(block_m=64, block_n=64)
    for granularity in ("expert", "block"):
        layout = layout_for(case, granularity, 64, 64)
        sig = new_signal(layout, "cuda")
        down = torch.empty((5, 100, 896), dtype=torch.bfloat16, device="cuda")
        grouped_gemm_fp8_signal(case.a, case.a_s, case.b, case.b_s, case.masked_m, down,
                                config=config, signal=sig, layout=layout, num_programs=7)
        torch.cuda.synchronize()
        assert sig.dtype == (torch.uint32 if granularity == "expert" else torch.int32)
        assert sig.view(torch.int32).tolist() == [layout.expect_value] * layout.num_signals


def test_silu_and_mul_quant_matches_torch() -> None:
    from sglang_overlap.kernels import fp8

    gen = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn((4, 96, 2 * 512), generator=gen, device="cuda", dtype=torch.bfloat16)
    masked = torch.tensor([96, 0, 17, 64], dtype=torch.int32, device="cuda")
    q, s = fp8.silu_and_mul_quant(x, masked)
    torch.cuda.synchronize()
    want_q, want_s = fp8.quant_per_token_group(oracle_fp8.silu_and_mul_reference(x))
    valid = torch.arange(96, device="cuda")[None, :] < masked[:, None]
    torch.testing.assert_close(s[valid], want_s[valid], rtol=1e-5, atol=1e-8)
    got = oracle_fp8.dequant_per_token_group(q, s)[valid]
    want = oracle_fp8.silu_and_mul_reference(x).double()[valid]
    assert calc_diff(got, want) < FP8_TOL
    # the 2-D (normal layout) form
    q2, s2 = fp8.silu_and_mul_quant(x[0])
    torch.testing.assert_close(s2, want_s[0], rtol=1e-5, atol=1e-8)
