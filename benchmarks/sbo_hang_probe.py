"""When can an overlapped DeepEP combine send and its producer deadlock? Each scenario runs in
its own process with a timeout (a real hang costs only that), for the deep_ep on PYTHONPATH:

    python benchmarks/sbo_hang_probe.py all [--timeout 25] [--out DIR]   # table (markdown)
    python benchmarks/sbo_hang_probe.py one SCENARIO                     # one JSON line

The send (signals zero, `return_recv_hook=True`) is launched first on the communication stream;
the signal is then set by:
  sleep_cold / sleep_warm / sleep_cold_eager   a side-stream `torch.cuda._sleep` + a fill (the
        probe_wait.py case), with the sleep kernel never launched before / launched once before /
        never launched but CUDA_MODULE_LOADING=EAGER
  gemm_{cold,warm}_after_{fused,sliced}        the served signal down GEMM launched after the
        send, its kernels never launched before (cold) or launched once (warm)
  gemm_cold_before_{fused,sliced}              the plugin's order: producer launched first
A watchdog thread releases the signal from the host after `--release` s (copy engine), so a
scenario reports whether the main thread was blocked inside a CUDA call (e.g. a lazy kernel
load waiting for the spinning send) and whether a host release still gets through.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.sbo_common import HIDDEN, N_MAX, init, routing  # noqa: E402

SCENARIOS = ("sleep_cold", "sleep_warm", "sleep_cold_eager", "gemm_cold_after_fused",
             "gemm_warm_after_fused", "gemm_cold_before_fused", "gemm_cold_after_sliced",
             "gemm_warm_after_sliced", "gemm_cold_before_sliced")
T0 = time.time()


def say(what: str) -> None:
    print(f"[{time.time() - T0:6.2f}s] {what}", flush=True)


def one(name: str, release_s: float) -> dict:
    import torch

    from benchmarks.harness.sbo_layer import DeepEPSboLayer, MoeShape, MoeWeights
    from benchmarks.harness.sbo_watchdog import release, wait_event

    ctx = init(num_experts_max=8)
    e, t = 8, (32 if name.endswith("fused") else 128)  # E 8: T 32 -> fused, T 128 -> sliced
    shape = MoeShape(num_experts=8, num_max_dispatch_tokens_per_rank=N_MAX)
    layer = DeepEPSboLayer(ctx["buffer"], shape, MoeWeights.random(shape, 0), form=ctx["form"])
    x = torch.randn((t, HIDDEN), device="cuda").bfloat16()
    idx, w = routing(t, e, 8, 1), torch.rand((t, 8), device="cuda")
    lay = layer.layout(t)
    pending, hook = layer.dispatch_send(x, idx)
    hook()
    d = layer.dispatched(pending)
    act = layer.experts_up(d)  # loads the up GEMM and SiLU kernels; not the down GEMM
    sig = torch.zeros(lay.signal_shape, dtype=torch.int32, device="cuda")
    signal = sig.view(torch.uint32) if lay.signal_dtype == "uint32" else sig
    sig.fill_(lay.expect_value)  # loads the fill kernel for this dtype
    warm = layer.down(act, d)  # plain down GEMM: loaded in every scenario
    # the sleep scenarios' "producer" is the fill alone: their rows are final already
    out = warm.clone() if name.startswith("sleep") else torch.full_like(warm, float("nan"))
    out2, h2 = layer.combine_send(out, d, idx, w, signal=signal, layout=lay)  # overlap kernel
    h2()
    if name == "sleep_warm":
        torch.cuda._sleep(1000)
    if name.startswith("gemm_warm"):
        layer.down(act, d, signal=signal, layout=lay, out=out)
    sig.zero_()
    torch.cuda.synchronize()
    say("warm-up done; signals zero")
    before = name.startswith("gemm_cold_before")
    if before:
        layer.down(act, d, signal=signal, layout=lay, out=out)
        say("producer launched (before the send)")
    ready = torch.cuda.Event()
    ready.record()
    layer.comm_stream.wait_event(ready)
    with torch.cuda.stream(layer.comm_stream):
        combined, chook = layer.combine_send(out, d, idx, w, signal=signal, layout=lay)
        sent = torch.cuda.Event()
        sent.record()
    say("send launched")
    fired: list[float] = []

    def watchdog() -> None:
        if not wait_event(sent, release_s):
            fired.append(time.time() - T0)
            say("watchdog: releasing the signal from the host")
            fired.append(float(release(signal, lay, timeout_s=5.0)))

    dog = threading.Thread(target=watchdog, daemon=True)
    dog.start()
    if name.startswith("sleep"):
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            say("launching _sleep on a side stream")
            torch.cuda._sleep(20_000_000)
            say("launched _sleep; launching the fill")
            sig.fill_(lay.expect_value)
        say("fill launched")
    elif not before:
        say("launching the producer after the send")
        layer.down(act, d, signal=signal, layout=lay, out=out)
        say("producer launched")
    done = wait_event(sent, release_s + 10)
    say(f"send finished: {done}")
    layer.combine_recv(chook)
    torch.cuda.synchronize()
    ref = layer.forward(x, idx, w, mode="serial") - layer.shared_expert(x)
    rel = float((combined.float() - ref.float()).norm() / ref.float().norm())
    return {"scenario": name, "finished": done, "watchdog_fired_at_s": fired[0] if fired else None,
            "released": bool(fired[1]) if len(fired) > 1 else None, "rel_err": rel,
            "path": "fused" if t == 32 else "sliced", "deep_ep": ctx["version"]}


def run_all(timeout: float, release_s: float, out_dir: Path | None,
            only: list[str] | None = None) -> str:
    rows = []
    for name in only or SCENARIOS:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if name.endswith("eager"):
            env["CUDA_MODULE_LOADING"] = "EAGER"
        p = subprocess.Popen([sys.executable, __file__, "one", name, "--release", str(release_s)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        t0 = time.time()
        try:
            text, _ = p.communicate(timeout=timeout)
            lines = [ln for ln in text.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"scenario": name, "error": text[-300:]}
        except subprocess.TimeoutExpired:
            p.kill()
            text, _ = p.communicate()
            row = {"scenario": name, "hung": f"killed after {timeout:.0f} s"}
        progress = [ln for ln in text.splitlines() if ln.startswith("[")]
        row["last_progress"] = progress[-1] if progress else ""
        row["wall_s"] = round(time.time() - t0, 1)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if out_dir is not None:
            (out_dir / f"hang_{name}.log").write_text(text)
    return table(rows)


def table(rows: list[dict]) -> str:
    out = ["| scenario | outcome | watchdog fired at (s) | host release got through | "
           "result rel err | last progress line |", "|---|---|---|---|---|---|"]
    for r in rows:
        if "hung" in r:
            outcome = f"HUNG ({r['hung']})"
        elif "error" in r:
            outcome = f"error: {r['error'][-120:]!r}"
        else:
            outcome = "finished" if r["finished"] else "NOT finished"
        rel = f"{r['rel_err']:.1e}" if "rel_err" in r else ""
        out.append(f"| {r['scenario']} | {outcome} | {r.get('watchdog_fired_at_s') or ''} | "
                   f"{r.get('released') if r.get('released') is not None else ''} | {rel} | "
                   f"`{r['last_progress'][:90]}` |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cmd", choices=("all", "one"))
    ap.add_argument("scenario", nargs="?")
    ap.add_argument("--timeout", type=float, default=30.0)
    ap.add_argument("--release", type=float, default=6.0)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--only", help="comma-separated scenarios (default: all)")
    a = ap.parse_args()
    if a.cmd == "one":
        print(json.dumps(one(a.scenario, a.release)), flush=True)
        os._exit(0)
    only = a.only.split(",") if a.only else None
    print(run_all(a.timeout, a.release, a.out, only), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
