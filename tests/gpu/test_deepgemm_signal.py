"""GPU: DeepGEMM's own SM90 masked GEMM with the plugin's signal patch (kernels/signal_deepgemm/).

Needs a Hopper GPU, nvcc and a covered sgl-deep-gemm release whose own launch loads (the reference
is DeepGEMM's launch: 0.1.4.post1 on torch 2.11);
skipped otherwise, failed instead with SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1 (benchmarks/run_gpu.sh).
Every output is NaN-poisoned first; the reference is unmodified DeepGEMM on the same operands and
the fp64 product of the dequantised operands.
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
    layout_for,
    make_case,
    reference,
    run_overlapped,
    valid_rows,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              # make_case at E 32 x N 7168 x K 2048 (fp32 weights and their quantisation)
              pytest.mark.gpu_mem(10)]

SEEDS = int(os.environ.get("SGLANG_OVERLAP_GPU_SEEDS", "12"))


@pytest.fixture(scope="module", autouse=True)
def _available() -> None:
    from sglang_overlap.kernels import signal_deepgemm

    why = signal_deepgemm.probe()
    if why is None and torch.cuda.get_device_capability() != (9, 0):
        why = "the patched DeepGEMM kernel is SM90 only"
    if why is not None:
        if os.environ.get("SGLANG_OVERLAP_REQUIRE_DGSIGNAL") == "1":
            pytest.fail(f"SGLANG_OVERLAP_REQUIRE_DGSIGNAL=1: {why}")
        pytest.skip(why)


def dg_case(seed: int, e: int, cap: int, n: int, k: int, zero_experts: int = 0):
    """make_case with the activation scales in DeepGEMM's MN-major, TMA-aligned layout."""
    from sglang_overlap.kernels import fp8

    case = make_case(seed, e, cap, n, k, zero_experts)
    case.a_s = fp8.empty_mn_major_scales((e,), cap, k // 128, "cuda").copy_(case.a_s)
    return case


def run(case, config, *, layout=None, signal=None, num_sms: int = 132, out=None):
    from sglang_overlap.kernels.signal_deepgemm import masked_gemm_signal

    e, cap, _ = case.a.shape
    if out is None:
        out = torch.full((e, cap, case.b.shape[1]), float("nan"), dtype=torch.bfloat16,
                         device="cuda")
    masked_gemm_signal(case.a, case.a_s, case.b, case.b_s, out, case.masked_m, config=config,
                       num_sms=num_sms, signal=signal, layout=layout)
    return out


def random_config(rng: random.Random, cap: int, n: int = 7168):
    """A random legal config; multicast where the n tiles pair up (use an even SM count)."""
    from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, max_stages

    bm = 128 if cap % 128 == 0 and rng.random() < 0.4 else 64
    bn = rng.choice([64, 112, 128, 144, 160, 192])
    stages = rng.choice([max_stages(bm, bn, 2048), 3])
    multicast = 2 if -(-n // bn) % 2 == 0 and rng.random() < 0.5 else 1
    timing = rng.choice(["deferred", "eager", "store_warp"])
    return DgSignalConfig(bm, bn, min(stages, max_stages(bm, bn, 2048)),
                          eager=timing == "eager", store_warp=timing == "store_warp",
                          multicast=multicast, multicast_on_a=rng.random() < 0.5)


@pytest.mark.gpu_mem(38)  # E 32 x N 4096 x K 7168 in fp64 (the reference): 35.7 GiB seen
@pytest.mark.parametrize("seed", range(SEEDS))
def test_matches_deepgemm_and_fp64(seed: int) -> None:
    """Valid rows match unmodified DeepGEMM and fp64; rows of blocks past masked_m stay
    untouched; every signal ends at its final value (both forms)."""
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels.signals import new_signal

    rng = random.Random(seed)
    e = rng.choice([1, 3, 8, 16, 32])
    cap = rng.choice([64, 128, 256])
    n, k = rng.choice([(7168, 2048), (4096, 7168), (2048, 512)])
    case = dg_case(seed, e, cap, n, k, zero_experts=rng.randint(0, min(e, 3)))
    config = random_config(rng, cap, n)
    granularity = rng.choice(["expert", "block"])
    unit = config.block_m if granularity == "expert" else 64
    layout = layout_for(case, granularity, unit, config.block_n, comm_sms=4)
    sig = new_signal(layout, "cuda")
    sms = rng.choice([132, 128, 78])
    got = run(case, config, layout=layout, signal=sig, num_sms=sms)
    want_dg = torch.full_like(got, float("nan"))
    deepgemm.masked_gemm(case.a, case.a_s, case.b, case.b_s, want_dg, case.masked_m, cap)
    torch.cuda.synchronize()
    valid = valid_rows(case)
    msg = f"{case.describe()} {config=} {granularity=} {sms=}"
    assert not bool(got[valid].isnan().any()), f"unwritten valid rows: {msg}"
    assert calc_diff(got[valid], want_dg[valid]) < 1e-6, msg
    assert calc_diff(got[valid], reference(case)[valid]) < FP8_TOL, msg
    blocks = -(-case.masked_m.long() // config.block_m) * config.block_m  # rows of visited blocks
    untouched = torch.arange(cap, device="cuda")[None, :] >= blocks[:, None]
    assert bool(got[untouched].isnan().all()), f"wrote a block past masked_m: {msg}"
    assert sig.view(torch.int32).tolist() == [layout.expect_value] * layout.num_signals, msg


@pytest.mark.parametrize("granularity", ["expert", "block"])
@pytest.mark.parametrize("seed", range(SEEDS))
def test_consumer_never_reads_a_unit_early(seed: int, granularity: str) -> None:
    """A consumer spinning on the signals on its own SMs sums NaN if a unit is final before its
    rows are in memory (the output is poisoned first)."""
    rng = random.Random(2000 + seed)
    e = rng.choice([2, 8, 16])
    cap = rng.choice([64, 128, 256])
    case = dg_case(seed, e, cap, 7168, 2048, zero_experts=rng.randint(0, e))
    config = random_config(rng, cap)
    unit = config.block_m if granularity == "expert" else 64
    comm = rng.choice([2, 4, 8])
    layout = layout_for(case, granularity, unit, config.block_n, comm_sms=comm)

    def producer(down: torch.Tensor, sig: torch.Tensor) -> None:
        run(case, config, layout=layout, signal=sig, num_sms=layout.compute_num_sms // 2 * 2,
            out=down)

    check_overlapped(case, layout, *run_overlapped(case, layout, config, producer=producer))


# (E, C, block_m, block_n, multicast): the served E 8 decode tile; a 9-slab store (block_n 144);
# 128-row tiles with 2-CTA multicast; 3 slabs of 64 columns
STORE_WARP_SHAPES = [(8, 64, 64, 160, 1), (8, 256, 64, 144, 1), (16, 256, 128, 128, 2),
                     (32, 128, 128, 192, 1)]


@pytest.mark.parametrize("granularity", ["expert", "block"])
@pytest.mark.parametrize("shape", STORE_WARP_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_store_warp_is_deferred_bit_for_bit(shape: tuple, granularity: str) -> None:
    """The store-warp timing moves who issues the TMA stores, not what is stored: the same bits
    as the deferred timing, every signal final, blocks past masked_m untouched; and a spinning
    consumer never reads a poisoned row."""
    from dataclasses import replace

    from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, max_stages
    from sglang_overlap.kernels.signals import new_signal

    e, cap, bm, bn, multicast = shape
    case = dg_case(100 + e, e, cap, 7168, 2048, zero_experts=1)
    deferred = DgSignalConfig(bm, bn, max_stages(bm, bn, 2048), multicast=multicast)
    store = replace(deferred, store_warp=True)
    unit = bm if granularity == "expert" else 64
    layout = layout_for(case, granularity, unit, bn, comm_sms=4)
    outs = []
    for config in (deferred, store):
        sig = new_signal(layout, "cuda")
        outs.append(run(case, config, layout=layout, signal=sig, num_sms=128))
        torch.cuda.synchronize()
        assert sig.view(torch.int32).tolist() == [layout.expect_value] * layout.num_signals
    valid = valid_rows(case)
    assert torch.equal(outs[1][valid], outs[0][valid])
    assert torch.equal(outs[1].isnan(), outs[0].isnan()), "a different set of rows written"

    def producer(down: torch.Tensor, sig: torch.Tensor) -> None:
        run(case, store, layout=layout, signal=sig, num_sms=layout.compute_num_sms // 2 * 2,
            out=down)

    check_overlapped(case, layout, *run_overlapped(case, layout, store, producer=producer))


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_all_experts_empty_signal_everything(granularity: str) -> None:
    from sglang_overlap.kernels.signal_deepgemm import default_config
    from sglang_overlap.kernels.signals import new_signal

    case = dg_case(5, 8, 256, 7168, 2048, zero_experts=8)
    config = default_config(8, 1, 256, 7168, 2048, 132)
    layout = layout_for(case, granularity, config.block_m if granularity == "expert" else 64,
                        config.block_n)
    sig = new_signal(layout, "cuda")
    got = run(case, config, layout=layout, signal=sig)
    torch.cuda.synchronize()
    assert bool(got.isnan().all()), "empty experts must not be written"
    assert sig.view(torch.int32).tolist() == [layout.expect_value] * layout.num_signals


def test_cuda_graph_replay_signals_each_time() -> None:
    """Captured once, replayed with the signal re-zeroed: same output, every unit final."""
    from sglang_overlap.kernels.signal_deepgemm import default_config
    from sglang_overlap.kernels.signals import new_signal

    case = dg_case(9, 16, 256, 7168, 2048, zero_experts=3)
    config = default_config(16, 32, 256, 7168, 2048, 128)
    layout = layout_for(case, "block", 64, config.block_n)
    sig = new_signal(layout, "cuda")
    out = torch.full((16, 256, 7168), float("nan"), dtype=torch.bfloat16, device="cuda")
    run(case, config, layout=layout, signal=sig, num_sms=128, out=out)  # load outside capture
    torch.cuda.synchronize()
    first = out.clone()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sig.zero_()
        run(case, config, layout=layout, signal=sig, num_sms=128, out=out)
    for _ in range(3):
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert sig.view(torch.int32).tolist() == [layout.expect_value] * layout.num_signals
        valid = valid_rows(case)
        assert torch.equal(out[valid], first[valid])


def test_plain_mode_is_deepgemm_bit_for_bit() -> None:
    """Signals off, DeepGEMM's own config for the shape: the same bits as deep_gemm's launch."""
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels.signal_deepgemm import default_config

    case = dg_case(13, 8, 128, 7168, 2048)
    case.masked_m.fill_(100)
    config = default_config(8, 100, 128, 7168, 2048, 132)
    got = run(case, config)
    want = torch.full_like(got, float("nan"))
    deepgemm.masked_gemm(case.a, case.a_s, case.b, case.b_s, want, case.masked_m, 100)
    torch.cuda.synchronize()
    valid = valid_rows(case)
    assert torch.equal(got[valid], want[valid])


def test_negative_control_an_early_signal_is_caught() -> None:
    """The ordering check can fail: a producer that marks every unit final before computing is
    caught by the consumer (it sums poisoned rows)."""
    from sglang_overlap.kernels.signal_fused import default_config as tri_default

    case = dg_case(3, 16, 128, 7168, 2048)
    case.masked_m.fill_(128)
    from sglang_overlap.kernels.signal_deepgemm import default_config

    config = default_config(16, 128, 128, 7168, 2048, 124)
    layout = layout_for(case, "expert", config.block_m, config.block_n, comm_sms=8)

    def early(down: torch.Tensor, sig: torch.Tensor) -> None:
        sig.fill_(layout.expect_value)
        run(case, config, num_sms=124, out=down)

    _, out, _, _ = run_overlapped(case, layout, tri_default(128), producer=early)
    assert bool(out.isnan().any()), "a producer that signals early was not caught"
