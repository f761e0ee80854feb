"""H200: the SBO down GEMM when the buffer is padded (capacity C > the rows really there).

In serving, DeepEP's low-latency buffer has C = num_max_dispatch_tokens_per_rank x world rows per
expert (256 and more), while a decode step fills a few of them; the GEMM is told `expected_m`.
This prints, per (E, C, rows), CUDA-graph medians in microseconds of:

    dg         one plain DeepGEMM masked launch (expected_m = rows)
    fused      the plugin's fused Triton kernel with per-expert signals, served tile order
               (n tiles innermost: SignalGemmConfig.m_inner False)
    fused_old  the same with m blocks innermost (the order served before 2026-12-04)

with the ratios to dg and, for the fused kernel, the cost of the padding: fused at C divided by
fused at C = rows rounded up to 64 (1.00 = padding is free). Every fused run is checked: NaN-
poisoned output, fp8 tolerance against DeepGEMM, every signal at its final value.

    python benchmarks/bench_padded_gemm.py [--experts 8,16,32] [--json F]

DeepGEMM kernels are JIT-compiled per shape in parallel worker processes first; then one process
times every shape (capacities stay multiples of 64: DeepGEMM 0.1.4.post1 is wrong at 16 / 32).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

N, K = 7168, 2048
ROWS = (1, 16, 64)
CAPS = (64, 256)
FP8_TOL = 1e-3


def shapes(experts: list[int]) -> list[tuple[int, int, int]]:
    out = [(e, c, r) for e in experts for c in CAPS for r in ROWS]
    return out + [(e, 256, 256) for e in experts]


def warm(e: int, cap: int, rows: int) -> None:
    """JIT-compile DeepGEMM's kernel for one shape (run in its own process)."""
    import torch

    from benchmarks.gpu_suite import down_operands
    from sglang_overlap.kernels import deepgemm

    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)
    torch.cuda.synchronize()


def measure(e: int, cap: int, rows: int) -> dict:
    import torch

    from benchmarks.gpu_suite import down_operands, graph_time_us
    from sglang_overlap.kernels import deepgemm
    from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
    from sglang_overlap.kernels.signal_fused import default_config, grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout

    sms = num_sms()
    a, a_s, b, b_s, masked = down_operands(e, cap, rows, seed=e * 1000 + cap + rows)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    res: dict = {"E": e, "C": cap, "rows": rows}
    deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows)
    torch.cuda.synchronize()
    want = out[:, :rows].double().clone()
    res["dg_us"] = graph_time_us(lambda: deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, rows))
    served = default_config(rows)
    for name, cfg in (("fused", served), ("fused_old", replace(served, m_inner=True))):
        layout = plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=cfg.block_m,
                                 block_n=cfg.block_n, hidden=N, num_sms=sms, comm_num_sms=1,
                                 granularity="expert")
        sig = new_signal(layout, "cuda")
        out.fill_(float("nan"))
        grouped_gemm_fp8_signal(a, a_s, b, b_s, masked, out, config=cfg, signal=sig,
                                layout=layout, num_programs=cfg.programs(sms))
        torch.cuda.synchronize()
        got = out[:, :rows].double()
        denom = float((got * got + want * want).sum())
        diff = 1.0 - 2.0 * float((got * want).sum()) / denom if denom else 0.0
        ok = (not bool(got.isnan().any()) and bool(out[:, rows:].isnan().all())
              and bool((sig.view(torch.int32) == layout.expect_value).all()) and diff < FP8_TOL)
        res[f"{name}_ok"], res[f"{name}_diff"] = ok, diff

        def run(c=cfg, s=sig, la=layout) -> None:  # the counters run past final: harmless
            grouped_gemm_fp8_signal(a, a_s, b, b_s, masked, out, config=c, signal=s, layout=la,
                                    num_programs=c.programs(sms))

        res[f"{name}_us"] = graph_time_us(run)
    return res


def table(results: list[dict]) -> str:
    by = {(r["E"], r["C"], r["rows"]): r for r in results if "dg_us" in r}
    lines = ["| E | C | rows | DG plain | fused (served order) | / DG | padding cost | "
             "fused, old order | / DG | old / new | checked |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (e, c, rows), r in sorted(by.items()):
        base = by.get((e, -(-rows // 64) * 64, rows))
        pad = f"{r['fused_us'] / base['fused_us']:.2f}" if base else "-"
        ok = "ok" if r["fused_ok"] and r["fused_old_ok"] else \
            f"FAIL {r['fused_diff']:.1e}/{r['fused_old_diff']:.1e}"
        lines.append(f"| {e} | {c} | {rows} | {r['dg_us']:.1f} | {r['fused_us']:.1f} | "
                     f"{r['fused_us'] / r['dg_us']:.2f} | {pad} | {r['fused_old_us']:.1f} | "
                     f"{r['fused_old_us'] / r['dg_us']:.2f} | "
                     f"{r['fused_old_us'] / r['fused_us']:.2f} | {ok} |")
    failed = [r for r in results if "error" in r]
    lines += [f"{r['E']}x{r['C']}x{r['rows']}: {r['error']}" for r in failed]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--experts", default="8,32")
    ap.add_argument("--shapes", default=None, help="ExCxROWS,... instead of the default grid")
    ap.add_argument("--json", default=None)
    ap.add_argument("--warm-workers", type=int, default=14)
    ap.add_argument("--warm-one", default=None, help=argparse.SUPPRESS)  # E,C,rows
    args = ap.parse_args(argv)
    if args.warm_one:
        warm(*(int(x) for x in args.warm_one.split(",")))
        return 0
    from benchmarks.gpu_suite import measure_shapes, parse_shapes, run_in_processes

    todo = parse_shapes(args.shapes) if args.shapes else shapes(
        [int(x) for x in args.experts.split(",")])

    # DeepGEMM JIT in parallel (nvcc), then every shape timed in this process
    run_in_processes([sys.executable, str(Path(__file__).resolve()), "--warm-one"],
                     [f"{e},{c},{r}" for e, c, r in todo], args.warm_workers)
    results = measure_shapes(todo, measure, None if not args.json else (
        lambda rs: Path(args.json).write_text(json.dumps(rs, indent=1))), error_chars=300)
    print(table(results))
    return 0 if all("error" not in r and r["fused_ok"] and r["fused_old_ok"]
                    for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
