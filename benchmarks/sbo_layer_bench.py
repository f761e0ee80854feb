"""H200: the SBO MoE layer on DeepEP + DeepGEMM (benchmarks/harness/sbo_layer.py), per shape,
for the deep_ep tree on PYTHONPATH (each tree in its own process):

    python benchmarks/sbo_layer_bench.py run [--shapes 8x1,32x256] [--out DIR]   # JSON lines
    python benchmarks/sbo_layer_bench.py table DIR/sbo_*.jsonl                   # markdown
    python benchmarks/sbo_layer_bench.py warm --of 16                            # JIT warm-up

Per shape (E_local experts, T tokens per rank, top-8, H 7168, I 2048, N 256): the layer with no
overlap / the shared expert in the dispatch window / full SBO, each stage alone, and the hidden
fraction (serial - overlapped) / min(communication, computation). Times are CUDA-graph replays
(eager CUDA-event timing where capture fails), median of 5 x 20, microseconds. Every shape first
runs eagerly with the watchdog and is checked against serial. `run` restarts its worker after a
shape that stalls (per-shape deadline), so one hang costs one shape.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.sbo_common import BENCH_SHAPES, N_MAX, TEST_SHAPES, init, routing, use  # noqa

MODES: tuple[Literal["serial", "shared", "sbo"], ...] = ("serial", "shared", "sbo")


class _Eager(Exception):
    pass


def timed(fn: Callable[[], object], trials: int = 5, reps: int = 20,
          graph: bool = True) -> tuple[float, str]:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    run: Callable[[], object] = fn
    how = "graph" if graph else "eager"
    try:
        if not graph:
            raise _Eager
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        run = g.replay
    except _Eager:
        pass
    except Exception as exc:  # capture unsupported for this sequence: eager timing
        torch.cuda.synchronize()
        how = f"eager ({type(exc).__name__}: {str(exc)[:160]})"
    times = []
    for _ in range(trials):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(reps):
            run()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1000 / reps)
    return statistics.median(times), how


def bench_shape(ctx: dict, e: int, t: int) -> dict:
    import torch

    from benchmarks.harness.sbo_layer import DeepEPSboLayer, MoeShape, MoeWeights

    shape = MoeShape(num_experts=e * ctx["world"], world_size=ctx["world"],
                     num_max_dispatch_tokens_per_rank=N_MAX)
    weights = MoeWeights.random(shape, seed=e)
    layer = DeepEPSboLayer(use(ctx, shape.num_experts), shape, weights, form=ctx["form"],
                           watchdog_s=20.0)
    x = (torch.randn((t, shape.hidden), device="cuda") * 0.5).bfloat16()
    idx = routing(t, shape.num_experts, 8, seed=t)
    w = torch.rand((t, 8), device="cuda")
    res: dict = {"E": e, "T": t, "deep_ep": ctx["version"], "form": ctx["form"],
                 "world": ctx["world"], "expected_m": shape.expected_m(t)}
    outs = {m: layer.forward(x, idx, w, mode=m) for m in MODES}  # eager, watchdog on
    torch.cuda.synchronize()
    s = outs["serial"].float()
    for m in ("shared", "sbo"):
        res[f"rel_{m}"] = float((outs[m].float() - s).norm() / s.norm())
    if layer.form is not None:
        lay = layer.layout(t)
        res.update(comm_sms=lay.comm_num_sms, compute_sms=lay.compute_num_sms)
        from sglang_overlap.kernels.down_gemm import choose_signal_path

        res["signal_path"] = choose_signal_path(e, shape.expected_m(t), shape.capacity).path
    layer.watchdog_s = None  # host waits cannot be captured
    for m in MODES:
        res[f"{m}_us"], res[f"{m}_how"] = timed(partial(layer.forward, x, idx, w, mode=m))
        res[f"{m}_eager_us"], _ = timed(partial(layer.forward, x, idx, w, mode=m), graph=False)
    pending, hook = layer.dispatch_send(x, idx)
    hook()
    d = layer.dispatched(pending)
    act = layer.experts_up(d)
    out = layer.down(act, d)

    def dispatch() -> None:
        _p, h = layer.dispatch_send(x, idx)
        h()

    def combine() -> None:
        _c, h = layer.combine_send(out, d, idx, w)
        h()

    res["dispatch_us"], _ = timed(dispatch)
    res["combine_us"], _ = timed(combine)
    res["shared_expert_us"], _ = timed(lambda: layer.shared_expert(x))
    res["up_act_us"], _ = timed(lambda: layer.experts_up(d))
    res["down_us"], _ = timed(lambda: layer.down(act, d, out=out))
    if layer.form is not None:
        lay = layer.layout(t)
        from sglang_overlap.kernels.signals import new_signal

        res["signal_down_us"], _ = timed(lambda: layer.down(
            act, d, signal=new_signal(lay, "cuda"), layout=lay, out=out))
    comm = res["dispatch_us"] + res["combine_us"]
    comp = res["shared_expert_us"] + res["up_act_us"] + res["down_us"]
    res["comm_us"], res["comp_us"] = comm, comp
    res["hidden_shared"] = (res["serial_us"] - res["shared_us"]) / min(res["dispatch_us"],
                                                                       res["shared_expert_us"])
    res["hidden_sbo"] = (res["serial_us"] - res["sbo_us"]) / min(comm, comp)
    return res


def worker(shapes: list[tuple[int, int]]) -> None:
    ctx = init()
    for e, t in shapes:
        t0 = time.time()
        try:
            row = bench_shape(ctx, e, t)
        except Exception as exc:  # a kernel error poisons the context: report and stop
            print(json.dumps({"E": e, "T": t, "error": f"{type(exc).__name__}: {exc}"[:400]}),
                  flush=True)
            os._exit(3)
        row["wall_s"] = round(time.time() - t0, 1)
        if ctx["rank"] == 0:  # under torchrun every rank runs the shape; rank 0 reports
            print(json.dumps(row), flush=True)
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    os._exit(0)


def run(shapes: list[tuple[int, int]], out: Path, deadline_s: float) -> int:
    """Workers over `shapes`; a shape past its deadline is recorded and the rest go on."""
    rows: list[dict] = []
    todo = list(shapes)
    while todo:
        p = subprocess.Popen([sys.executable, __file__, "worker", "--shapes",
                              ",".join(f"{e}x{t}" for e, t in todo)], stdout=subprocess.PIPE,
                             text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        lines: list[str] = []
        reader = threading.Thread(target=lambda p=p, lines=lines: lines.extend(
            iter(p.stdout.readline, "")), daemon=True)
        reader.start()
        seen, last = 0, time.time()
        while p.poll() is None and time.time() - last < deadline_s:
            time.sleep(0.5)
            rows_now = [ln for ln in lines if ln.startswith("{")]
            if len(rows_now) > seen:
                seen, last = len(rows_now), time.time()
        if p.poll() is None:
            p.kill()
        p.wait()
        reader.join(5)
        got = [json.loads(ln) for ln in lines if ln.startswith("{")]
        for r in got:
            print(json.dumps(r), flush=True)
        rows += got
        done = {(r["E"], r["T"]) for r in got}
        if len(got) < len(todo) and todo[len(got)] not in done:
            e, t = todo[len(got)]
            rows.append({"E": e, "T": t, "error": f"stalled past {deadline_s:.0f} s (killed)"})
            print(json.dumps(rows[-1]), flush=True)
            got.append(rows[-1])
        todo = todo[len(got):]
        with out.open("w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    return 1 if any("error" in r for r in rows) else 0


def _f(x: float) -> str:
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.2f}"


def table(paths: list[Path]) -> str:
    rows = [json.loads(ln) for p in paths for ln in p.read_text().splitlines() if ln.strip()]
    head = ("| deep_ep (form) | E | T | rows/expert | no overlap | shared-expert overlap | "
            "full SBO | SBO path, SMs comm/compute | dispatch | combine | shared expert | "
            "up+act | down | signal down | comm | comp | hidden (shared) | hidden (SBO) | "
            "rel err SBO vs serial | timing |")
    out = [head, "|" + "---|" * 20]
    for r in rows:
        name = f"{r.get('deep_ep', '?')} ({r.get('form')})"
        if "error" in r:
            out.append(f"| {name} | {r['E']} | {r['T']} | failed: {r['error'][:150]} |")
            continue
        cells = [name, r["E"], r["T"], r["T"] * 8 // r["E"], _f(r["serial_us"]), _f(r["shared_us"]),
                 _f(r["sbo_us"]), f"{r.get('signal_path', '-')}, {r.get('comm_sms', '-')}/"
                 f"{r.get('compute_sms', '-')}", _f(r["dispatch_us"]), _f(r["combine_us"]),
                 _f(r["shared_expert_us"]), _f(r["up_act_us"]), _f(r["down_us"]),
                 _f(r.get("signal_down_us", float("nan"))), _f(r["comm_us"]), _f(r["comp_us"]),
                 f"{r['hidden_shared']:.2f}", f"{r['hidden_sbo']:.2f}", f"{r['rel_sbo']:.1e}",
                 f"{r['sbo_how'][:70]}; eager {_f(r['serial_eager_us'])} / "
                 f"{_f(r['sbo_eager_us'])}"]
        out.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(out)


def warm(of: int) -> int:
    """Compile every kernel of TEST_SHAPES + BENCH_SHAPES in `of` parallel processes."""
    jobs = sorted(set(TEST_SHAPES) | set(BENCH_SHAPES))
    t0 = time.time()
    procs = [subprocess.Popen([sys.executable, __file__, "warm", "--of", "1", "--shapes",
                               ",".join(f"{e}x{t}" for e, t in jobs[i::of])])
             for i in range(of)]
    bad = sum(p.wait() != 0 for p in procs)
    print(f"warm-up: {len(jobs)} shapes in {of} processes, {time.time() - t0:.0f} s, "
          f"{bad} failed", flush=True)
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("run", "worker", "table", "warm"))
    ap.add_argument("paths", nargs="*", type=Path)
    ap.add_argument("--shapes", default=",".join(f"{e}x{t}" for e, t in BENCH_SHAPES))
    ap.add_argument("--out", type=Path, default=Path("."))
    ap.add_argument("--deadline", type=float, default=150.0)
    ap.add_argument("--of", type=int, default=1)
    a = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in a.shapes.split(",") if s]
    if a.cmd == "worker":
        worker(shapes)  # type: ignore[arg-type]
    if a.cmd == "warm":
        if a.of > 1:
            return warm(a.of)
        from benchmarks.sbo_common import warm_experts

        warm_experts(shapes)  # type: ignore[arg-type]
        return 0
    if a.cmd == "table":
        print(table(a.paths))
        return 0
    tag = os.environ.get("SBO_TREE", "deep_ep")
    a.out.mkdir(parents=True, exist_ok=True)
    return run(shapes, a.out / f"sbo_{tag}.jsonl", a.deadline)  # type: ignore[arg-type]


if __name__ == "__main__":
    sys.exit(main())
