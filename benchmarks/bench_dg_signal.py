"""H200: the SBO signal producers against one plain DeepGEMM masked launch (issue #15's table).

Per DeepSeek-V3 down-projection shape (K 2048, N 7168, fp8 1x128 / 128x128 scales), E local
experts holding `rows` of C capacity rows each, in microseconds, all in one process and one
run:

    dg          one plain DeepGEMM masked launch (sgl-deep-gemm 0.1.4.post1, its own config)
    pat plain   the patched kernel (kernels/signal_deepgemm/), signals off, DeepGEMM's config
                as `default_config` reproduces it: the launcher itself costs nothing
    pat block / pat expert   per-(expert, 64-row block) / per-expert signals, deferred
    pat eager   per-block signals raised right after each tile's stores
    pat store   per-block signals, the signalling lane issuing the stores itself (store_warp:
                the math threads wait only for shared-memory reads, as in DeepGEMM)
    pat best    the fastest (block_m, block_n, multicast) of a sweep, per-block signals, deferred
    best, expert  the same config with per-expert signals
    best store / best store, expert   the best config with the store warp
    served / served, expert   what the plugin serves for this shape (`down_gemm.dg_signal_config`:
                the tile and timing of this GPU's producer table), per-block / per-expert signals
    fused       the plugin's Triton producer (served config, per-expert signals)
    sliced      DeepGEMM launched on E/4 expert slices over two streams + signal stores

Producers run on all 132 SMs here (the DeepGEMM launch does too); `served @N SMs` repeats the
served config on the SMs SBO leaves the GEMM. The variants are timed in interleaved rounds (each
round replays every variant's graph in a rotating order), and each ratio is the median of the
per-round ratios to DeepGEMM, so clock drift between variants cancels. Achieved TB/s (of the
served config) counts each operand read once and the output written once; `copy` is a
device-to-device copy measured in the same run (read + write).
Every patched run is checked: NaN-poisoned output, valid rows against DeepGEMM's (bitwise for
`pat plain`), blocks past masked_m untouched, every signal at its final value.

    python benchmarks/bench_dg_signal.py [--shapes ExCxROWS,...] [--json F] [--warm-workers 14]
    python benchmarks/bench_dg_signal.py --compile-only   # fill the cubin cache (nvcc, no GPU)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N, K = 7168, 2048
SMS = 132
SERVED_SMS = 128  # 132 minus 3 send SMs, rounded down to even (DeepGEMM pairs SMs)
SWEEP_N = (112, 128, 160, 192)  # the fastest four of 64-192 in the 2026-12-04 sweep
ROUNDS, REPLAYS = 9, 20


def default_shapes() -> list[tuple[int, int, int]]:
    out = []
    for e in (8, 16, 32):
        for rows in (16, 32, 64, 128, 256):
            out.append((e, max(64, -(-rows // 64) * 64), rows))
        out += [(e, 256, 1), (e, 256, 64)]  # padded, as DeepEP's LL buffer is
    return out


def sweep(e: int, cap: int, rows: int) -> list:
    """Tile shapes with the most stages that fit, without and with TMA multicast (on A or B,
    where the n tiles pair up)."""
    from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, max_stages

    configs = []
    for bm in (64, 128):
        if cap % bm or (bm == 128 and rows <= 64):
            continue
        for bn in SWEEP_N:
            configs.append(DgSignalConfig(bm, bn, max_stages(bm, bn, K)))
            if -(-N // bn) % 2 == 0:
                for on_a in (False, True):
                    configs.append(DgSignalConfig(bm, bn, max_stages(bm, bn, K), multicast=2,
                                                  multicast_on_a=on_a))
    return configs


def served_config(e: int, cap: int, rows: int):
    """The patched kernel's config the plugin serves for this shape."""
    from sglang_overlap.kernels.down_gemm import dg_signal_config

    return dg_signal_config(e, rows, cap, K)


def config_name(cfg) -> str:
    mc = "" if cfg.multicast == 1 else f"+mc{'A' if cfg.multicast_on_a else 'B'}"
    timing = "+eager" if cfg.eager else "+store" if cfg.store_warp else ""
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.num_stages}{mc}{timing}"


def instantiations(e: int, cap: int, rows: int) -> list[tuple]:
    """Every (config, sms, mode) this shape runs, for the parallel compile."""
    from dataclasses import replace

    from sglang_overlap.kernels.signal_deepgemm import default_config

    base = default_config(e, rows, cap, N, K, SMS)
    jobs = [(base, SMS, "none"), (base, SMS, "block"), (base, SMS, "expert"),
            (replace(base, eager=True), SMS, "block"),
            (replace(base, store_warp=True), SMS, "block")]
    jobs += [(cfg, SMS, mode) for cfg in sweep(e, cap, rows) for mode in ("block", "expert")]
    served = served_config(e, cap, rows)
    jobs += [(served, SMS, "block"), (served, SMS, "expert"), (served, SERVED_SMS, "block")]
    jobs += [(replace(cfg, store_warp=True), SMS, mode) for cfg in sweep(e, cap, rows)
             for mode in ("block", "expert")]
    return jobs


def compile_all(shapes: list[tuple[int, int, int]], workers: int) -> None:
    from sglang_overlap.kernels.signal_deepgemm import build, headers

    source = headers.locate()
    include = headers.prepared_include(source)
    texts = set()
    for e, cap, rows in shapes:
        for cfg, sms, mode in instantiations(e, cap, rows):
            texts.add(build.kernel_source(cfg, release=source.spec, num_groups=e, n=N, k=K,
                                          num_sms=sms, mode=mode, unit_m=64))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda t: build.compile_cubin(t, include), sorted(texts)))
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
    """Device-to-device copy bandwidth, read + write, by an SM kernel (an fp32 multiply by 1
    over 2 GiB; a plain `copy_` in a graph goes to the copy engines, 2.8 TB/s there): the best
    of two sizes' medians."""
    import torch

    from benchmarks.gpu_suite import graph_time_us

    best = 0.0
    for numel in (2**29, 2**28):
        src = torch.randn(numel, dtype=torch.float32, device="cuda")
        dst = torch.empty_like(src)
        us = graph_time_us(functools.partial(torch.mul, src, 1.0, out=dst), trials=7, replays=10)
        best = max(best, 2 * src.numel() * 4 / us / 1e6)
        del src, dst
    return best


def interleaved(fns: dict, rounds: int = ROUNDS, replays: int = REPLAYS) -> dict:
    """Each fn captured in a CUDA graph; then `rounds` rounds replay every graph `replays`
    times, in a rotating order, timed with events. name -> per-round microseconds."""
    import torch

    from benchmarks.gpu_suite import capture_graph

    graphs = {name: capture_graph(fn) for name, fn in fns.items()}
    for graph in graphs.values():  # warm clocks
        for _ in range(replays):
            graph.replay()
    times: dict = {name: [] for name in graphs}
    names = list(graphs)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graphs[name].replay()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) * 1000 / replays)
    return times


def measure(e: int, cap: int, rows: int) -> dict:
    import statistics
    from dataclasses import replace

    import torch

    from benchmarks.gpu_suite import down_operands, graph_time_us
    from sglang_overlap.kernels import deepgemm, signal_sliced
    from sglang_overlap.kernels import signal_deepgemm as ds
    from sglang_overlap.kernels.signal_fused import default_config as tri_config
    from sglang_overlap.kernels.signal_fused import grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    res: dict = {"E": e, "C": cap, "rows": rows}
    res["bytes"] = (e * (N * K + rows * K + rows * N * 2) + b_s.numel() * 4
                    + e * rows * (K // 128) * 4)

    def dg() -> None:
        deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)

    out.fill_(float("nan"))
    dg()
    torch.cuda.synchronize()
    want = out.clone()
    valid = torch.arange(cap, device="cuda")[None, :] < masked[:, None].long()

    def layout(cfg, granularity: str, sms: int):
        unit = cfg.block_m if granularity == "expert" else 64
        return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=unit,
                               block_n=cfg.block_n, hidden=N, num_sms=sms + 4, comm_num_sms=4,
                               granularity=granularity)  # type: ignore[arg-type]

    def producer(cfg, granularity: str | None, sms: int):
        lay = layout(cfg, granularity, sms) if granularity else None
        sig = new_signal(lay, "cuda") if lay else None

        def fn() -> None:  # counters run past final between replays: harmless for timing
            ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=sms,
                                  signal=sig, layout=lay)

        def check(bitwise: bool = False) -> bool:
            if sig is not None:
                sig.zero_()
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            got, ref = out[valid], want[valid]
            same = torch.equal(got, ref) if bitwise else (
                not bool(got.isnan().any()) and float((got.float() - ref.float()).abs().max())
                < 1e-2 * float(ref.float().abs().max()))
            blocks = -(-masked.long() // cfg.block_m) * cfg.block_m
            past = torch.arange(cap, device="cuda")[None, :] >= blocks[:, None]
            ok = same and bool(out[past].isnan().all())
            if lay is not None and sig is not None:
                ok = ok and bool((sig.view(torch.int32) == lay.expect_value).all())
            return ok

        return fn, check

    base = ds.default_config(e, rows, cap, N, K, SMS)
    swept = {}
    for cfg in sweep(e, cap, rows):  # a quick pass picks the best tile per signal form
        swept[cfg] = graph_time_us(producer(cfg, "block", SMS)[0], trials=3, replays=20)
    best = min(swept, key=swept.__getitem__)
    res["sweep"] = {config_name(c): round(t, 2) for c, t in sorted(swept.items(),
                                                                     key=lambda kv: kv[1])}
    served = served_config(e, cap, rows)
    res["default_config"], res["best_config"] = config_name(base), config_name(best)
    res["served_config"] = config_name(served)
    variants = {
        "plain": producer(base, None, SMS),
        "block": producer(base, "block", SMS),
        "expert": producer(base, "expert", SMS),
        "eager": producer(replace(base, eager=True), "block", SMS),
        "store": producer(replace(base, store_warp=True), "block", SMS),
        "best": producer(best, "block", SMS),
        "best_expert": producer(best, "expert", SMS),
        "best_store": producer(replace(best, store_warp=True), "block", SMS),
        "best_store_expert": producer(replace(best, store_warp=True), "expert", SMS),
        "served": producer(served, "block", SMS),
        "served_expert": producer(served, "expert", SMS),
        "served_128": producer(served, "block", SERVED_SMS),
    }
    checks = {name: check(bitwise=name == "plain") for name, (_, check) in variants.items()}
    res["checks"] = checks
    tcfg = tri_config(rows)
    tlay = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=tcfg.block_m,
                           block_n=tcfg.block_n, hidden=N, num_sms=SMS, comm_num_sms=1,
                           granularity="expert")
    tsig = new_signal(tlay, "cuda")
    fns = {"dg": dg, **{name: fn for name, (fn, _) in variants.items()},
           "fused": lambda: grouped_gemm_fp8_signal(
               a, a_s, b, b_s, masked, out, config=tcfg, signal=tsig, layout=tlay,
               num_programs=tcfg.programs(SMS)),
           "sliced": lambda: signal_sliced.sliced_masked_gemm_signal(
               a, a_s, b, b_s, out, masked, rows, signal=tsig, layout=tlay,
               slice_experts=max(1, e // 4), streams=2)}
    times = interleaved(fns)
    for name, ts in times.items():
        res[f"{name}_us"] = statistics.median(ts)
        res[f"{name}_ratio"] = statistics.median(t / d for t, d in zip(ts, times["dg"],
                                                                          strict=True))
    res["rounds"] = {name: [round(t, 2) for t in ts] for name, ts in times.items()}
    return res


def table(results: list[dict], copy: float) -> str:
    cols = [("plain", "pat plain"), ("block", "pat block"), ("expert", "pat expert"),
            ("eager", "pat eager"), ("store", "pat store"), ("best", "pat best"),
            ("best_expert", "best, expert"), ("best_store", "best store"),
            ("best_store_expert", "best store, expert"),
            ("served", "served"), ("served_expert", "served, expert"),
            ("served_128", f"served @{SERVED_SMS} SMs"), ("fused", "fused"),
            ("sliced", "sliced")]
    head = " | ".join(f"{label} | / DG" for _, label in cols)
    lines = [f"Copy bandwidth (same run): {copy:.2f} TB/s read+write. Times: medians of "
             f"{ROUNDS} interleaved rounds x {REPLAYS} graph replays (us); / DG: median of the "
             "per-round ratios.", "",
             f"| E | C | rows | DG plain | {head} | best config | served config | "
             "TB/s DG / served | % of copy | checked |", "|" + "---|" * (9 + 2 * len(cols))]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['E']} | {r['C']} | {r['rows']} | error: {r['error'][:160]} |")
            continue
        cells = " | ".join(f"{r[f'{k}_us']:.1f} | {r[f'{k}_ratio']:.3f}" for k, _ in cols)
        tb_dg, tb_served = r["bytes"] / r["dg_us"] / 1e6, r["bytes"] / r["served_us"] / 1e6
        bad = [k for k, ok in r["checks"].items() if not ok]
        checked = "ok" if not bad else "FAIL " + ",".join(bad)
        lines.append(f"| {r['E']} | {r['C']} | {r['rows']} | {r['dg_us']:.1f} | {cells} | "
                     f"{r['best_config']} | {r['served_config']} | {tb_dg:.2f} / {tb_served:.2f} | "
                     f"{100 * tb_served / copy:.0f} | {checked} |")
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
    from benchmarks.gpu_suite import measure_shapes, parse_shapes, run_in_processes

    todo = parse_shapes(args.shapes) if args.shapes else default_shapes()

    compile_all(todo, args.warm_workers)  # nvcc for the patched kernel, threads
    if args.compile_only:
        return 0
    run_in_processes([sys.executable, str(Path(__file__).resolve()), "--warm-one"],
                     [f"{e},{c},{r}" for e, c, r in todo], args.warm_workers)  # DeepGEMM's JIT
    copy = copy_tbps()
    results = measure_shapes(todo, measure, None if not args.json else (
        lambda rs: Path(args.json).write_text(json.dumps({"copy_tbps": copy, "results": rs},
                                                         indent=1))))
    print(table(results, copy))
    return 0 if all("error" not in r and all(r["checks"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
