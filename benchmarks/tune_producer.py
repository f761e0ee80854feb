"""Measure the patched DeepGEMM producer's tiles and signal timing on this GPU and write its
producer table, `sglang_overlap/profiles/producer-<GPU>.json` (planning/producer_tables.py).

Per bucket shape - E 8 / 16 / 32 local experts x rows 32 / 64 / 128 / 256 per expert, capacity C
= rows rounded up to 64, DeepSeek-V3 down projection (N 7168, K 2048, fp8 1x128 / 128x128 fp32
scales), every expert holding `rows` - with per-(expert, 64-row block) signals on all SMs:

  1. every candidate is captured in a CUDA graph and timed once (3 x 20 replays): block_m 64 / 128
     (where it divides C) x block_n 96-192, the most stages that fit, 2-CTA TMA multicast on A or
     B where the n tiles pair, each with the store-warp and the deferred signal timing (eager was
     the slowest timing at 20 of 21 H200 shapes: benchmarks/results/h200_dg_signal.md);
  2. the `--finalists` fastest are checked (NaN-poisoned output equal to the first candidate's
     valid rows, calc_diff < 1e-6; every signal final exactly once) and timed in interleaved
     rounds (9 x 20 replays); the lowest median wins the (E, rows) cell. The reference rows come
     from the same kernel with signals off at the first candidate tile.

The `fused` and `fallback` tables are kept from the GPU's current file (or `--base`); where they
were not measured on this GPU their provenance says so. Writes `--out` (default: the package
file of this GPU) and `--raw` (every timing).

    python benchmarks/tune_producer.py [--out F] [--raw F] [--shapes ExROWS,...]
    python benchmarks/tune_producer.py --compile-only [--sms 132]  # nvcc every candidate, no GPU
    python benchmarks/tune_producer.py --dry-run                   # the plan, no GPU, no nvcc
    python benchmarks/tune_producer.py --show F.json               # a file's dg_tiles table
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_dg_releases import K, N, name, tiles  # noqa: E402

EXPERTS = (8, 16, 32)
ROWS = (32, 64, 128, 256)
TIMINGS = ("store_warp", "deferred")
PROFILES = ROOT / "sglang_overlap" / "profiles"


def capacity(rows: int) -> int:
    return max(64, -(-rows // 64) * 64)


def candidates(cap: int) -> list:
    """Every (DgSignalConfig) the tuner times at capacity `cap`."""
    return [replace(cfg, store_warp=timing == "store_warp")
            for cfg in tiles(cap) for timing in TIMINGS]


def instantiations(shapes: list[tuple[int, int]], sms: int) -> list[tuple]:
    """(config, E, sms, mode, n, k) of every launch the tuner makes (the cubin cache's keys)."""
    jobs = {(cfg, e, sms, "block", N, K) for e, rows in shapes
            for cfg in candidates(capacity(rows))}
    jobs |= {(tiles(capacity(rows))[0], e, sms, "none", N, K) for e, rows in shapes}
    return sorted(jobs, key=repr)


def cell_of(cfg) -> dict:
    return {"block_m": cfg.block_m, "block_n": cfg.block_n,
            "signal": "store_warp" if cfg.store_warp else "eager" if cfg.eager else "deferred",
            "multicast": cfg.multicast, "multicast_on_a": cfg.multicast_on_a}


def measure_shape(e: int, rows: int, finalists: int) -> dict:
    """Time every candidate of one bucket shape; the winner and the evidence."""
    import torch

    from benchmarks.bench_dg_signal import interleaved
    from benchmarks.gpu_suite import down_operands, graph_time_us
    from sglang_overlap.kernels import signal_deepgemm as ds
    from sglang_overlap.kernels.capabilities import device_num_sms
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout
    from tests.gpu.test_signal_gemm import calc_diff

    sms, cap = device_num_sms(), capacity(rows)
    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    valid = torch.arange(cap, device="cuda")[None, :] < masked[:, None].long()

    def launch(cfg):
        layout = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=64,
                                 block_n=cfg.block_n, hidden=N, num_sms=sms + 4,
                                 comm_num_sms=4, granularity="block")
        sig = new_signal(layout, "cuda")

        def fn() -> None:
            ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=sms,
                                  signal=sig, layout=layout)
        return fn, sig, layout

    runs = {cfg: launch(cfg) for cfg in candidates(cap)}
    sweep, failed = {}, {}
    for cfg, (fn, _, _) in runs.items():
        try:
            sweep[cfg] = graph_time_us(fn, trials=3, replays=20)
        except Exception as exc:  # noqa: BLE001 - a candidate that cannot run is not served
            failed[name(cfg)] = f"{type(exc).__name__}: {str(exc)[:200]}"
    order = sorted(sweep, key=sweep.__getitem__)
    plain = tiles(cap)[0]  # the reference rows: the same kernel, signals off
    out.fill_(float("nan"))
    ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=plain, num_sms=sms)
    torch.cuda.synchronize()
    want = out[valid].clone()
    checked: dict = {}
    for cfg in order[:finalists]:
        fn, sig, layout = runs[cfg]
        sig.zero_()
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        got = out[valid]
        checked[cfg] = (not bool(got.isnan().any()) and calc_diff(got, want) < 1e-6
                        and bool((sig.view(torch.int32) == layout.expect_value).all()))
    good = [cfg for cfg, ok in checked.items() if ok]
    if not good:
        raise RuntimeError(f"E {e} x {rows} rows: no finalist passed its check ({checked})")
    rounds = interleaved({cfg: runs[cfg][0] for cfg in good})
    medians = {cfg: statistics.median(ts) for cfg, ts in rounds.items()}
    best = min(medians, key=medians.__getitem__)
    return {"E": e, "rows": rows, "C": cap, "sms": sms, "winner": name(best),
            "cell": cell_of(best), "winner_us": round(medians[best], 2),
            "finalists_us": {name(c): round(t, 2) for c, t in sorted(
                medians.items(), key=lambda x: x[1])},
            "failed_check": [name(c) for c, ok in checked.items() if not ok],
            "failed_launch": failed,
            "sweep_us": {name(c): round(sweep[c], 2) for c in order}}


def environment() -> dict:
    """Where and on what this run measured (GPU, driver, torch, CUDA, nvcc, deep_gemm)."""
    import subprocess

    import torch

    from sglang_overlap.kernels.signal_deepgemm import build, served_producer

    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True)
    version, _, _ = served_producer()
    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "sms": props.multi_processor_count,
            "driver": smi.stdout.strip().splitlines()[0] if smi.returncode == 0 else "unknown",
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "nvcc": build._nvcc_version(build.nvcc_path()), "deep_gemm": version}


def table_file(results: list[dict], env: dict, gpu: str, base: dict) -> dict:
    """The producer JSON: measured dg_tiles from `results`, the rest from `base`."""
    experts = sorted({r["E"] for r in results})
    rows = sorted({r["rows"] for r in results})
    by_shape = {(r["E"], r["rows"]): r for r in results}
    missing = [(e, m) for e in experts for m in rows if (e, m) not in by_shape]
    if missing:
        raise RuntimeError(f"no winner for {missing}: the table needs every (E, rows) bucket")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    data = json.loads(json.dumps(base))
    data["gpu"] = gpu
    data["dg_tiles"] = {
        "provenance": {
            "status": "measured", "gpu": f"{env['device']} ({env['sms']} SMs)", "when": now,
            "where": (f"driver {env['driver']}, torch {env['torch']}, CUDA {env['cuda']}, "
                      f"nvcc {env['nvcc']}"),
            "release": f"sgl-deep-gemm {env['deep_gemm']} (the patched kernel's headers)",
            "how": ("tune_producer.py: per bucket shape (DeepSeek-V3 down projection "
                    "N 7168, K 2048, C = rows rounded up to 64, every expert full) every "
                    "candidate tile x {store_warp, deferred} with per-(expert, 64-row block) "
                    "signals on all SMs, graph-timed once, the fastest checked and timed in 9 "
                    "interleaved rounds x 20 replays; the lowest median wins")},
        "experts": experts, "rows": rows,
        "cells": [[by_shape[(e, m)]["cell"] for m in rows] for e in experts],
        "evidence": {f"E{r['E']}x{r['rows']}": {"winner": r["winner"], "us": r["winner_us"],
                                               "finalists_us": r["finalists_us"]}
                     for r in results}}
    for key in ("fused", "fallback"):
        prov = data[key]["provenance"]
        if prov["status"] == "measured" and base["gpu"] != gpu:
            prov["status"] = f"provisional: copied from {base['gpu']}, not measured on {gpu}"
    return data


def show(path: Path) -> str:
    """A producer file's dg_tiles as a markdown table, with its provenance and evidence."""
    data = json.loads(path.read_text())
    grid = data["dg_tiles"]
    evidence = grid.get("evidence", {})
    lines = [f"{path.name} dg_tiles: " + "; ".join(f"{k}: {v}" for k, v in
                                                   grid["provenance"].items()), "",
             "| E bucket | rows bucket | tile | signal | winner us | finalists (us) |",
             "|---|---|---|---|---|---|"]

    def label(bounds: list[int], i: int) -> str:
        return f"> {bounds[-2]}" if i == len(bounds) - 1 and i else f"<= {bounds[i]}"

    for i, (e, row) in enumerate(zip(grid["experts"], grid["cells"], strict=True)):
        for j, (m, cell) in enumerate(zip(grid["rows"], row, strict=True)):
            mc = "" if cell["multicast"] == 1 else f"+mc{'A' if cell['multicast_on_a'] else 'B'}"
            ev = evidence.get(f"E{e}x{m}", {})
            lines.append(f"| {label(grid['experts'], i)} | {label(grid['rows'], j)} | "
                         f"{cell['block_m']}x{cell['block_n']}{mc} | "
                         f"{cell['signal']} | {ev.get('us', '-')} | "
                         f"{', '.join(f'{k} {v}' for k, v in ev.get('finalists_us', {}).items())}"
                         " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=None, help="ExROWS,... (default: E 8/16/32 x rows "
                    "32/64/128/256; the table needs every pair of its E and rows)")
    ap.add_argument("--out", default=None, help="default: sglang_overlap/profiles/"
                    "producer-<this GPU>.json")
    ap.add_argument("--base", default=None, help="the file whose fused / fallback tables are "
                    "kept (default: this GPU's shipped file, else H200's)")
    ap.add_argument("--raw", default=None, help="write every timing here (JSON)")
    ap.add_argument("--finalists", type=int, default=4)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--sms", type=int, default=132, help="SMs to compile for (--compile-only)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--show", default=None, help="print a producer file's dg_tiles (no GPU)")
    args = ap.parse_args(argv)
    if args.show:
        print(show(Path(args.show)))
        return 0
    from benchmarks.gpu_suite import parse_ints

    shapes = [(e, m) for e in EXPERTS for m in ROWS] if not args.shapes else [
        (e, m) for e, m in parse_ints(args.shapes, "E x rows")]
    jobs = instantiations(shapes, args.sms)
    if args.dry_run:
        for e, m in shapes:
            print(f"E {e} x {m} rows (C {capacity(m)}): {len(candidates(capacity(m)))} "
                  "candidates")
        print(f"{len(jobs)} patched-kernel instantiations at {args.sms} SMs")
        return 0
    from benchmarks.bench_dg_releases import compile_all

    print(f"compiled {compile_all(jobs, args.workers)} instantiations", flush=True)
    if args.compile_only:
        return 0
    from sglang_overlap.kernels import gpu_tables
    from sglang_overlap.planning.producer_tables import load_producer_tables, shipped_gpus

    env = environment()
    gpu = gpu_tables.device_gpu() or "unknown"
    out = Path(args.out or PROFILES / f"producer-{gpu}.json")
    base_spec = args.base or (gpu if gpu in shipped_gpus() else "H200")
    base_path = Path(base_spec) if base_spec.endswith(".json") else (
        PROFILES / f"producer-{base_spec}.json")
    load_producer_tables(str(base_path))  # a valid base, or a ProfileError now
    results = []
    for e, m in shapes:
        res = measure_shape(e, m, args.finalists)
        print(f"E {e} x {m} rows: {res['winner']} {res['winner_us']} us "
              f"(finalists {res['finalists_us']})", flush=True)
        results.append(res)
    if args.raw:
        Path(args.raw).write_text(json.dumps({"env": env, "results": results}, indent=1))
    data = table_file(results, env, gpu, json.loads(base_path.read_text()))
    out.write_text(json.dumps(data, indent=1) + "\n")
    load_producer_tables(str(out))  # what was written parses
    gpu_tables.reset()
    print(f"wrote {out} ({gpu}: dg_tiles measured {data['dg_tiles']['provenance']['when']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
