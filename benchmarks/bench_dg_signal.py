"""H200: the SBO signal producers against one plain DeepGEMM masked launch (issue #15's table).

Per DeepSeek-V3 down-projection shape (K 2048, N 7168, fp8 1x128 / 128x128 scales), E local
experts holding `rows` of C capacity rows each, CUDA-graph replays, median of 7 x 20, in
microseconds, all in one process and one run:

    dg          one plain DeepGEMM masked launch (sgl-deep-gemm 0.1.4.post1, its own config)
    pat plain   the patched kernel (kernels/deepgemm_signal.py), signals off, DeepGEMM's config
                as `default_config` reproduces it: the launcher itself costs nothing
    pat block / pat expert   per-(expert, 64-row block) / per-expert signals, deferred
    pat eager   per-block signals raised right after each tile's stores
    pat best    the fastest (block_m, block_n, stages) of a sweep, per-block signals, deferred
    fused       the plugin's Triton producer (served config, per-expert signals)
    sliced      DeepGEMM launched on E/4 expert slices over two streams + signal stores

Producers run on all 132 SMs here (the DeepGEMM launch does too); `pat best @N` repeats the best
config on the SMs SBO leaves the GEMM. Achieved TB/s counts each operand read once and the output
written once; `copy` is a device-to-device copy of 4 GiB measured in the same run (read + write).
Every patched run is checked: NaN-poisoned output, valid rows against DeepGEMM's (bitwise for
`pat plain`), blocks past masked_m untouched, every signal at its final value.

    python benchmarks/bench_dg_signal.py [--shapes ExCxROWS,...] [--json F] [--warm-workers 14]
    python benchmarks/bench_dg_signal.py --compile-only   # fill the cubin cache (nvcc, no GPU)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N, K = 7168, 2048
SMS = 132
SERVED_SMS = 128  # 132 minus 3 send SMs, rounded down to even (DeepGEMM pairs SMs)
SWEEP_N = (64, 96, 112, 128, 144, 160, 192)


def default_shapes() -> list[tuple[int, int, int]]:
    out = []
    for e in (8, 16, 32):
        for rows in (16, 32, 64, 128, 256):
            out.append((e, max(64, -(-rows // 64) * 64), rows))
        out += [(e, 256, 1), (e, 256, 64)]  # padded, as DeepEP's LL buffer is
    return out


def sweep(e: int, cap: int, rows: int) -> list:
    from sglang_overlap.kernels.deepgemm_signal import DgSignalConfig, max_stages

    configs = []
    for bm in (64, 128):
        if cap % bm or (bm == 128 and rows <= 64):
            continue
        for bn in SWEEP_N:
            configs.append(DgSignalConfig(bm, bn, max_stages(bm, bn, K)))
    return configs


def instantiations(e: int, cap: int, rows: int) -> list[tuple]:
    """Every (config, sms, mode) this shape runs, for the parallel compile."""
    from dataclasses import replace

    from sglang_overlap.kernels.deepgemm_signal import default_config

    base = default_config(e, rows, cap, N, K, SMS)
    jobs = [(base, SMS, "none"), (base, SMS, "block"), (base, SMS, "expert"),
            (replace(base, eager=True), SMS, "block")]
    jobs += [(cfg, SMS, "block") for cfg in sweep(e, cap, rows)]
    jobs += [(cfg, SERVED_SMS, "block") for cfg in sweep(e, cap, rows)]
    return jobs


def compile_all(shapes: list[tuple[int, int, int]], workers: int) -> None:
    from sglang_overlap.kernels import deepgemm_signal as ds

    include = ds.prepared_include(ds.locate())
    texts = set()
    for e, cap, rows in shapes:
        for cfg, sms, mode in instantiations(e, cap, rows):
            texts.add(ds.kernel_source(cfg, num_groups=e, n=N, k=K, num_sms=sms, mode=mode,
                                       unit_m=64))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda t: ds.compile_cubin(t, include), sorted(texts)))
    print(f"compiled {len(texts)} patched-kernel instantiations", flush=True)


def warm_dg(e: int, cap: int, rows: int) -> None:
    """JIT-compile DeepGEMM's own kernel for one shape (its own process)."""
    import torch

    from benchmarks.gpu_suite import down_operands
    from sglang_overlap.kernels import deepgemm

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=1)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)
    torch.cuda.synchronize()


def copy_tbps() -> float:
    import torch

    from benchmarks.gpu_suite import graph_time_us

    src = torch.empty(2**31, dtype=torch.uint8, device="cuda")
    src.random_(0, 255)
    dst = torch.empty_like(src)
    us = graph_time_us(lambda: dst.copy_(src), trials=5, replays=10)
    return 2 * src.numel() / us / 1e6


def measure(e: int, cap: int, rows: int) -> dict:
    from dataclasses import replace

    import torch

    from benchmarks.gpu_suite import down_operands, graph_time_us
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels import deepgemm_signal as ds
    from sglang_overlap.kernels.signal_gemm import (
        default_config as tri_config,
    )
    from sglang_overlap.kernels.signal_gemm import (
        grouped_gemm_fp8_signal,
        new_signal,
    )
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    res: dict = {"E": e, "C": cap, "rows": rows}
    nbytes = e * (N * K + rows * K + rows * N * 2) + b_s.numel() * 4 + e * rows * (K // 128) * 4
    res["bytes"] = nbytes

    def dg() -> None:
        deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)

    out.fill_(float("nan"))
    dg()
    torch.cuda.synchronize()
    want = out.clone()
    valid = torch.arange(cap, device="cuda")[None, :] < masked[:, None].long()
    res["dg_us"] = graph_time_us(dg)

    def layout(cfg, granularity: str, sms: int):
        unit = cfg.block_m if granularity == "expert" else 64
        return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=unit,
                               block_n=cfg.block_n, hidden=N, num_sms=sms + 4, comm_num_sms=4,
                               granularity=granularity)  # type: ignore[arg-type]

    def check(cfg, granularity: str | None, sms: int, bitwise: bool = False) -> bool:
        lay = layout(cfg, granularity, sms) if granularity else None
        sig = new_signal(lay, "cuda") if lay else None
        out.fill_(float("nan"))
        ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=sms, signal=sig,
                              layout=lay)
        torch.cuda.synchronize()
        got, ref = out[valid], want[valid]
        same = torch.equal(got, ref) if bitwise else (
            not bool(got.isnan().any()) and float((got.float() - ref.float()).abs().max()) <
            1e-2 * float(ref.float().abs().max()))
        blocks = -(-masked.long() // cfg.block_m) * cfg.block_m
        past = torch.arange(cap, device="cuda")[None, :] >= blocks[:, None]
        ok = same and bool(out[past].isnan().all())
        if lay is not None:
            ok = ok and bool((sig.view(torch.int32) == lay.expect_value).all())
        return ok

    def timed(cfg, granularity: str | None, sms: int) -> float:
        lay = layout(cfg, granularity, sms) if granularity else None
        sig = new_signal(lay, "cuda") if lay else None

        def fn() -> None:  # counters run past final between replays: harmless for timing
            ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=sms,
                                  signal=sig, layout=lay)

        return graph_time_us(fn)

    base = ds.default_config(e, rows, cap, N, K, SMS)
    res["dg_config"] = [base.block_m, base.block_n, base.num_stages]
    checks = {"plain": check(base, None, SMS, bitwise=True)}
    res["pat_plain_us"] = timed(base, None, SMS)
    for name, cfg, gran in (("block", base, "block"), ("expert", base, "expert"),
                            ("eager", replace(base, eager=True), "block")):
        checks[name] = check(cfg, gran, SMS)
        res[f"pat_{name}_us"] = timed(cfg, gran, SMS)
    best = None
    res["sweep"] = {}
    for cfg in sweep(e, cap, rows):
        t = timed(cfg, "block", SMS)
        res["sweep"][f"{cfg.block_m}x{cfg.block_n}x{cfg.num_stages}"] = round(t, 2)
        if best is None or t < best[0]:
            best = (t, cfg)
    assert best is not None
    res["best_us"], res["best_config"] = best[0], [best[1].block_m, best[1].block_n,
                                                   best[1].num_stages]
    checks["best"] = check(best[1], "block", SMS)
    res["best_served_us"] = timed(best[1], "block", SERVED_SMS)
    checks["best_served"] = check(best[1], "block", SERVED_SMS)
    res["checks"] = checks
    # the other producers, same operands
    tcfg = tri_config(rows)
    tlay = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=tcfg.block_m,
                           block_n=tcfg.block_n, hidden=N, num_sms=SMS, comm_num_sms=1,
                           granularity="expert")
    tsig = new_signal(tlay, "cuda")
    res["fused_us"] = graph_time_us(lambda: grouped_gemm_fp8_signal(
        a, a_s, b, b_s, masked, out, config=tcfg, signal=tsig, layout=tlay,
        num_programs=tcfg.programs(SMS)))
    res["sliced_us"] = graph_time_us(lambda: deepgemm.sliced_masked_gemm_signal(
        a, a_s, b, b_s, out, masked, rows, signal=tsig, layout=tlay,
        slice_experts=max(1, e // 4), streams=2))
    return res


def table(results: list[dict], copy: float) -> str:
    lines = [f"Copy bandwidth (same run): {copy:.2f} TB/s read+write.", "",
             "| E | C | rows | DG plain | DG cfg | pat plain | / DG | pat block | / DG | "
             "pat expert | / DG | pat eager | / DG | pat best (cfg) | / DG | best @128 SMs | "
             "TB/s DG / best | % copy | fused | / DG | sliced | / DG | checked |",
             "|" + "---|" * 24]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['E']} | {r['C']} | {r['rows']} | error: {r['error'][:120]} |")
            continue
        dg = r["dg_us"]

        def ratio(key: str, r: dict = r, dg: float = dg) -> str:
            return f"{r[key] / dg:.3f}"

        tb_dg, tb_best = r["bytes"] / dg / 1e6, r["bytes"] / r["best_us"] / 1e6
        bad = [k for k, ok in r["checks"].items() if not ok]
        lines.append(
            f"| {r['E']} | {r['C']} | {r['rows']} | {dg:.1f} | "
            f"{'x'.join(map(str, r['dg_config']))} | {r['pat_plain_us']:.1f} | "
            f"{ratio('pat_plain_us')} | {r['pat_block_us']:.1f} | {ratio('pat_block_us')} | "
            f"{r['pat_expert_us']:.1f} | {ratio('pat_expert_us')} | {r['pat_eager_us']:.1f} | "
            f"{ratio('pat_eager_us')} | {r['best_us']:.1f} "
            f"({'x'.join(map(str, r['best_config']))}) | {ratio('best_us')} | "
            f"{r['best_served_us']:.1f} | {tb_dg:.2f} / {tb_best:.2f} | "
            f"{100 * tb_best / copy:.0f} | {r['fused_us']:.1f} | {ratio('fused_us')} | "
            f"{r['sliced_us']:.1f} | {ratio('sliced_us')} | "
            f"{'ok' if not bad else 'FAIL ' + ','.join(bad)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=None, help="ExCxROWS,... instead of the default grid")
    ap.add_argument("--json", default=None)
    ap.add_argument("--warm-workers", type=int, default=14)
    ap.add_argument("--compile-only", action="store_true",
                    help="only nvcc the patched kernel's instantiations into the cache (no GPU)")
    ap.add_argument("--warm-one", default=None, help=argparse.SUPPRESS)  # E,C,rows
    args = ap.parse_args(argv)
    if args.warm_one:
        warm_dg(*(int(x) for x in args.warm_one.split(",")))
        return 0
    todo = [tuple(int(x) for x in sh.split("x")) for sh in args.shapes.split(",")] \
        if args.shapes else default_shapes()
    me = [sys.executable, str(Path(__file__).resolve())]
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    compile_all(todo, args.warm_workers)  # nvcc for the patched kernel, threads
    if args.compile_only:
        return 0
    pending = list(todo)
    while pending:  # DeepGEMM's own JIT, one process per shape
        batch, pending = pending[:args.warm_workers], pending[args.warm_workers:]
        for p in [subprocess.Popen([*me, "--warm-one", f"{e},{c},{r}"], env=env)
                  for e, c, r in batch]:
            p.wait()
    copy = copy_tbps()
    results = []
    for e, c, r in todo:
        try:
            res = measure(e, c, r)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is reported, not fatal
            res = {"E": e, "C": c, "rows": r, "error": repr(exc)[:400]}
        print(json.dumps(res), flush=True)
        results.append(res)
        if args.json:
            Path(args.json).write_text(json.dumps({"copy_tbps": copy, "results": results},
                                                  indent=1))
    print(table(results, copy))
    return 0 if all("error" not in r and all(r["checks"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
