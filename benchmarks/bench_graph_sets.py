"""Decode CUDA-graph sets per overlap mode on one GPU: what they cost to capture and hold, how
fast each replays, and the mode selector choosing among them per step (same run):

    python benchmarks/bench_graph_sets.py [--layers 4] [--experts 8] [--steps 2000]
        [--rounds 6] [--json F]          # deep_ep tree on PYTHONPATH (run_gpu.sh graphsets)

The model: `--layers` MoE decode layers (benchmarks/harness/graph_sets.py `MoeStack` over the
harness's `DeepEPSboLayer`: DeepEP low-latency dispatch/combine on one rank, DeepGEMM fp8
masked GEMMs, bf16 shared expert; H 7168, I 2048, top-8, E routed experts, N 256), no
attention. Modes: none (serial), sbo (the harness's SBO), tbo (two micro-batches on two
streams; graph_sets.py says exactly what).

1. Capture: upstream's single set (one mode, every size) against the per-mode sets (tbo+none,
   tbo+sbo+none) into one shared pool, largest size first: wall seconds (SGLang's two warm-up
   runs per graph included), MiB of memory_reserved / memory_allocated growth and of the pool's
   own segments, and each as a ratio to the single none set. `--capture-rounds` repeats.
2. Replay: per (mode, size), CUDA-event time of single replays, median and p10-p90 (us), and
   the replay output's relative error against none's.
3. Selector: a drifting decode trace (`gating_trace.decode_trace`) run by every fixed mode and
   by "auto" (the plugin's ModeSelector through its SelectorRuntime, a fresh one per round,
   timed by the replays' own events), rounds alternating in order. Totals: host wall time of
   the pass (the host stays at most one step ahead, as a server's does) and summed step times
   (ms); auto's throughput ratio (best fixed time / auto time) with a paired 95% CI; steps
   auto ran per mode, explored steps and their cost over the fastest mode (median replays).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import gating_trace as gt  # noqa: E402
from sglang_overlap.cli.bench_stats import round_orders  # noqa: E402
from sglang_overlap.modes import Mode  # noqa: E402

SIZES = (1, 4, 16, 32, 64, 128, 256)
CONFIGS = (("none",), ("tbo",), ("sbo",), ("tbo", "none"), ("tbo", "sbo", "none"))
MIB = 1 << 20


def warm_shapes(experts: int, sizes: tuple[int, ...]) -> str:
    """The (E x T) shapes every mode runs (sizes and TBO halves), for sbo_layer_bench warm."""
    ts = sorted({t for b in sizes for t in (b, (b + 1) // 2, b // 2) if t >= 1})
    return ",".join(f"{experts}x{t}" for t in ts)


def build(layers: int, experts: int) -> tuple[Any, Any, dict[str, Any]]:
    import torch

    from benchmarks.harness.graph_sets import MoeStack
    from benchmarks.harness.sbo_layer import DeepEPSboLayer, MoeShape, MoeWeights
    from benchmarks.sbo_common import HIDDEN, N_MAX, init, routing, use

    ctx = init(num_experts_max=experts)
    shape = MoeShape(num_experts=experts, num_max_dispatch_tokens_per_rank=N_MAX)
    buffer = use(ctx, experts)
    stack, routes = [], []
    for li in range(layers):
        stack.append(DeepEPSboLayer(buffer, shape, MoeWeights.random(shape, seed=li),
                                    form=ctx["form"]))
        gen = torch.Generator(device="cuda").manual_seed(100 + li)
        routes.append((routing(N_MAX, experts, 8, seed=li),
                       torch.rand((N_MAX, 8), generator=gen, device="cuda")))
    x = (torch.randn((N_MAX, HIDDEN), device="cuda") * 0.5).bfloat16()
    info = {"deep_ep": ctx["version"], "form": ctx["form"], "card": torch.cuda.get_device_name(),
            "torch": torch.__version__, "layers": layers, "experts": experts}
    return MoeStack(stack, routes), x, info


def rel(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def eager_check(stack: Any, x: Any, sizes: tuple[int, ...]) -> dict[str, float]:
    """Every mode eagerly at every size (loads every kernel); error of tbo/sbo against none,
    and of tbo against none run on each micro-batch alone ("tbo_halves": what TBO computes)."""
    import torch

    errs = {}
    for bs in sizes:
        ref = stack.forward(x[:bs], "none")
        for mode in ("tbo", "sbo"):
            if mode == "tbo" and bs < 2:
                continue
            errs[f"{mode}@{bs}"] = rel(stack.forward(x[:bs], mode), ref)
        if bs >= 2:
            h = (bs + 1) // 2
            halves = torch.cat([stack.forward(x[:h], "none"),
                                stack.forward(x[h:bs], "none", first=h)])
            errs[f"tbo_halves@{bs}"] = rel(stack.forward(x[:bs], "tbo"), halves)
    torch.cuda.synchronize()
    return errs


def capture_table(stack: Any, x: Any, sizes: tuple[int, ...], rounds: int
                  ) -> tuple[list[dict[str, Any]], Any]:
    """Every config of CONFIGS, `rounds` times; returns the rows and the last 3-mode capture."""
    from benchmarks.harness.graph_sets import capture_sets, release

    rows, keep, res = [], None, None
    for r in range(rounds):
        for modes in CONFIGS:
            keep = res = None  # the last capture's graphs go back to the allocator first
            release()
            res = capture_sets(stack, x, modes, list(sizes))
            rows.append({"round": r, **res.row()})
            print(f"captured {'+'.join(modes)}: {len(res.graphs)} graphs, {res.wall_s:.2f} s, "
                  f"pool {res.pool_bytes}", flush=True)
            keep = res
    return rows, keep


def replay_table(graphs: dict, reps: int = 50) -> dict[tuple[str, int], dict[str, float]]:
    """Single-replay CUDA-event times (us) per graph, and its output's error against none."""
    import torch

    out: dict[tuple[str, int], dict[str, float]] = {}
    for (mode, bs), (g, y) in sorted(graphs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        for _ in range(5):
            g.replay()
        times = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            g.replay()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        q = statistics.quantiles(times, n=10)
        out[mode, bs] = {"median": statistics.median(times), "p10": q[0], "p90": q[-1],
                         "out": y.clone()}
    for (_mode, bs), row in out.items():
        row["rel_vs_none"] = rel(row["out"], out["none", bs]["out"])
    for row in out.values():
        del row["out"]
    return out


def make_replay(graphs: dict) -> Any:
    """replay(mode, bs) -> (start, end) events; waits for the previous step's end first (the
    host runs at most one step ahead)."""
    import torch

    prev: list[Any] = [None]

    def replay(mode: str, bs: int) -> tuple[Any, Any]:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        graphs[mode, bs][0].replay()
        e.record()
        if prev[0] is not None:
            prev[0].synchronize()
        prev[0] = e
        return s, e

    return replay


def selector_rounds(graphs: dict, trace: list[int], sizes: tuple[int, ...], rounds: int
                    ) -> dict[str, Any]:
    import torch

    keys = frozenset(graphs)
    policies = ["none", "tbo", "sbo", "auto"]
    wall: dict[str, list[float]] = {p: [] for p in policies}
    gpu: dict[str, list[float]] = {p: [] for p in policies}
    auto_runs: list[gt.PassResult] = []
    for order in round_orders(len(policies), rounds):
        for i in order:
            p = policies[i]
            rt = gt.new_runtime(frozenset({Mode.TBO, Mode.SBO})) if p == "auto" else None
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            res = gt.run_policy(p, trace, sizes, keys, make_replay(graphs), rt)
            torch.cuda.synchronize()
            res.wall_s = time.perf_counter() - t0
            wall[p].append(res.wall_s * 1e3)
            gpu[p].append(sum(res.step_us()) / 1e3)
            if p == "auto":
                res.events = []  # keep the modes, drop the events
                auto_runs.append(res)
            print(f"  {p}: wall {wall[p][-1]:.1f} ms, steps {gpu[p][-1]:.1f} ms", flush=True)
    return {"wall_ms": wall, "steps_ms": gpu, "auto_runs": auto_runs}


def report(info: dict, errs: dict, caps: list[dict], table: dict, sel: dict,
           trace: list[int], keys: frozenset) -> tuple[str, dict[str, Any]]:
    from benchmarks.graph_sets_report import render

    return render(info, errs, caps, table, sel, trace, keys)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--capture-rounds", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--print-warm-shapes", action="store_true")
    a = ap.parse_args()
    sizes = tuple(sorted(int(s) for s in a.sizes.split(",") if s))
    if a.print_warm_shapes:
        print(warm_shapes(a.experts, sizes))
        return 0
    t0 = time.time()
    stack, x, info = build(a.layers, a.experts)
    errs = eager_check(stack, x, sizes)
    print(f"built + eager check in {time.time() - t0:.0f} s: {info}", flush=True)
    caps, kept = capture_table(stack, x, sizes, a.capture_rounds)
    table = replay_table(kept.graphs)
    trace = gt.decode_trace(a.steps, max(sizes), seed=a.seed)
    sel = selector_rounds(kept.graphs, trace, sizes, a.rounds)
    text, data = report(info | {"sizes": list(sizes), "steps": a.steps, "rounds": a.rounds},
                        errs, caps, table, sel, trace, frozenset(kept.graphs))
    print(text)
    if a.json:
        a.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
