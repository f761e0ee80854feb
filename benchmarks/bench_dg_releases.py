"""The served SBO down GEMM on the installed deep_gemm release against that release's own
masked GEMM, with the HBM copy bandwidth of the same run (one process per release).

Per DeepSeek-V3 down-projection shape (K 2048, N 7168, fp8 1x128 / 128x128 scales; E local
experts, `rows` valid rows each of C capacity rows), microseconds:

    base        the baseline: DeepGEMM's own `fp8_m_grouped_gemm_nt_masked` of the installed
                release, its own heuristics (`dg`), where its `_C.so` loads (it needs the
                torch its wheel pins: 2.14.1 for 0.2.x); otherwise `tiles`
    tiles       the release's kernel with the signal additions compiled out (kSignalMode 0),
                launched by the plugin at every candidate tile on all SMs, the fastest per
                shape (the best-tile baseline: stricter than DeepGEMM's heuristic)
    served / served, expert   what `down_gemm.dg_signal_config` serves from this GPU's producer
                table (`kernels.gpu_tables`), per (expert, 64-row block) / per expert, all SMs
    served tile  the served tile with signals off (what the tile alone costs)
    best store  the baseline's best tile with store-warp signals per block
    served @N   the served per-block producer on the SMs SBO leaves it (N = all - 4, even)
    fused       the Triton producer, per expert, its served config
    sliced      DeepGEMM's own launch per E/4 slices, two streams (only where `_C.so` loads)

Variants are CUDA graphs timed in interleaved rounds; each ratio is the median of per-round
ratios to `base`. TB/s counts every operand read once and the output written once; `% copy` is
against an SM copy kernel measured in the same run. Checks per variant: NaN-poisoned output,
valid rows within calc_diff 1e-6 of the release's kernel with signals off at the best tile (1e-3,
DeepGEMM's own test criterion, for DeepGEMM's own launch, fused and sliced; their calc_diff is
kept as `<variant>_diff`), every signal final exactly once.

    python benchmarks/bench_dg_releases.py [--shapes ExCxROWS,...] [--json F] [--skip sliced]
    python benchmarks/bench_dg_releases.py --compile-only  # nvcc every instantiation, no GPU
    python benchmarks/bench_dg_releases.py --dry-run [--table-from F.json]  # no GPU, no nvcc
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N, K = 7168, 2048
SMS = 132
SERVED_SMS = 128  # all minus the send's 4 SMs, even
TILE_N = (96, 112, 128, 144, 160, 192)
MULTICAST_N = (112, 128, 192)  # an even number of n tiles at N 7168


def default_shapes() -> list[tuple[int, int, int]]:
    return [(e, max(64, -(-rows // 64) * 64), rows) for e in (8, 16, 32)
            for rows in (32, 64, 128, 256)]


def tiles(cap: int) -> list:
    """Every candidate baseline config: tiles with the most stages, multicast where it pairs."""
    from sglang_overlap.kernels.signal_deepgemm import DgSignalConfig, max_stages

    out = []
    for bm in (64, 128):
        if cap % bm:
            continue
        for bn in TILE_N:
            out.append(DgSignalConfig(bm, bn, max_stages(bm, bn, K)))
            if bn in MULTICAST_N:
                out += [DgSignalConfig(bm, bn, max_stages(bm, bn, K), multicast=2,
                                       multicast_on_a=on_a) for on_a in (False, True)]
    return out


def name(cfg) -> str:
    mc = "" if cfg.multicast == 1 else f"+mc{'A' if cfg.multicast_on_a else 'B'}"
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.num_stages}{mc}{'+store' if cfg.store_warp else ''}"


def instantiations(e: int, cap: int, rows: int) -> list[tuple]:
    """(config, sms, mode) of every patched-kernel launch of this shape."""
    from dataclasses import replace

    from sglang_overlap.kernels.down_gemm import dg_signal_config

    served = dg_signal_config(e, rows, cap, K)
    return ([(cfg, SMS, "none") for cfg in tiles(cap)]
            + [(replace(cfg, store_warp=True), SMS, "block") for cfg in tiles(cap)]
            + [(served, SMS, "none"), (served, SMS, "block"), (served, SMS, "expert"),
               (served, SERVED_SMS, "block")])


def test_instantiations(num_sms: int = SMS) -> list[tuple]:
    """(config, E, sms, mode, n, k) of every patched launch tests/gpu/test_signal_down_gemm.py
    and tests/gpu/test_dg_own_launch.py make through `signal_down_gemm` on a GPU of `num_sms`
    SMs with this process's producer table (for the cubin cache)."""
    from sglang_overlap.kernels.down_gemm import (
        choose_signal_path,
        dg_config_for_layout,
        launchable,
        plan_tiles,
    )
    from sglang_overlap.kernels.signal_deepgemm.launch import layout_mode
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout
    from tests.gpu import test_dg_own_launch as own
    from tests.gpu import test_signal_down_gemm as t

    shapes = [(g, m, t.MAX_M, n, k) for g, m in t.DG_GROUPS for n, k in t.DG_NK]
    shapes += [(e, rows, cap, N, K) for e, cap, rows in t.DSV3]
    shapes += [(8, 1, 256, N, K), (16, 32, 256, N, K)]  # zero-token experts, graph replay
    plans = [(t.plan_for("deepgemm", e, m, cap, k), e, m, cap, n, k) for e, m, cap, n, k in shapes]
    plans += [(choose_signal_path(e, rows, own.capacity(rows)), e, rows, own.capacity(rows), N, K)
              for e, rows in own.SHAPES]
    jobs = []
    for plan, e, m, cap, n, k in plans:
        if plan.dg_config is None:
            continue
        for granularity in ("block", "expert"):
            block_m, block_n = plan_tiles(plan, m, granularity)  # type: ignore[arg-type]
            layout = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=block_m,
                                     block_n=block_n, hidden=n, num_sms=num_sms,
                                     comm_num_sms=t.COMM_SMS,
                                     granularity=granularity)  # type: ignore[arg-type]
            cfg = dg_config_for_layout(plan, layout, k)
            if cfg is not None:
                cfg = launchable(cfg, n, layout.compute_num_sms)
                mode, _ = layout_mode(layout, cfg, n)
                jobs.append((cfg, e, layout.compute_num_sms, mode, n, k))
    return jobs


def compile_all(jobs: list[tuple], workers: int) -> int:
    """nvcc every (config, E, sms, mode, n, k) against the installed release's patched headers."""
    from sglang_overlap.kernels.signal_deepgemm import build, headers

    source = headers.locate()
    include = headers.prepared_include(source)
    texts = sorted({build.kernel_source(cfg, release=source.spec, num_groups=e, n=n, k=k,
                                        num_sms=sms, mode=mode, unit_m=64)
                    for cfg, e, sms, mode, n, k in jobs})
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda t: build.compile_cubin(t, include), texts))
    return len(texts)


def warm_dg(e: int, cap: int, rows: int) -> None:
    """DeepGEMM's own launch of one shape once (its JIT compiles the kernel into its cache)."""
    import torch

    from benchmarks.gpu_suite import down_operands
    from sglang_overlap.kernels import deepgemm

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=0)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)
    torch.cuda.synchronize()


def dg_loads() -> str | None:
    try:
        from sglang_overlap.kernels import deepgemm

        deepgemm.api()
    except Exception as exc:  # noqa: BLE001 - any failure: no DeepGEMM launch here
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return None


def measure(e: int, cap: int, rows: int, dg_error: str | None,
            skip: frozenset[str] = frozenset()) -> dict:
    from dataclasses import replace

    import torch

    from benchmarks.bench_dg_signal import interleaved
    from benchmarks.gpu_suite import down_operands, graph_time_us
    from sglang_overlap.kernels import signal_deepgemm as ds
    from sglang_overlap.kernels.down_gemm import dg_signal_config, fused_config
    from sglang_overlap.kernels.signal_fused import grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout
    from tests.gpu.test_signal_gemm import calc_diff

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    valid = torch.arange(cap, device="cuda")[None, :] < masked[:, None].long()
    res: dict = {"E": e, "C": cap, "rows": rows, "bytes": (
        e * (N * K + rows * K + rows * N * 2) + b_s.numel() * 4 + e * rows * (K // 128) * 4)}

    def lay(block_m: int, block_n: int, granularity: str, sms: int):
        return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=block_m,
                               block_n=block_n, hidden=N, num_sms=sms + 4, comm_num_sms=4,
                               granularity=granularity)  # type: ignore[arg-type]

    def patched(cfg, granularity: str | None, sms: int):
        layout = lay(cfg.block_m if granularity == "expert" else 64, cfg.block_n,
                     granularity, sms) if granularity else None
        sig = new_signal(layout, "cuda") if layout else None

        def fn() -> None:
            ds.masked_gemm_signal(a, a_s, b, b_s, out, masked, config=cfg, num_sms=sms,
                                  signal=sig, layout=layout)
        return fn, sig, layout

    sweep = {cfg: graph_time_us(patched(cfg, None, SMS)[0], trials=3, replays=20)
             for cfg in tiles(cap)}
    best = min(sweep, key=sweep.__getitem__)
    res["tiles"] = {name(c): round(t, 2) for c, t in sorted(sweep.items(), key=lambda x: x[1])}
    res["tiles_best"] = name(best)
    served = dg_signal_config(e, rows, cap, K)
    res["served_config"] = name(served)
    variants = {"tiles": patched(best, None, SMS), "served": patched(served, "block", SMS),
                "served_tile": patched(served, None, SMS),
                "best_store": patched(replace(best, store_warp=True), "block", SMS),
                "served_expert": patched(served, "expert", SMS),
                "served_at": patched(served, "block", SERVED_SMS)}
    flay = lay(64, 128, "expert", SMS)
    fcfg = fused_config(flay, rows)
    fsig = new_signal(flay, "cuda")
    variants["fused"] = (lambda: grouped_gemm_fp8_signal(
        a, a_s, b, b_s, masked, out, config=fcfg, signal=fsig, layout=flay,
        num_programs=fcfg.programs(SMS)), fsig, flay)
    if dg_error is None:
        from sglang_overlap.kernels import deepgemm, signal_sliced

        variants["dg"] = (lambda: deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows),
                          None, None)
        variants["sliced"] = (lambda: signal_sliced.sliced_masked_gemm_signal(
            a, a_s, b, b_s, out, masked, rows, signal=fsig, layout=flay,
            slice_experts=max(1, e // 4), streams=2), fsig, flay)
    for key in skip:
        variants.pop(key, None)
    base_name = "dg" if dg_error is None else "tiles"
    res["base"] = base_name
    out.fill_(float("nan"))
    variants["tiles"][0]()  # the reference rows: the release's kernel with signals off
    torch.cuda.synchronize()
    want = out[valid].clone()
    checks = {}
    for key, (fn, sig, layout) in variants.items():
        if sig is not None:
            sig.zero_()
        out.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        got = out[valid]
        diff = calc_diff(got, want)
        if key in ("dg", "fused", "sliced"):  # another kernel: DeepGEMM's own criterion
            res[f"{key}_diff"] = diff
        ok = not bool(got.isnan().any()) and diff < (
            1e-3 if key in ("dg", "fused", "sliced") else 1e-6)
        if layout is not None:
            ok = ok and bool((sig.view(torch.int32) == layout.expect_value).all())
        checks[key] = ok
    res["checks"] = checks
    times = interleaved({key: fn for key, (fn, _, _) in variants.items()})
    for key, ts in times.items():
        res[f"{key}_us"] = statistics.median(ts)
        res[f"{key}_ratio"] = statistics.median(
            t / d for t, d in zip(ts, times[base_name], strict=True))
    return res


COLS = [("tiles", "best tile"), ("served", "served"), ("served_expert", "served, expert"),
        ("served_tile", "served tile"), ("best_store", "best store"),
        ("served_at", f"served @{SERVED_SMS}"), ("fused", "fused"), ("sliced", "sliced")]


def targets(r: dict, copy: float) -> str:
    """Issue 35's targets for one shape against DeepGEMM's own launch: served (per block and
    per expert) <= 1.00x at <= 64 rows and <= 1.02x at 128-256, >= 90 % of copy at <= 64 rows;
    "-" where the baseline is not DeepGEMM's own launch."""
    if r.get("base") != "dg":
        return "-"
    small = r["rows"] <= 64
    bound = 1.00 if small else 1.02
    missed = [f"{label} {r[f'{k}_ratio']:.3f}" for k, label in (("served", "block"),
                                                                ("served_expert", "expert"))
              if f"{k}_ratio" in r and round(r[f"{k}_ratio"], 3) > bound]
    share = 100 * r["bytes"] / r["served_us"] / 1e6 / copy
    if small and share < 90:
        missed.append(f"copy {share:.0f} %")
    return "met" if not missed else "missed: " + ", ".join(missed)


def table(results: list[dict], copy: float, header: str) -> str:
    cols = [c for c in COLS if any(f"{c[0]}_us" in r and r.get("base") != c[0]
                                   for r in results)]
    head = " | ".join(f"{label} us | / base" for _, label in cols)
    lines = [header, "", f"Copy bandwidth (same run): {copy:.2f} TB/s read+write.", "",
             f"| E | C | rows | base | base us | {head} | served config | best tile | "
             "TB/s base / served | % of copy base / served | targets | checked |",
             "|" + "---|" * (11 + 2 * len(cols))]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['E']} | {r['C']} | {r['rows']} | error: {r['error'][:200]} |")
            continue
        base = r["base"]
        cells = " | ".join(f"{r[f'{k}_us']:.1f} | {r[f'{k}_ratio']:.3f}" if f"{k}_us" in r
                           else "- | -" for k, _ in cols)
        tb_base, tb_served = (r["bytes"] / r[f"{base}_us"] / 1e6,
                              r["bytes"] / r["served_us"] / 1e6)
        bad = [k for k, ok in r["checks"].items() if not ok]
        dg_diff = f" (DG calc_diff {r['dg_diff']:.0e})" if "dg_diff" in r else ""
        lines.append(
            f"| {r['E']} | {r['C']} | {r['rows']} | {base} | {r[f'{base}_us']:.1f} | {cells} | "
            f"{r['served_config']} | {r['tiles_best']} | {tb_base:.2f} / {tb_served:.2f} | "
            f"{100 * tb_base / copy:.0f} / {100 * tb_served / copy:.0f} | {targets(r, copy)} | "
            f"{'ok' if not bad else 'FAIL ' + ','.join(bad)}{dg_diff} |")
    return "\n".join(lines)


def run_header(dg_error: str | None) -> str:
    """One line: GPU, torch, the release and its producer, the producer table, the baseline."""
    import torch

    from sglang_overlap.kernels.gpu_tables import producer_tables
    from sglang_overlap.kernels.signal_deepgemm import served_producer

    version, producer, why = served_producer()
    tables = producer_tables()
    prov = tables.dg_tiles.provenance
    return (f"deep_gemm {version} on {torch.cuda.get_device_name(0)} (torch {torch.__version__}):"
            f" producer {producer} ({why}); tiles from {tables.origin} (dg_tiles "
            f"{prov['status']}, {prov['when']}); DeepGEMM's own launch: "
            + ("loads" if dg_error is None else f"does not load ({dg_error})"))


def parse_shapes(spec: str | None) -> list[tuple[int, int, int]]:
    if spec == "none":
        return []
    if not spec:
        return default_shapes()
    from benchmarks.gpu_suite import parse_shapes as parse

    return parse(spec)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=None,
                    help="ExCxROWS,... instead of the default grid (none: no shapes)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--workers", type=int, default=14)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--with-tests", action="store_true",
                    help="also compile what tests/gpu/test_signal_down_gemm.py and "
                    "test_dg_own_launch.py launch")
    ap.add_argument("--skip", default="", help="variants not to run, e.g. sliced (DeepGEMM's "
                    "JIT per slice shape)")
    ap.add_argument("--dry-run", action="store_true",
                    help="no GPU, no nvcc: the shapes, variants and instantiation count")
    ap.add_argument("--table-from", default=None,
                    help="print the table of an earlier --json run (no GPU)")
    ap.add_argument("--warm-dg", action="store_true", help="only run DeepGEMM's own launch of "
                    "every shape once, --workers processes at a time (its JIT cache)")
    ap.add_argument("--warm-one", default=None, help=argparse.SUPPRESS)  # ExCxROWS
    args = ap.parse_args(argv)
    if args.warm_one:
        warm_dg(*(int(x) for x in args.warm_one.split("x")))
        return 0
    todo = parse_shapes(args.shapes)
    skip = frozenset(x for x in args.skip.split(",") if x)
    unknown = skip - {k for k, _ in COLS}
    if unknown:
        ap.error(f"--skip {sorted(unknown)}: variants are {[k for k, _ in COLS]}")
    if args.table_from:
        saved = json.loads(Path(args.table_from).read_text())
        print(table(saved["results"], saved["copy_tbps"], saved["header"]))
        return 0
    if args.warm_dg:
        from benchmarks.gpu_suite import run_in_processes

        run_in_processes([sys.executable, str(Path(__file__).resolve()), "--warm-one"],
                         [f"{e}x{c}x{r}" for e, c, r in todo], args.workers)
        return 0
    jobs = [(cfg, e, sms, mode, N, K) for e, c, r in todo for cfg, sms, mode in
            instantiations(e, c, r)]
    if args.with_tests:
        jobs += test_instantiations()
    if args.dry_run:
        print(f"{len(todo)} shapes {todo}; variants {[k for k, _ in COLS if k not in skip]}; "
              f"{len(set(jobs))} patched-kernel launches to compile")
        return 0
    print(f"compiled {compile_all(jobs, args.workers)} instantiations", flush=True)
    if args.compile_only:
        return 0
    from benchmarks.bench_dg_signal import copy_tbps
    from benchmarks.gpu_suite import measure_shapes

    dg_error = dg_loads()
    header = run_header(dg_error)
    print(header, flush=True)
    copy = copy_tbps()
    results = measure_shapes(
        todo, lambda e, c, r: measure(e, c, r, dg_error, skip),
        None if not args.json else (lambda rs: Path(args.json).write_text(json.dumps(
            {"header": header, "copy_tbps": copy, "results": rs}, indent=1))))
    print(table(results, copy, header))
    return 0 if all("error" not in r and all(r["checks"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
