"""Measure this machine's kernels and write a hardware profile the cost model loads.

    python benchmarks/calibrate.py --base H200 --out sglang_overlap/profiles/gpu-H200-measured.json
    torchrun --nproc-per-node 8 benchmarks/calibrate.py --base H200 --out my-node.json

Times (CUDA events, median of repeats, after warm-up):
- DeepGEMM fp8 masked grouped GEMMs at DeepSeek-V3 shapes (sglang_overlap.kernels.deepgemm when the
  plugin has it, else deep_gemm directly) -> gemm_efficiency, hbm_efficiency, gemm_fixed_us, fitted
  with the cost model's own `grouped_gemm_us` so the model reproduces what was measured;
- a bf16 matmul -> attn_efficiency (the bf16 tensor-core fraction a large kernel reaches);
- a device-to-device copy -> a cross-check of hbm_efficiency (reported, not fitted);
- with WORLD_SIZE > 1, torch.distributed all_to_all_single at several sizes -> a2a_latency_us and
  nvlink_efficiency (or rdma_efficiency when the ranks span nodes).
The output names the base profile (`"base": "H200"`) and overrides only what was measured.

The fitting and writing are plain Python (tested on CPU in tests/planning/test_profiles.py); only
`main` needs CUDA and says so clearly when there is none.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_overlap.planning.cost.profiles import HardwareProfile, load_hardware
from sglang_overlap.planning.cost.stage_costs import grouped_gemm_us


@dataclass(frozen=True)
class GemmSample:
    """One measured masked grouped GEMM: num_groups x (m rows, every group full) x n x k."""

    num_groups: int
    m: int
    n: int
    k: int
    us: float


# DeepGEMM fp8 masked grouped GEMM on one H200 SXM (sgl-deep-gemm 0.1.4.post1, torch 2.11.0+cu130,
# CUDA 13.0), DeepSeek-V3 down-proj
# (N = 7168, K = 2048), one launch, CUDA graph, median of 5 x 50 replays.
H200_DOWN_PROJ_SAMPLES = (
    GemmSample(8, 32, 7168, 2048, 38.1), GemmSample(8, 64, 7168, 2048, 38.6),
    GemmSample(8, 128, 7168, 2048, 46.4), GemmSample(8, 256, 7168, 2048, 58.8),
    GemmSample(32, 32, 7168, 2048, 130.1), GemmSample(32, 64, 7168, 2048, 131.6),
    GemmSample(32, 128, 7168, 2048, 148.0), GemmSample(32, 256, 7168, 2048, 214.5),
)


def _grid(lo: float, hi: float, step: float) -> list[float]:
    return [lo + i * step for i in range(int(round((hi - lo) / step)) + 1)]


def fit_gemm(samples: Sequence[GemmSample], base: HardwareProfile,
             step: float = 0.005) -> dict[str, float]:
    """gemm_efficiency, hbm_efficiency and gemm_fixed_us minimising the relative squared error
    of `grouped_gemm_us` against the samples (grid search; the intercept is fitted in closed form).
    """
    if len(samples) < 3:
        raise ValueError("fitting three parameters needs at least 3 GEMM samples "
                         f"(got {len(samples)})")
    best: tuple[float, dict[str, float]] | None = None
    for ce in _grid(0.2, 1.0, step):
        for me in _grid(0.3, 1.0, step):
            hw = dataclasses.replace(base, gemm_efficiency=ce, hbm_efficiency=me, gemm_fixed_us=0.0)
            var = [grouped_gemm_us(hw, s.num_groups, s.m, s.n, s.k) for s in samples]
            # weighted least squares on relative error: minimise sum(((v + a - t) / t)^2) over a
            w = [1.0 / (s.us * s.us) for s in samples]
            a = sum(wi * (s.us - v) for wi, s, v in zip(w, samples, var, strict=True)) / sum(w)
            a = max(0.0, a)
            err = sum(((v + a - s.us) / s.us) ** 2 for s, v in zip(samples, var, strict=True))
            if best is None or err < best[0]:
                best = (err, {"gemm_efficiency": round(ce, 4), "hbm_efficiency": round(me, 4),
                              "gemm_fixed_us": round(a, 2)})
    assert best is not None
    return best[1]


def fit_linear(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = intercept + slope * x."""
    if len(points) < 2 or len({x for x, _ in points}) < 2:
        raise ValueError("a linear fit needs at least two distinct sizes")
    mx = statistics.fmean(x for x, _ in points)
    my = statistics.fmean(y for _, y in points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def fit_a2a(points: Sequence[tuple[float, float]], base: HardwareProfile,
            inter_node: bool) -> dict[str, float]:
    """From (bytes each rank sends, microseconds): the latency and the link efficiency."""
    latency, us_per_byte = fit_linear(points)
    gbps = 1e-3 / us_per_byte if us_per_byte > 0 else float("inf")
    peak = base.rdma_gbps if inter_node else base.nvlink_gbps
    key = "rdma_efficiency" if inter_node else "nvlink_efficiency"
    return {"a2a_latency_us": round(max(0.0, latency), 2), key: round(min(1.0, gbps / peak), 4)}


def profile_json(base: str, measured: dict[str, Any], source: str) -> dict[str, Any]:
    return {"kind": "gpu", "base": base, **measured, "source": source}


def write_profile(path: Path, base: str, measured: dict[str, Any], source: str) -> dict[str, Any]:
    """Write the override profile and check that the cost model loads it."""
    data = profile_json(base, measured, source)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    load_hardware(str(path))  # fails loudly if a key is wrong
    return data


# ---------------------------------------------------------------- CUDA part (main only)


def _time_us(fn: Callable[[], Any], repeats: int = 50) -> float:
    import torch

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / repeats)
    return statistics.median(times)


def _masked_gemm_fn(e: int, m: int, n: int, k: int) -> Callable[[], Any]:
    import torch

    from sglang_overlap.kernels.deepgemm import masked_gemm  # knows each DeepGEMM release's API
    from sglang_overlap.kernels.fp8 import quant_per_block, quant_per_token_group

    capacity = -(-m // 64) * 64  # DeepGEMM's masked GEMM runs on capacities of 64 rows
    a, a_scale = quant_per_token_group(torch.randn(e, capacity, k, device="cuda"))
    b, b_scale = quant_per_block(torch.randn(e, n, k, device="cuda"))
    out = torch.empty(e, capacity, n, device="cuda", dtype=torch.bfloat16)
    masked_m = torch.full((e,), m, device="cuda", dtype=torch.int32)
    return lambda: masked_gemm(a, a_scale, b, b_scale, out, masked_m, m)


def _measure(args: argparse.Namespace) -> tuple[dict[str, Any], list[str]]:
    import torch

    base = load_hardware(args.base)
    notes = [f"device {torch.cuda.get_device_name()}"]
    samples = [GemmSample(e, m, 7168, 2048, _time_us(_masked_gemm_fn(e, m, 7168, 2048)))
               for e in (8, 32) for m in (32, 64, 128, 256)]
    measured: dict[str, Any] = fit_gemm(samples, base)
    timed = ", ".join(f"E{s.num_groups}M{s.m}={s.us:.1f}us" for s in samples)
    notes.append(f"masked GEMMs (N 7168, K 2048) {timed}")
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_us = _time_us(lambda: a @ a, repeats=10)
    measured["attn_efficiency"] = round(2 * 8192**3 / (mm_us * 1e6) / base.bf16_tflops, 4)
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_gbps = 2 * src.numel() / (_time_us(lambda: dst.copy_(src), repeats=10) * 1e3)
    notes.append(f"bf16 matmul {mm_us:.0f}us; copy {copy_gbps:.0f} GB/s read+write")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        import torch.distributed as dist

        dist.init_process_group("nccl")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        points = []
        for size in (1 << 16, 1 << 20, 1 << 22, 1 << 24):
            send = torch.empty(size * world, dtype=torch.uint8, device="cuda")
            recv = torch.empty_like(send)
            points.append((float(size * (world - 1)),
                           _time_us(functools.partial(dist.all_to_all_single, recv, send), 20)))
        inter = world > int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
        measured.update(fit_a2a(points, base, inter))
    return measured, notes


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="H200", help="shipped profile the measurements override")
    p.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("calibrate.py needs torch with CUDA (pip install torch) and a CUDA GPU",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("calibrate.py needs a CUDA GPU: torch.cuda.is_available() is False on this machine. "
              "Run it on the GPU you want a profile for.", file=sys.stderr)
        return 2
    measured, notes = _measure(args)
    if int(os.environ.get("RANK", "0")) == 0:
        data = write_profile(args.out, args.base, measured,
                             "measured by calibrate.py: " + "; ".join(notes))
        print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
