"""--overlap-gating auto on real CPU servers, against the fixed modes, measured in the same run.

Servers: tiny random DeepSeek-V3 (3 layers, 8 routed + 1 shared expert, top-2), --tp 2 --dtype
float32 --moe-a2a-backend torch_a2a (EP over the two ranks), on this CPU:

    none        no overlap
    tbo         --enable-two-batch-overlap: TBO (two-chunk in prefill) on every eligible step
    auto        TBO enabled, --overlap-gating auto; on a CPU the hardware profile `auto` is a
                flat prior, so measured step times alone decide
    auto_wrong  the same with --overlap-hardware-profile set to a profile whose cost model
                predicts TBO wins (+25-43% decode, +4% prefill at these shapes): a wrong prior
                that measurement must override

The four servers start side by side (their start-ups overlap; nothing is measured yet). Phase 1
benchmarks none, tbo and auto with `sglang-overlap bench` (SGLang's bench_serving, random-ids
prompts, alternating rounds after a warm-up round) while auto_wrong sleeps idle (--sleep-on-idle;
the table prints the CPU time it used meanwhile); phase 2 none against auto_wrong (tbo is stopped
first). Then every server answers the same
greedy prompts (tokens must equal none's), and the auto servers' logs give each TP rank's
decision sequence (must be identical). Prints one table: throughput / TTFT / ITL per server, each
one's ratio to the best fixed mode with its 95% CI, and the steps each gate ran per mode. The e2e
test (tests/e2e/test_gating.py) runs it without the fixed modes (`run(fixed=False)`).

    SGLANG_CPU_KIT=/tmp/sglang-cpu-kit16 .venv/bin/python benchmarks/bench_gating.py [--json F]

Every server start takes the e2e lock file if --lock is given (default /tmp/e2e.lock).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sglang_overlap.cli import bench as bench_cli  # noqa: E402
from sglang_overlap.cli.bench_stats import paired_ratio  # noqa: E402

A2A = ["--tp", "2", "--dtype", "float32", "--moe-a2a-backend", "torch_a2a"]
TBO = [*A2A, "--enable-two-batch-overlap"]
AUTO = [*TBO, "--overlap-gating", "auto"]
WRONG_PRIOR = {
    "base": "H20", "fp8_tflops": 0.03, "bf16_tflops": 0.03, "hbm_gbps": 1.0,
    "nvlink_gbps": 0.001, "kernel_us": 1.0, "gemm_fixed_us": 1.0, "a2a_latency_us": 1.0,
    "a2a_kernel_us": 1.0,
    "source": "test profile: compute and communication balanced so that the cost model predicts "
              "TBO +25-43% in decode and +4% in prefill for the tiny model on EP2; on a real CPU "
              "TBO is slower (a wrong prior)",
}
LONG = " ".join(f"The quick brown fox {i} jumps over the lazy dog {i * 7 % 10}." for i in range(40))
GREEDY = [[LONG], ["Hello world! What is the capital of France?", "User: hi there.",
                   "1 + 2 = 3, 4 + 5 =", "Paris is the capital of",
                   "the and of to in is that for it", "Assistant: hello, how"]]
NEW_TOKENS = 12
CAPTURE_LINE = re.compile(r"cpu_shim graphs: captured (\d+) shapes \(.*\) in ([0-9.]+) s")
GATE_LINE = re.compile(r"(TP\d) EP\d\] sglang-overlap gate: ((?:decode|prefill) -> .*)$",
                       re.MULTILINE)


GRAPH_BS = ["--cuda-graph-bs-decode", "1", "2", "4", "8", "16"]  # up to the bench's concurrency
GRAPH_ENV = {"SGLANG_CPU_SHIM_GRAPHS": "1"}  # decode through SGLang's DecodeCudaGraphRunner


def configs(wrong_prior: Path, graphs: bool = False) -> dict[str, list[str]]:
    """Every server's flags; with `graphs`, decode replays captured graphs (the kit's stand-in
    backend) in every server, fixed modes included."""
    extra = GRAPH_BS if graphs else []
    return {"none": [*A2A, *extra], "tbo": [*TBO, *extra], "auto": [*AUTO, *extra],
            "auto_wrong": [*AUTO, "--overlap-hardware-profile", str(wrong_prior), *extra]}


def bench_args(**overrides: Any) -> argparse.Namespace:
    """`sglang-overlap bench`'s arguments (its own defaults, then `overrides`)."""
    from sglang_overlap.cli.main import build_parser

    args = build_parser(["bench"]).parse_args(["bench", "--url", "unset", "--no-progress"])
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


@dataclass
class Run:
    """What one benchmark run measured."""

    phases: list[list[bench_cli.Target]] = field(default_factory=list)
    tokens: dict[str, list[list[int]]] = field(default_factory=dict)
    logs: dict[str, str] = field(default_factory=dict)
    idle_cpu_s: float = 0.0
    """CPU seconds the idle auto_wrong server used while phase 1 was measured..."""
    phase1_s: float = 0.0
    """... and phase 1's wall time."""

    def target(self, label: str) -> bench_cli.Target:
        return next(t for phase in self.phases for t in phase if t.label == label)


def decision_sequences(log: str) -> dict[str, list[str]]:
    """Each TP rank's logged gate decisions, in order."""
    per_rank: dict[str, list[str]] = {}
    for rank, line in GATE_LINE.findall(log):
        per_rank.setdefault(rank, []).append(line.strip())
    return per_rank


def _greedy(server: Any) -> list[list[int]]:
    return [ids for texts in GREEDY for ids in server.generate(texts, NEW_TOKENS)]


def run(model: Path, env: dict[str, str], work: Path, server_cls: Callable[..., Any],
        args: argparse.Namespace, port: int = 30460,
        lock: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
        graphs: bool = False, fixed: bool = True) -> Run:
    """Both phases; `server_cls` is tests/e2e/servers.py's Server (name, model, port, flags,
    env, log_dir); `graphs`: decode through captured graphs (`configs`). `fixed=False` (the
    e2e test, which asserts no ratio: CI time): the fixed modes are not measured, tbo is not
    started and none only answers the greedy prompts; phase 1 measures auto alone, phase 2
    auto_wrong alone (the table then has no ratios)."""
    wrong = work / "profile-tbo-wins.json"
    wrong.write_text(json.dumps(WRONG_PRIOR))
    flags = configs(wrong, graphs)
    if not fixed:
        del flags["tbo"]
    env = {**env, **(GRAPH_ENV if graphs else {}), "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [env.get("PYTHONPATH", os.environ.get("PYTHONPATH"))])])}
    out = Run()
    servers: dict[str, Any] = {}
    with lock() if lock else contextlib.nullcontext(), contextlib.ExitStack() as stack:
        # all four load side by side before anything is measured (a start-up is mostly sleep
        # and file reads); --sleep-on-idle keeps auto_wrong idle through phase 1
        for i, name in enumerate(flags):
            servers[name] = server_cls(name, model, port + i, flags[name], env, work)
            stack.callback(servers[name].__exit__, None, None, None)
            servers[name].start()
        for server in servers.values():
            server.wait_ready()

        def measure(names: list[str]) -> list[bench_cli.Target]:
            a = argparse.Namespace(**vars(args))
            a.url, a.compare_url, a.label = servers[names[0]].url, [
                servers[n].url for n in names[1:]], names
            return bench_cli.bench(a)

        # none and auto side by side in every round (forward, then backward: none auto tbo,
        # tbo auto none): the ratio that decides the target pairs runs close in time
        idle, start = servers["auto_wrong"].cpu_seconds(), time.monotonic()
        out.phases.append(measure(["none", "auto", "tbo"] if fixed else ["auto"]))
        out.idle_cpu_s = servers["auto_wrong"].cpu_seconds() - idle
        out.phase1_s = time.monotonic() - start
        for name in ("none", "tbo", "auto") if fixed else ("none", "auto"):
            out.tokens[name] = _greedy(servers[name])
        if fixed:
            servers["tbo"].__exit__(None, None, None)
            out.logs["tbo"] = servers.pop("tbo").log_text()
        out.phases.append(measure(["none", "auto_wrong"] if fixed else ["auto_wrong"]))
        out.tokens["auto_wrong"] = _greedy(servers["auto_wrong"])
        for server in servers.values():  # the three stop side by side (each sleeps 5 s)
            server.stop_in_background()
        for name, server in servers.items():
            server.__exit__(None, None, None)
            out.logs[name] = server.log_text()
    return out


def report(r: Run) -> tuple[str, dict[str, Any]]:
    """The table, and the same numbers as a dict. With the fixed modes measured (`run(fixed=
    True)`), each server's ratio to the best fixed mode (phase 2: to its own none rounds);
    without them, throughput, TTFT and ITL alone."""
    labels = {t.label for t in r.phases[0]}
    fixed = {"none", "tbo"} <= labels
    tput = {t.label: [x["output_throughput"] for x in t.rounds] for t in r.phases[0]}
    best_fixed = max(("none", "tbo"), key=lambda k: sum(tput[k])) if fixed else None
    rows: list[tuple[str, dict[str, Any], str]] = []
    data: dict[str, Any] = {"best_fixed": best_fixed, "servers": {}}
    for phase in r.phases:
        ref = next((t for t in phase if t.label == (best_fixed if phase is r.phases[0]
                                                    else "none")), None)
        for t in phase:
            if t is not ref and t.label == "none":
                continue
            entry: dict[str, Any] = {"vs": ref.label if ref else "-"}
            for key in ("output_throughput", "mean_ttft_ms", "mean_itl_ms"):
                series = [x[key] for x in t.rounds]
                entry[key] = sum(series) / len(series)
                if ref:
                    ratio = paired_ratio(series, [x[key] for x in ref.rounds])
                    entry[f"{key}_ratio"] = [ratio.ratio, ratio.low, ratio.high]
            entry["rounds"] = {key: [x[key] for x in t.rounds] for key in (
                "output_throughput", "mean_ttft_ms", "mean_itl_ms")}
            entry["gate"] = (t.gate or {}).get("chosen")
            entry["counters"] = (t.gate or {}).get("counters")
            label = t.label if phase is r.phases[0] or t.label != "none" else "none (phase 2)"
            data["servers"][label] = entry
            rows.append((label, entry, paired_ratio(
                [x["output_throughput"] for x in t.rounds],
                [x["output_throughput"] for x in ref.rounds]).text() if ref else "-"))
    lines = [f"{'server':<14} {'out tok/s':>9} {'TTFT ms':>8} {'ITL ms':>7}  "
             f"{'throughput vs':<14} {'ratio [95% CI]':<24} steps per mode (gate)"]
    for label, e, text in rows:
        lines.append(f"{label:<14} {e['output_throughput']:9.2f} {e['mean_ttft_ms']:8.1f} "
                     f"{e['mean_itl_ms']:7.1f}  {e['vs']:<14} {text:<24} {e['gate'] or '-'}")
    if fixed:
        tbo_vs_none = paired_ratio(tput["tbo"], tput["none"])
        lines.append(f"fixed TBO vs none: {tbo_vs_none.text()}; best fixed mode: {best_fixed}")
        data["tbo_vs_none"] = [tbo_vs_none.ratio, tbo_vs_none.low, tbo_vs_none.high]
    else:
        lines.append("fixed modes not measured (no ratios): benchmarks/bench_gating.py has them")
    lines.append(f"idle auto_wrong during phase 1: {r.idle_cpu_s:.1f} CPU-s in "
                 f"{r.phase1_s:.0f} s")
    data["idle_cpu_s"], data["phase1_s"] = r.idle_cpu_s, r.phase1_s
    for name in ("auto", "auto_wrong"):
        seqs = decision_sequences(r.logs.get(name, ""))
        same = len(seqs) == 2 and len(set(map(tuple, seqs.values()))) == 1
        lines.append(f"{name}: {len(next(iter(seqs.values()), []))} logged decision changes per "
                     f"rank, identical on both TP ranks: {same}; greedy tokens equal none's: "
                     f"{r.tokens.get(name) == r.tokens['none']}")
        data["servers"][name]["ranks_identical"] = same
        data["servers"][name]["tokens_equal_none"] = r.tokens.get(name) == r.tokens["none"]
    for label, e, _ in rows:
        if e.get("counters"):
            lines.append(f"{label}: {runs_line(e['counters'])}")
    for name in ("none", "tbo", "auto", "auto_wrong"):
        captures = [(int(n), float(s)) for n, s in CAPTURE_LINE.findall(r.logs.get(name, ""))]
        if captures:  # one line per TP rank: graphs captured, and the capture loop's time
            data["servers"].setdefault(name, {})["captures"] = captures
            lines.append(f"{name} decode graph capture per rank: " + ", ".join(
                f"{n} graphs in {s:.1f} s" for n, s in captures))
    return "\n".join(lines), data


def runs_line(counters: dict[str, list[list[Any]]]) -> str:
    """Decode steps per mode, replayed or eager, and the eager fallbacks, from the counters a
    selector serves (`internal_state.served_table`)."""
    decode = {(m, r): n for p, m, r, n in counters.get("steps", []) if p == "decode"}
    parts = [f"{m} {decode.get((m, 'graph'), 0)} replayed / {decode.get((m, 'eager'), 0)} eager"
             for m in sorted({m for m, _ in decode})]
    falls = ", ".join(f"{m} {why} x{n}" for m, why, n in counters.get("eager_fallbacks", []))
    return f"decode steps: {'; '.join(parts) or '-'}; eager fallbacks: {falls or 'none'}"


@contextlib.contextmanager
def file_lock(path: str) -> Iterator[None]:
    import fcntl

    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _kit_env() -> dict[str, str]:
    """The server environment of the project's CPU kit (tests/kit, built on first use)."""
    sys.path.insert(0, str(REPO))
    from tests.kit.build import KitMissing, build_kit

    try:
        kit = build_kit()
    except KitMissing as exc:
        raise SystemExit(f"CPU kit: {exc}") from None
    return kit.env(os.environ) | {"SGLANG_CPU_OMP_THREADS_BIND": "0|1", "PYTHONUNBUFFERED": "1"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="tiny model dir (default: make one)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--warmup-rounds", type=int, default=1)
    p.add_argument("--num-prompts", type=int, default=48)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=32)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--port", type=int, default=30460)
    p.add_argument("--lock", default="/tmp/e2e.lock", help="lock file held while servers run")
    p.add_argument("--json", type=Path, help="write the numbers here too")
    p.add_argument("--graphs", action="store_true",
                   help="decode through SGLang's DecodeCudaGraphRunner (the kit's stand-in graph "
                        "backend) in every server")
    a = p.parse_args()
    from tests.e2e.servers import Server  # the e2e tests' server wrapper

    env = _kit_env()
    with tempfile.TemporaryDirectory(prefix="bench-gating-") as tmp:
        work = Path(tmp)
        model = a.model
        if model is None:
            from tests.kit.build import build_tiny_dsv3

            model = build_tiny_dsv3()
        args = bench_args(rounds=a.rounds, warmup_rounds=a.warmup_rounds,
                          num_prompts=a.num_prompts, input_len=a.input_len,
                          output_len=a.output_len, max_concurrency=a.max_concurrency,
                          tokenizer=str(model))
        r = run(model, env, work, Server, args, a.port, lambda: file_lock(a.lock), a.graphs)
        text, data = report(r)
    print(text)
    if a.json:
        a.json.write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
