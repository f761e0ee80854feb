"""Real `sglang serve` processes on one GPU, with and without sglang-overlap, one after another:
greedy tokens of a fixed prompt set, SGLang's own bench_serving, /metrics, /server_info, graph
capture time and memory from SGLang's log, graph replays per overlap mode (the benchmark-only
`sglang_serve_probe` plugin) against the mode selector's decisions.

    python3 benchmarks/serve/serve_suite.py --model DIR --out OUT --servers base,plugin,tbo,...
        [--deadline EPOCH_S] [--concurrency 1,16,64]

Run by `benchmarks/run_gpu.sh serve` (benchmarks/serve/run_serve.sh) on the stack
`benchmarks/serve/stage.sh` staged, which sets the environment each server inherits (PYTHONPATH:
the users' stack; SERVE_SITE_PLUGIN: sglang-overlap installed from this tree with its entry
point, so SGLang loads it as users get it; SERVE_SITE_PLANTED: the same with the planted replay
bug; SERVE_SITE_PROBE: the graph probe, on every server; SERVE_TREES: DeepEP trees by name, ""
for the stack's sgl-deep-ep). A server whose record exists without an error is not run again.
Each server's record goes to OUT/serve_<name>.json as soon as it is done; report.py turns the
records into the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AUTO = ["--overlap-gating", "auto"]
TBO, SBO = ["--enable-two-batch-overlap"], ["--enable-single-batch-overlap"]


@dataclass(frozen=True)
class ServerSpec:
    flags: list[str] = field(default_factory=list)
    site: str | None = "SERVE_SITE_PLUGIN"  # env var naming the plugin install; None: no plugin
    tree: str = "sgl-deep-ep"  # DeepEP: sgl-deep-ep (per-expert combine), antgroup-opt (per block)
    modes: tuple[str, ...] = ()  # graph sets the plugin captures (--overlap-gating auto)
    env: dict[str, str] = field(default_factory=dict)
    planted: bool = False  # the planted replay bug: its decisions-vs-replays check must FAIL
    refused: str = ""  # the server must refuse to start, its log holding this text


ANT_ENV = {"DEEPEP_DISABLE_LL_DISPATCH_OPT": "1"}  # its layered LL dispatch needs 8k ranks
TWO_CHUNK = [*TBO, "--tbo-token-distribution-threshold", "0.48"]
AUTO_SBO = [*SBO, *AUTO]  # one rank: auto over SBO and none (TBO needs 2+ expert ranks)
ONE_RANK_TBO = "needs the experts on 2 or more ranks (--tp 2 or more, got --tp 1)"
SERVERS: dict[str, ServerSpec] = {
    "base": ServerSpec(site=None),
    "plugin": ServerSpec(),
    # the same two again, after them: their c=1 ITL against the first pair's says how much of
    # the plugin's 1.39x / 1.56x at c=1 (two H100 runs, 2026-12-07) is the plugin and how much
    # one server's start-to-start spread (SBO per expert measured 1.225x, then 1.003x)
    "base_again": ServerSpec(site=None),
    "plugin_again": ServerSpec(),
    "sbo_expert": ServerSpec(SBO),
    "sbo_block": ServerSpec(SBO, tree="antgroup-opt", env=ANT_ENV),
    "auto": ServerSpec(AUTO_SBO, modes=("sbo", "none")),
    "auto_planted": ServerSpec(AUTO_SBO, site="SERVE_SITE_PLANTED", modes=("sbo", "none"),
                               planted=True),
    "base_ant": ServerSpec(site=None, tree="antgroup-opt", env=ANT_ENV),
    "auto_block": ServerSpec(AUTO_SBO, tree="antgroup-opt", env=ANT_ENV, modes=("sbo", "none")),
    # TBO and two-chunk at one expert rank: refused at start (SGLang's two-batch operations skip
    # the dispatch at EP 1); they serve from --tp 2, on a machine of 2+ GPUs
    "tbo_one_rank": ServerSpec(TBO, refused=ONE_RANK_TBO),
    "tbo": ServerSpec(TBO),
    "two_chunk": ServerSpec(TWO_CHUNK),
}
WORDS = ("The quick brown fox jumps over the lazy dog. What is the capital of France? Paris is "
         "the capital of France. User: hi there. Assistant: hello, how can I help you today? "
         "0 1 2 3 4 5 6 7 8 9 + - * / = ( ) [ ] the and of to in is that for it").split()
# Token checks, each deterministic in what the scheduler does with it (SGLang's numerics depend on
# where chunked prefill cuts a prompt, and that depends on what else is queued: on an H100 the
# SBO server's batch of the long prompts was cut elsewhere than the baseline's and two prompts
# differed from their first token, before any decode step, 2026-12-07):
# - BATCH: 8 short prompts, 8 x (28 characters + BOS) < TOKENS, so one prefill chunk holds
#   them all however they arrive, then decode at batch sizes up to 8;
# - PROMPTS: 40 to 670 characters (9 to 102 tokens; over a chunk together), one request at a
#   time, so each is prefilled alone.
PROMPTS = [" ".join(WORDS[(7 * i) % len(WORDS):] + WORDS)[: 40 + 90 * i] for i in range(8)]
BATCH = [" ".join(WORDS[(5 * i) % len(WORDS):] + WORDS)[:28] for i in range(8)]
NEW_TOKENS = 24
SGLANG_CLI = ("import sys; from sglang.cli.main import main; sys.argv[0] = 'sglang'; "
              "sys.exit(main())")
# SGLang 0.5.23's line after each capture (model_runner_components/cuda_graph_setup.py), e.g.
# "Capture decode cuda graph end. bs=[1, 2], elapsed=3.21 s, mem usage=0.52 GB, avail mem=9.8 GB."
CAPTURE_END = re.compile(r"Capture (.+?) end\. (?:bs=\[[^\]]*\], )?elapsed=([\d.]+) s, "
                         r"mem usage=(-?[\d.]+) GB, avail mem=([\d.]+) GB")


# One rank: DeepEP's normal (intranode) kernels are built for 2, 4 or 8 ranks, so prefill goes
# through the low-latency kernels too, whose buffer takes at most TOKENS tokens per rank: the
# prefill chunk is that size (SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK, set in `run_server`).
TOKENS = 256


def graph_sizes(max_bs: int) -> list[str]:
    """Decode batch sizes captured: powers of two up to `max_bs`, and `max_bs` itself."""
    sizes = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256) if b < max_bs] + [max_bs]
    return [str(b) for b in sizes]


def common_flags(model: str, port: int, max_bs: int) -> list[str]:
    return ["--model-path", model, "--host", "127.0.0.1", "--port", str(port), "--tp", "1",
            "--moe-a2a-backend", "deepep", "--deepep-mode", "low_latency",
            "--attention-backend", "triton", "--cuda-graph-max-bs-decode", str(max_bs),
            # 7 decode graphs (SGLang's default list up to 64 has 12): capture time per server
            # set is what a one-call serve run can afford; bs 64 is still captured
            "--cuda-graph-bs-decode", *graph_sizes(max_bs),
            "--disable-prefill-cuda-graph", "--max-running-requests", str(max_bs),
            "--chunked-prefill-size", str(TOKENS), "--max-prefill-tokens", str(TOKENS),
            # 0.8 left 15 GB for the decode graphs and DeepEP's 256-token one-rank buffers on an
            # H100, and capture ran out of memory at bs 64 (2026-12-06): the KV pool gets less
            "--mem-fraction-static", os.environ.get("SERVE_MEM_FRACTION", "0.6"),
            "--disable-radix-cache", "--enable-metrics", "--trust-remote-code",
            "--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 8}']


def http(url: str, body: Any = None, timeout: float = 120) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float) -> float:
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            http(f"{url}/health_generate", timeout=30)
            return time.time() - t0
        except Exception:
            time.sleep(2)
    raise TimeoutError(f"not ready after {timeout:.0f} s")


def generate(url: str, texts: list[str]) -> list[dict[str, Any]]:
    """Greedy continuation of each text (one batched request): ids and, per position, the top-2
    (logprob, id) pairs."""
    out = http(f"{url}/generate", {
        "text": texts, "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS,
                                           "ignore_eos": True},
        "return_logprob": True, "top_logprobs_num": 2}, timeout=600)
    rows = []
    for o in out:
        meta = o["meta_info"]
        rows.append({"ids": [t[1] for t in meta["output_token_logprobs"]],
                     "top2": [[[lp, i] for lp, i, *_ in pos]
                              for pos in meta["output_top_logprobs"]]})
    return rows


def bench(port: int, model: str, levels: list[int], out: Path,
          pid: int | None = None) -> dict[str, Any]:
    """SGLang's bench_serving at each concurrency, one process for all (bench_many.py): random
    token ids (input 128-256, output 64), 8 x concurrency prompts (at least 16). Returns
    {str(concurrency): record}, each with "cpu_s" where `pid` (the server's process) was given:
    the CPU seconds its processes spent in that run, by title. Raises RuntimeError naming the
    concurrency's log where bench_serving wrote no record."""
    cmd = [sys.executable, str(Path(__file__).with_name("bench_many.py")),
           "--concurrency", ",".join(map(str, levels)), "--out", str(out),
           *(["--watch-pid", str(pid)] if pid else []), "--",
           "--backend", "sglang", "--host", "127.0.0.1", "--port", str(port), "--model", model,
           "--tokenizer", model, "--dataset-name", "random-ids", "--random-input-len", "256",
           "--random-output-len", "64", "--random-range-ratio", "0.5", "--disable-tqdm",
           "--seed", "1"]
    for c in levels:  # bench_serving appends: an earlier call's record must not stand in
        Path(f"{out}_c{c}.jsonl").unlink(missing_ok=True)
        Path(f"{out}_c{c}.cpu.json").unlink(missing_ok=True)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
                   timeout=120 + 120 * len(levels), check=False)
    keep = ("median_itl_ms", "mean_itl_ms", "p99_itl_ms", "median_ttft_ms", "median_tpot_ms",
            "output_throughput", "request_throughput", "completed", "duration",
            "total_output_tokens")
    recs: dict[str, Any] = {}
    for c in levels:
        res = Path(f"{out}_c{c}.jsonl")
        lines = res.read_text().strip().splitlines() if res.exists() else []
        if not lines:
            raise RuntimeError(f"bench_serving at concurrency {c} wrote no record: {out}_c{c}.log")
        rec = json.loads(lines[-1])
        recs[str(c)] = {k: rec.get(k) for k in keep}
        cpu = Path(f"{out}_c{c}.cpu.json")
        if pid and cpu.is_file():
            recs[str(c)]["cpu_s"] = json.loads(cpu.read_text())
    return recs


def probe_counts(probe_dir: Path) -> dict[str, Any]:
    """The probe's files of every process summed: {"captures": {label: n}, "replays": {label:
    n}, "steps": {kind: {"n", "host_s", "gpu_n", "gpu_ms"}}} (sglang_serve_probe's format)."""
    total: dict[str, Any] = {"captures": {}, "replays": {}, "steps": {}}
    for p in probe_dir.glob("graphs-*.json"):
        snap = json.loads(p.read_text())
        for k in ("captures", "replays"):
            for label, n in snap.get(k, {}).items():
                total[k][label] = total[k].get(label, 0) + n
        for kind, row in snap.get("steps", {}).items():
            into = total["steps"].setdefault(kind, {})
            for field_, v in row.items():
                into[field_] = into.get(field_, 0) + v
    return total


def plugin_table(url: str) -> dict[str, Any] | None:
    info = http(f"{url}/server_info")
    for s in info.get("internal_states") or []:
        if isinstance(s, dict) and "sglang_overlap_gate" in s:
            return s["sglang_overlap_gate"]
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left of the group (at once if the
    server exited, else after 30 s): a scheduler child that outlived its server would busy-poll a
    core and hold GPU memory through the next server's measurements."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=30.0)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def query_gpu(field: str) -> list[str] | None:
    """nvidia-smi's value of `field` (`--query-gpu`), one stripped line per GPU; None where
    nvidia-smi is missing or refuses the field (an older driver)."""
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,"
                              "nounits"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [line.strip() for line in out.stdout.strip().splitlines()]


def gpu_used_mib() -> int | None:
    """GPU memory in use now, all GPUs (nvidia-smi), None where it cannot say."""
    lines = query_gpu("memory.used")
    try:
        return None if lines is None else sum(int(x) for x in lines)
    except ValueError:
        return None


GPU_STATE = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw",
             "clocks_event_reasons.active")


def gpu_state() -> dict[str, str] | None:
    """The SM and memory clocks (MHz), temperature (C), power (W) and active clock-event
    (throttle) reasons now, by nvidia-smi (first GPU), one query per field so that a field this
    driver does not know leaves the others; None where none answers. Taken around each server's
    bench_serving: a server measured on a hotter or slower-clocked card than its baseline shows
    it here."""
    state = {name: lines[0] for name in GPU_STATE if (lines := query_gpu(name))}
    return state or None


class _Done(Exception):
    """A refused server's record is complete."""


def expect_refusal(rec: dict[str, Any], needle: str, url: str, proc: subprocess.Popen[bytes],
                   log_path: Path, timeout: float) -> None:
    """The server must exit before it is ready with `needle` in its log: rec["refused"] says
    whether it did, rec["error"] what went wrong otherwise."""
    try:
        wait_ready(url, proc, timeout)
        rec["error"] = "started, but the plugin should have refused these flags"
        return
    except RuntimeError:  # exited
        pass
    rec["refused"] = needle in log_path.read_text(errors="replace")
    if not rec["refused"]:
        rec["error"] = f"exited without saying: {needle}"


def run_server(name: str, spec: ServerSpec, args: argparse.Namespace, port: int) -> dict[str, Any]:
    out: Path = args.out
    probe_dir = out / f"probe_{name}"
    probe_dir.mkdir(parents=True, exist_ok=True)
    sites = [os.environ[spec.site]] if spec.site else []
    tree = json.loads(os.environ["SERVE_TREES"])[spec.tree]  # "" = the stack's own deep_ep
    path = [*sites, os.environ["SERVE_SITE_PROBE"], *([tree] if tree else []),
            os.environ.get("PYTHONPATH", "")]
    env = {**os.environ, **spec.env, "SGLANG_SERVE_PROBE_DIR": str(probe_dir),
           "SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK": str(TOKENS),
           "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    url = f"http://127.0.0.1:{port}"
    flags = [*common_flags(args.model, port, args.max_bs), *spec.flags]
    rec: dict[str, Any] = {"name": name, "flags": spec.flags, "plugin": spec.site is not None,
                           "tree": spec.tree, "modes": list(spec.modes),
                           "planted": spec.planted, "refused_needle": spec.refused,
                           "gpu_used_mib_before": gpu_used_mib()}
    log_path = out / f"server_{name}.log"
    t0 = time.time()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-c", SGLANG_CLI, "serve", *flags],
                                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=out,
                                start_new_session=True)  # cwd: no plugin source on sys.path
    try:
        if spec.refused:  # must exit before it is ready, saying why
            expect_refusal(rec, spec.refused, url, proc, log_path, args.start_timeout)
            raise _Done
        rec["ready_s"] = wait_ready(url, proc, args.start_timeout)
        rec["tokens_batch"] = generate(url, BATCH)
        rec["tokens_single"] = [row for p in PROMPTS for row in generate(url, [p])]
        rec["gpu_before_bench"] = gpu_state()
        rec["bench"] = bench(port, args.model, args.concurrency, out / f"bench_{name}", proc.pid)
        rec["gpu_after_bench"] = gpu_state()
        time.sleep(1)
        rec["metrics"] = [line for line in str(http(f"{url}/metrics")).splitlines()
                          if line.startswith(("sglang_overlap", "sglang:num_requests_total",
                                              "sglang:generation_tokens_total"))]
        rec["gate"] = plugin_table(url) if spec.site else None
        rec["graphs"] = probe_counts(probe_dir)
    except _Done:
        pass
    except BaseException as exc:  # the record says what failed; the next server still runs
        rec["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        stop(proc)
        subprocess.run(["pkill", "-9", "-f", f"port {port}"], check=False)  # its children
    text = log_path.read_text(errors="replace")
    rec["capture"] = [{"what": w, "time_s": float(a), "mem_gb": float(b), "avail_gb": float(c)}
                      for w, a, b, c in CAPTURE_END.findall(text)]
    rec["plugin_log"] = [ln for ln in text.splitlines() if "sglang-overlap" in ln][:60]
    rec["log_tail"] = text.splitlines()[-25:] if "error" in rec else []
    rec["wall_s"] = time.time() - t0
    (out / f"serve_{name}.json").write_text(json.dumps(rec, indent=1))
    return rec


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--servers", default="base,plugin,base_again,plugin_again,sbo_expert,auto,"
                    "auto_planted,sbo_block,tbo_one_rank")
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--max-bs", type=int, default=64)
    ap.add_argument("--start-timeout", type=float, default=420)
    ap.add_argument("--deadline", type=float, default=0, help="epoch seconds: start no server "
                    "with less than --min-left seconds before it")
    ap.add_argument("--min-left", type=float, default=90)
    args = ap.parse_args(argv)
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.out.mkdir(parents=True, exist_ok=True)
    rc = 0
    for i, name in enumerate(n for n in args.servers.split(",") if n):
        done = args.out / f"serve_{name}.json"
        if done.is_file() and "error" not in json.loads(done.read_text()):
            print(f"[serve] {name}: done by an earlier call", flush=True)
            continue
        if args.deadline and time.time() > args.deadline - args.min_left:
            print(f"[serve] {name}: skipped (deadline)", flush=True)
            continue
        rec = run_server(name, SERVERS[name], args, 31000 + i)
        if rec.get("error", "").startswith("KeyboardInterrupt"):
            print(f"[serve] {name}: interrupted ({rec['wall_s']:.0f} s)", flush=True)
            return 1
        status = rec.get("error") or ("refused as it must be" if rec.get("refused")
                                      else f"ok, ready in {rec['ready_s']:.0f} s")
        print(f"[serve] {name}: {status} ({rec['wall_s']:.0f} s)", flush=True)
        rc |= "error" in rec
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
