"""H200 suite for the SBO down GEMM: correctness (the GPU tests) and speed, in one go.

    python benchmarks/gpu_suite.py all [--shapes 8x32,32x256] [--seeds 24] [--out DIR]
    python benchmarks/gpu_suite.py shape --experts 8 --m 32        # one shape, one JSON line

`all` runs `pytest tests/gpu` (GPU_SEEDS random cases each), then every DeepSeek-V3
down-projection shape (K = 2048, N = 7168) in its own process (a CUDA error in one shape cannot
poison the next), and prints markdown tables. Times are CUDA-graph replays, median of 7 x 20,
microseconds; every expert full (masked_m = M), like the GPU.md baseline.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
N, K = 7168, 2048
EXPERTS, TOKENS = (8, 16, 32), (16, 32, 64, 128, 256)
# (block_m, block_n, num_warps, num_stages, ctas_per_sm, k_unroll), swept per shape; ctas 0 =
# one program per tile. Dropped after earlier H200 runs (2026-12-02): (128, 128, 4, 3, 0) and
# (128, 256, 8, 3, 1), 2.5x slower (register spills); k_unroll 2, 1.2-1.7x slower; 4 warps at
# block_m 64, 5-10% slower than 8.
SMALL_M = ((64, 128, 8, 4, 2, 1), (64, 128, 8, 3, 2, 1), (64, 128, 8, 5, 2, 1),
           (64, 128, 8, 4, 3, 1), (64, 128, 8, 4, 0, 1), (64, 64, 8, 4, 3, 1),
           (64, 256, 8, 4, 1, 1), (64, 128, 4, 3, 0, 1))
LARGE_M = ((128, 128, 8, 3, 1, 1), (128, 128, 8, 4, 2, 1), (64, 128, 8, 4, 2, 1),
           (64, 128, 8, 3, 3, 1), (128, 64, 8, 4, 2, 1), (128, 64, 4, 4, 2, 1))


def capture_graph(fn: Callable[[], object]):
    """`fn` run 3 times on a side stream (JIT, loads), then captured in a CUDA graph."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def run_in_processes(argv: list[str], jobs: list[str], workers: int) -> None:
    """`argv + [job]` for every job, `workers` processes at a time (JIT warm-ups: a CUDA error
    in one cannot poison the next), with this repo on PYTHONPATH."""
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    pending = list(jobs)
    while pending:
        batch, pending = pending[:workers], pending[workers:]
        for proc in [subprocess.Popen([*argv, job], env=env) for job in batch]:
            proc.wait()


def parse_ints(spec: str, what: str) -> list[tuple[int, ...]]:
    """A `--shapes` value "8x64x32,16x128" -> [(8, 64, 32), ...], each with as many numbers as
    `what` names ("E x C x rows"); a malformed entry ends the run naming it."""
    arity = len(what.split(" x "))
    out = []
    for item in spec.split(","):
        parts = item.strip().split("x")
        if len(parts) != arity or not all(p.isdigit() for p in parts):
            raise SystemExit(f"--shapes: {item!r} is not {what} (e.g. {'x'.join(['8'] * arity)})")
        out.append(tuple(int(p) for p in parts))
    return out


def parse_shapes(spec: str) -> list[tuple[int, int, int]]:
    """`--shapes` "ExCxROWS,..." -> [(E, C, rows)]."""
    return [(e, c, r) for e, c, r in parse_ints(spec, "E x C x rows")]


def measure_shapes(shapes: list[tuple[int, int, int]], measure: Callable[..., dict],
                   save: Callable[[list[dict]], object] | None = None,
                   error_chars: int = 400) -> list[dict]:
    """`measure(e, c, rows)` for every (E, C, rows), one JSON line each; a shape that raises is
    reported (`error`), not fatal. `save(results so far)` after every shape."""
    results = []
    for e, c, r in shapes:
        try:
            res = measure(e, c, r)
        except Exception as exc:  # noqa: BLE001 - one shape's failure is reported, not fatal
            res = {"E": e, "C": c, "rows": r, "error": repr(exc)[:error_chars]}
        print(json.dumps(res), flush=True)
        results.append(res)
        if save is not None:
            save(results)
    return results


def graph_time_us(fn: Callable[[], object], trials: int = 7, replays: int = 20) -> float:
    import torch

    graph = capture_graph(fn)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(trials):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / replays)
    return statistics.median(times)


def down_operands(e: int, cap: int, rows: int, seed: int):
    """Random fp8 operands of the DeepSeek-V3 down GEMM, E experts with `rows` of `cap` rows
    each: (a, a_scale in DeepGEMM's MN-major layout, b, b_scale, masked_m)."""
    import torch

    from sglang_overlap.kernels import fp8

    gen = torch.Generator(device="cuda").manual_seed(seed)
    a, a_s = fp8.quant_per_token_group(
        torch.randn((e, cap, K), generator=gen, device="cuda", dtype=torch.bfloat16))
    b, b_s = fp8.quant_per_block(torch.randn((e, N, K), generator=gen, device="cuda") / K**0.5)
    a_s = fp8.empty_mn_major_scales((e,), cap, K // 128, "cuda").copy_(a_s)  # DeepGEMM's layout
    masked = torch.full((e,), rows, dtype=torch.int32, device="cuda")
    return a, a_s, b, b_s, masked


def run_shape(e: int, m: int, comm_sms: int) -> dict:
    import torch

    from benchmarks.kernels.combine_consumer import combine_consume, combine_reference
    from sglang_overlap.kernels import deepgemm, signal_sliced
    from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
    from sglang_overlap.kernels.signal_fused import SignalGemmConfig, grouped_gemm_fp8_signal
    from sglang_overlap.kernels.signals import new_signal
    from sglang_overlap.planning.sbo_layout import plan_sbo_layout
    from tests.oracle import fp8 as oracle_fp8

    sms = num_sms()
    cap = capacity(m)
    a, a_s, b, b_s, masked = down_operands(e, cap, m, seed=e * 1000 + m)
    out = torch.empty((e, cap, N), dtype=torch.bfloat16, device="cuda")
    ref = torch.bmm(oracle_fp8.dequant_per_token_group(a[:, :m], a_s[:, :m]),
                    oracle_fp8.dequant_per_block(b, b_s).transpose(1, 2))  # [E, M, N] fp64
    res: dict = {"E": e, "M": m, "capacity": cap, "sms": sms, "comm_sms": comm_sms}

    def diff() -> float:
        x, y = out[:, :m].double(), ref
        return float(1 - 2 * (x * y).sum() / (x * x + y * y).sum())

    def layout(cfg: SignalGemmConfig, gran: str, comm: int = 1):
        return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=cfg.block_m,
                               block_n=cfg.block_n, hidden=N, num_sms=sms, comm_num_sms=comm,
                               granularity=gran)  # type: ignore[arg-type]

    def dg_plain() -> None:
        deepgemm.masked_gemm(a, a_s, b, b_s, out, masked, m)

    res["dg_us"] = graph_time_us(dg_plain)
    res["dg_diff"] = diff()
    # fused Triton kernel: sweep tile configs with the per-expert signal
    best: tuple[float, SignalGemmConfig] | None = None
    best_persistent: tuple[float, SignalGemmConfig] | None = None
    sweep: dict[str, float | str] = {}
    for bm, bn, warps, stages, ctas, unroll in SMALL_M if m <= 64 else LARGE_M:
        cfg = SignalGemmConfig(bm, bn, warps, stages, ctas, unroll)
        lay = layout(cfg, "expert")
        sig = new_signal(lay, "cuda")
        try:
            t = graph_time_us(functools.partial(
                grouped_gemm_fp8_signal, a, a_s, b, b_s, masked, out, config=cfg, signal=sig,
                layout=lay, num_programs=cfg.programs(sms)))
        except Exception as exc:  # a config the compiler rejects (shared memory) is skipped
            sweep[str((bm, bn, warps, stages, ctas, unroll))] = repr(exc)[:80]
            continue
        sweep[str((bm, bn, warps, stages, ctas, unroll))] = round(t, 1)
        if best is None or t < best[0]:
            best = (t, cfg)
        if ctas and (best_persistent is None or t < best_persistent[0]):
            best_persistent = (t, cfg)
    assert best is not None and best_persistent is not None, sweep
    res["sweep"], cfg = sweep, best[1]
    res["best_cfg"] = _cfg_tuple(cfg)
    res["persistent_cfg"], res["persistent_us"] = _cfg_tuple(best_persistent[1]), best_persistent[0]
    res["tri_expert_us"] = best[0]
    out.fill_(float("nan"))
    grouped_gemm_fp8_signal(a, a_s, b, b_s, masked, out, config=cfg,
                            signal=new_signal(layout(cfg, "expert"), "cuda"),
                            layout=layout(cfg, "expert"), num_programs=cfg.programs(sms))
    res["tri_diff"] = diff()
    res["tri_plain_us"] = graph_time_us(lambda: grouped_gemm_fp8_signal(
        a, a_s, b, b_s, masked, out, config=cfg, num_programs=cfg.programs(sms)))
    lay_b = layout(cfg, "block")
    sig_b = new_signal(lay_b, "cuda")
    res["tri_block_us"] = graph_time_us(lambda: grouped_gemm_fp8_signal(
        a, a_s, b, b_s, masked, out, config=cfg, signal=sig_b, layout=lay_b,
        num_programs=cfg.programs(sms)))
    lay_x = layout(cfg, "expert")
    sig_x = new_signal(lay_x, "cuda")
    for name, size, streams in (("dg_sliced1_us", 1, 1), ("dg_slicedq_us", max(1, e // 4), 1),
                                ("dg_slicedh_us", max(1, e // 2), 1),
                                ("dg_slicedq2_us", max(1, e // 4), 2)):
        res[name] = graph_time_us(functools.partial(
            signal_sliced.sliced_masked_gemm_signal, a, a_s, b, b_s, out, masked, m,
            signal=sig_x, layout=lay_x, slice_experts=size, streams=streams))
    # overlap needs units that finish in order: the best persistent grid
    res.update(_overlap(e, m, comm_sms, best_persistent[1], a, a_s, b, b_s, masked, out, layout,
                        combine_consume, combine_reference, grouped_gemm_fp8_signal, new_signal,
                        res))
    return res


def capacity(m: int) -> int:
    """Per-expert rows of the buffer: DeepGEMM's masked GEMM needs a multiple of 64 (it wrote
    wrong rows at capacity 16 and 32 on the H200); masked_m stays m."""
    return -(-m // 64) * 64


def _cfg_tuple(cfg) -> list[int]:
    return [cfg.block_m, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.ctas_per_sm,
            cfg.k_unroll]


def _overlap(e, m, comm_sms, cfg, a, a_s, b, b_s, masked, out, layout, combine_consume,
             combine_reference, gemm, new_signal, res) -> dict:
    """GEMM + consumer: one after the other on one stream vs. consumer on a side stream."""
    import torch

    from sglang_overlap.kernels import deepgemm, signal_sliced

    lay = layout(cfg, "expert", comm_sms)
    lay_b = layout(cfg, "block", comm_sms)
    sig, sig_b = new_signal(lay, "cuda"), new_signal(lay_b, "cuda")
    # the no-wait consumer on all SMs uses small row blocks, so it has units for every SM
    lay_all = layout(type(cfg)(block_m=16, block_n=cfg.block_n), "block", comm_sms)
    tokens = max(1, e * m // 8)
    gen = torch.Generator(device="cuda").manual_seed(7)
    cap = out.shape[1]
    src = torch.randint(0, tokens, (e, cap), generator=gen, device="cuda", dtype=torch.int32)
    weight = torch.rand((e, cap), generator=gen, device="cuda")
    acc = torch.zeros((tokens, N), dtype=torch.float32, device="cuda")
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    side = torch.cuda.Stream()
    progs = cfg.programs(lay.compute_num_sms)

    def consume(la, sg, programs: int, wait: bool = True) -> None:
        combine_consume(out, masked, src, weight, acc, signal=sg, layout=la,
                        num_programs=programs, error=err, wait=wait)

    def fused() -> None:
        gemm(a, a_s, b, b_s, masked, out, config=cfg, signal=sig, layout=lay, num_programs=progs)

    def fused_block() -> None:
        gemm(a, a_s, b, b_s, masked, out, config=cfg, signal=sig_b, layout=lay_b,
             num_programs=progs)

    def sliced() -> None:
        with deepgemm.num_sms_scope(lay.compute_num_sms):
            signal_sliced.sliced_masked_gemm_signal(a, a_s, b, b_s, out, masked, m, signal=sig,
                                               layout=lay, slice_experts=max(1, e // 4))

    def sliced2() -> None:
        with deepgemm.num_sms_scope(lay.compute_num_sms):
            signal_sliced.sliced_masked_gemm_signal(a, a_s, b, b_s, out, masked, m, signal=sig,
                                               layout=lay, slice_experts=max(1, e // 4),
                                               streams=2)

    def serial(producer, la, sg) -> Callable[[], None]:
        def fn() -> None:
            sg.zero_()
            producer()
            consume(la, sg, la.comm_num_sms)
        return fn

    def overlapped(producer, la, sg) -> Callable[[], None]:
        def fn() -> None:
            sg.zero_()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                consume(la, sg, la.comm_num_sms)
            producer()
            torch.cuda.current_stream().wait_stream(side)
        return fn

    r: dict = {"consumer_comm_us": graph_time_us(lambda: consume(lay, sig, comm_sms, False)),
               "consumer_all_us": graph_time_us(
                   lambda: consume(lay_all, sig, res["sms"] * 4, False))}
    for name, producer, la, sg in (("fused", fused, lay, sig), ("fusedblk", fused_block, lay_b,
                                   sig_b), ("sliced", sliced, lay, sig),
                                   ("sliced2", sliced2, lay, sig)):
        r[f"{name}_serial_us"] = graph_time_us(serial(producer, la, sg))
        r[f"{name}_overlap_us"] = graph_time_us(overlapped(producer, la, sg))
    # one checked run after the timings: poisoned output, fresh accumulator
    ok = err.item() == 0
    for producer, la, sg in ((fused, lay, sig), (fused_block, lay_b, sig_b), (sliced, lay, sig),
                             (sliced2, lay, sig)):
        out.fill_(float("nan"))
        acc.zero_()
        overlapped(producer, la, sg)()
        torch.cuda.synchronize()
        want = combine_reference(out, masked, src, weight, tokens)
        ok = ok and err.item() == 0 and not bool(acc.isnan().any()) and bool(
            torch.allclose(acc, want, rtol=1e-4, atol=1e-3))
    r["overlap_ok"] = ok
    return r


def dg_warm_list(comm_sms: int, sms: int = 132) -> list[tuple]:
    """Every DeepGEMM kernel the suite and tests/gpu JIT-compile: (kind, groups, m, n, k,
    expected_m, sms). Compiling them in parallel processes first saves minutes of nvcc."""
    jobs = {("contig", 4, 0, 4096, 2048, 0, sms), ("contig", 4, 0, 1024, 2048, 0, sms),
            ("contig", 4, 0, 2048, 512, 0, sms), ("masked", 4, 128, N, K, 64, sms),
            ("masked", 8, 64, N, K, 64, sms), ("masked", 4, 64, 1024, 2048, 32, sms),
            ("masked", 4, 64, 2048, 512, 32, sms), ("masked", 2, 128, N, K, 64, sms - 4),
            ("masked", 1, 128, 2048, 512, 128, sms - 4)}
    for ex in (64, 128, 256):  # the runner tests
        jobs |= {("masked", 4, 128, 1024, 2048, ex, sms), ("masked", 4, 128, 2048, 512, ex, sms)}
    jobs.add(("masked", 2, 128, 2048, 512, 256, sms - 4))
    for e in EXPERTS:
        for m in TOKENS:
            q, c = max(1, e // 4), capacity(m)
            jobs |= {("masked", e, c, N, K, m, sms), ("masked", 1, c, N, K, m, sms),
                     ("masked", q, c, N, K, m, sms), ("masked", q, c, N, K, m, sms - comm_sms),
                     ("masked", max(1, e // 2), c, N, K, m, sms)}
    return sorted(jobs)


def dg_warm(index: int, workers: int, comm_sms: int) -> None:
    import torch

    from sglang_overlap.kernels import deepgemm, fp8

    for kind, groups, m, n, k, expected, sms in dg_warm_list(comm_sms)[index::workers]:
        b = torch.empty((groups, n, k), dtype=fp8.FP8, device="cuda")
        b_s = torch.ones((groups, n // 128, k // 128), device="cuda")
        with deepgemm.num_sms_scope(sms):
            if kind == "masked":
                a = torch.empty((groups, m, k), dtype=fp8.FP8, device="cuda")
                a_s = torch.ones((groups, m, k // 128), device="cuda")
                out = torch.empty((groups, m, n), dtype=torch.bfloat16, device="cuda")
                zero = torch.zeros(groups, dtype=torch.int32, device="cuda")
                deepgemm.masked_gemm(a, a_s, b, b_s, out, zero, expected)
            else:
                rows = groups * 128
                a = torch.zeros((rows, k), dtype=fp8.FP8, device="cuda")
                a_s = torch.ones((rows, k // 128), device="cuda")
                m_idx = torch.arange(groups, device="cuda").repeat_interleave(128).int()
                out = torch.empty((rows, n), dtype=torch.bfloat16, device="cuda")
                deepgemm.contiguous_gemm(a, a_s, b, b_s, out, m_idx)
        torch.cuda.synchronize()


def warm_all(workers: int, comm_sms: int, env: dict) -> str:
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "warm", "--index", str(i), "--of",
                               str(workers), "--comm-sms", str(comm_sms)], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(workers)]
    failed = [p.communicate()[0][-300:] for p in procs if p.wait() != 0]
    jobs = len(dg_warm_list(comm_sms))
    return f"DeepGEMM warm-up: {jobs} kernels, {workers} processes, {time.time() - t0:.0f} s" + (
        f", {len(failed)} failed: {failed[0]}" if failed else "")


def _fmt(x: float) -> str:
    return f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def tables(rows: list[dict]) -> str:
    out = ["### Down GEMM with signals vs one plain DeepGEMM masked launch (us; ratio = x / DG; "
           "masked_m = M, capacity = M rounded up to 64)",
           "| E | M | DG plain | Triton plain | Triton+expert sig | ratio | Triton+block sig | "
           "ratio | DG sliced 1 | ratio | DG sliced E/4 | ratio | DG sliced E/2 | ratio | "
           "DG sliced E/4 on 2 streams | ratio | best tile | diff DG / Triton |",
           "|" + "---|" * 18]
    for r in rows:
        if "error" in r:
            out.append(f"| {r['E']} | {r['M']} | failed: {r['error'][:120]} |")
            continue
        dg = r["dg_us"]
        cells = [r["E"], r["M"], _fmt(dg), _fmt(r["tri_plain_us"])]
        for key in ("tri_expert_us", "tri_block_us", "dg_sliced1_us", "dg_slicedq_us",
                    "dg_slicedh_us", "dg_slicedq2_us"):
            cells += [_fmt(r[key]), f"{r[key] / dg:.2f}"]
        cells += [str(tuple(r["best_cfg"])), f"{r['dg_diff']:.1e} / {r['tri_diff']:.1e}"]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    out += ["", "### GEMM + consumer (local combine) on the comm SMs: one after the other vs "
            "overlapped (us; ratio = overlapped / serial)",
            "| E | M | comm SMs | consumer alone | fused serial | fused overlapped | ratio | "
            "ideal | fused per-block serial | overlapped | ratio | DG sliced E/4 serial | "
            "overlapped | ratio | E/4 2 streams serial | overlapped | ratio | "
            "best plain GEMM + consumer on all SMs | fused tile (persistent) | checked |",
            "|" + "---|" * 20]
    for r in rows:
        if "error" in r:
            continue
        plain = min(r["dg_us"], r["tri_plain_us"]) + r["consumer_all_us"]
        cells = [r["E"], r["M"], r["comm_sms"], _fmt(r["consumer_comm_us"])]
        for name in ("fused", "fusedblk", "sliced", "sliced2"):
            s, o = r[f"{name}_serial_us"], r[f"{name}_overlap_us"]
            cells += [_fmt(s), _fmt(o), f"{o / s:.2f}"]
            if name == "fused":  # the best overlap can do: the longer of the two alone
                c = r["consumer_comm_us"]
                cells.append(f"{max(s - c, c) / s:.2f}")
        cells += [_fmt(plain), str(tuple(r["persistent_cfg"])),
                  "ok" if r["overlap_ok"] else "FAILED"]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def run_all(args: argparse.Namespace) -> int:
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SGLANG_OVERLAP_GPU_SEEDS=str(args.seeds), PYTHONUNBUFFERED="1")
    if args.warm_workers:
        print(warm_all(args.warm_workers, args.comm_sms, env), flush=True)
    t0 = time.time()
    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *args.tests], cwd=ROOT, env=env, capture_output=True, text=True)
    summary = (test.stdout.strip().splitlines() or ["(no output)"])[-1]
    (out_dir / "pytest_gpu.txt").write_text(test.stdout + test.stderr)
    print(f"pytest {' '.join(args.tests)}: {summary} ({time.time() - t0:.0f} s)", flush=True)
    if test.returncode:
        print(test.stdout[-6000:], flush=True)
    rows = []
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    for e, m in shapes:
        t1 = time.time()
        cmd = [sys.executable, __file__, "shape", "--experts", str(e), "--m", str(m),
               "--comm-sms", str(args.comm_sms)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                               timeout=args.shape_timeout)
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                "E": e, "M": m, "error": (p.stderr or p.stdout).strip()[-400:]}
        except subprocess.TimeoutExpired:
            row = {"E": e, "M": m, "error": f"timeout after {args.shape_timeout} s"}
        rows.append(row)
        print(f"E={e} M={m}: {time.time() - t1:.0f} s {json.dumps(row)}", flush=True)
        (out_dir / "results.json").write_text(json.dumps(rows, indent=1))
        (out_dir / "tables.md").write_text(f"pytest: {summary}\n\n{tables(rows)}\n")
    text = tables(rows)
    (out_dir / "tables.md").write_text(f"pytest: {summary}\n\n{text}\n")
    print("\n" + text, flush=True)
    return 1 if test.returncode or any("error" in r for r in rows) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_all = sub.add_parser("all", help="GPU tests, then every shape, then tables")
    p_all.add_argument("--shapes", default=",".join(f"{e}x{m}" for e in EXPERTS for m in TOKENS))
    p_all.add_argument("--seeds", type=int, default=24)
    p_all.add_argument("--tests", nargs="*", default=["tests/gpu"])
    p_all.add_argument("--comm-sms", type=int, default=8)
    p_all.add_argument("--shape-timeout", type=int, default=240)
    p_all.add_argument("--out", default=os.environ.get("OUT", ".gpu-out"))
    p_all.add_argument("--warm-workers", type=int, default=14,
                       help="processes that JIT-compile DeepGEMM kernels first (0 = none)")
    p_warm = sub.add_parser("warm", help="JIT-compile a share of the DeepGEMM kernels")
    p_warm.add_argument("--index", type=int, required=True)
    p_warm.add_argument("--of", type=int, required=True)
    p_warm.add_argument("--comm-sms", type=int, default=8)
    p_one = sub.add_parser("shape", help="one (experts, tokens per expert) shape as JSON")
    p_one.add_argument("--experts", type=int, required=True)
    p_one.add_argument("--m", type=int, required=True)
    p_one.add_argument("--comm-sms", type=int, default=8)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.cmd == "warm":
        dg_warm(args.index, args.of, args.comm_sms)
        return 0
    if args.cmd == "shape":
        print(json.dumps(run_shape(args.experts, args.m, args.comm_sms)), flush=True)
        return 0
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
