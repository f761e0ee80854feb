"""`sglang-overlap bench`: SGLang's own serving benchmark against one server or several.

Each round runs `python -m sglang.benchmark.serving` (SGLang's bench_serving) once per server,
all servers on the same requests (same seed; a new seed each round), in alternating order
(forward, then backward), after `--warmup-rounds` unmeasured rounds (what lets
`--overlap-gating auto` learn before it is measured). It prints, per server, mean output
throughput, TTFT and ITL over the rounds and each one's ratio to the first server (`--url`) with a
95% confidence interval (paired rounds, `bench_stats.py`); `--json` prints all of it, rounds
included, as one JSON document.

Offline: the default dataset, random-ids, draws random token ids from the model's tokenizer
(found through the server's /model_info, or `--tokenizer DIR`) and downloads nothing; `random`
samples ShareGPT text and needs `--dataset-path` to a local ShareGPT JSON when offline.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sglang_overlap.cli.bench_stats import Ratio, mean, paired_ratio, round_orders

METRICS = (("output_throughput", "out tok/s", True), ("mean_ttft_ms", "TTFT ms", False),
           ("mean_itl_ms", "ITL ms", False))
KEEP = ("duration", "completed", "request_throughput", "input_throughput", "output_throughput",
        "total_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_itl_ms",
        "median_itl_ms", "p99_itl_ms", "mean_tpot_ms", "mean_e2e_latency_ms")


class BenchError(RuntimeError):
    """A server that cannot be reached or a benchmark run that failed; the message says which."""


def add_parser(subparsers: Any, name: str, help: str) -> None:  # noqa: A002 - dispatcher's API
    p = subparsers.add_parser(name, help=help, description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the base server, e.g. http://127.0.0.1:30000")
    p.add_argument("--compare-url", action="append", default=[], metavar="URL",
                   help="a server to compare with the base (repeat for several)")
    p.add_argument("--label", action="append", default=[], metavar="NAME",
                   help="names of the servers, in order (--url first); default: base, B, C...")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (default 3)")
    p.add_argument("--warmup-rounds", type=int, default=1,
                   help="unmeasured rounds first, on every server (default 1)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=256, help="tokens per prompt")
    p.add_argument("--output-len", type=int, default=32, help="tokens generated per request")
    p.add_argument("--range-ratio", type=float, default=0.0,
                   help="lengths drawn from [ratio x len, len] (bench_serving's "
                        "--random-range-ratio; 0: exact)")
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests/s (inf: all at once, up to --max-concurrency)")
    p.add_argument("--dataset", choices=("random-ids", "random"), default="random-ids",
                   help="random-ids: random token ids, offline; random: ShareGPT text "
                        "(needs --dataset-path offline)")
    p.add_argument("--dataset-path", default="", help="ShareGPT JSON for --dataset random")
    p.add_argument("--tokenizer", default=None,
                   help="tokenizer dir or name (default: what the server reports)")
    p.add_argument("--model", default=None, help="model name sent (default: the server's)")
    p.add_argument("--seed", type=int, default=1, help="seed of round 0 (round i: seed + i)")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per benchmark run")
    p.add_argument("--extra", default="", help="more bench_serving flags, one string")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


@dataclass
class Target:
    label: str
    url: str
    rounds: list[dict[str, float]] = field(default_factory=list)
    gate: dict[str, Any] | None = None


def check_args(args: argparse.Namespace) -> None:
    problems = []
    if args.rounds < 1:
        problems.append(f"--rounds must be >= 1 (got {args.rounds})")
    if args.warmup_rounds < 0:
        problems.append(f"--warmup-rounds must be >= 0 (got {args.warmup_rounds})")
    for flag in ("num_prompts", "input_len", "output_len", "max_concurrency"):
        if getattr(args, flag) < 1:
            problems.append(f"--{flag.replace('_', '-')} must be >= 1 (got {getattr(args, flag)})")
    if not 0.0 <= args.range_ratio <= 1.0:
        problems.append(f"--range-ratio must be in [0, 1] (got {args.range_ratio})")
    if len(args.label) > 1 + len(args.compare_url):
        problems.append(f"--label given {len(args.label)} times for "
                        f"{1 + len(args.compare_url)} servers")
    if args.dataset == "random" and args.dataset_path and not Path(args.dataset_path).is_file():
        problems.append(f"--dataset-path {args.dataset_path} does not exist")
    if problems:
        raise BenchError("sglang-overlap bench: " + "; ".join(problems))


def targets_of(args: argparse.Namespace) -> list[Target]:
    urls = [args.url, *args.compare_url]
    names = list(args.label) + ["base", *(chr(ord("B") + i) for i in range(len(urls)))][
        len(args.label):]
    return [Target(names[i], u.rstrip("/")) for i, u in enumerate(urls)]


def bench_argv(args: argparse.Namespace, url: str, seed: int, out_file: Path) -> list[str]:
    """The bench_serving command line of one run."""
    argv = [sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang",
            "--base-url", url, "--dataset-name", args.dataset,
            "--num-prompts", str(args.num_prompts), "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len),
            "--random-range-ratio", str(args.range_ratio),
            "--max-concurrency", str(args.max_concurrency),
            "--request-rate", str(args.request_rate), "--seed", str(seed),
            "--output-file", str(out_file), "--disable-tqdm", "--ready-check-timeout-sec", "0"]
    if args.dataset_path:
        argv += ["--dataset-path", args.dataset_path]
    if args.tokenizer:
        argv += ["--tokenizer", args.tokenizer]
    if args.model:
        argv += ["--model", args.model]
    return argv + shlex.split(args.extra)


def read_result(path: Path) -> dict[str, float]:
    """The metrics of the last run written to a bench_serving JSONL output file."""
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() \
        else []
    if not lines:
        raise BenchError(f"bench_serving wrote no result to {path}")
    data = json.loads(lines[-1])
    missing = [k for k, _, _ in METRICS if not isinstance(data.get(k), (int, float))]
    if missing:
        raise BenchError(f"bench_serving result {path} lacks {missing}")
    return {k: float(data[k]) for k in KEEP if isinstance(data.get(k), (int, float))}


def _get_json(url: str, timeout: float = 30.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def check_reachable(target: Target) -> None:
    try:
        _get_json(f"{target.url}/v1/models")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise BenchError(f"sglang-overlap bench: server {target.label} at {target.url} is not "
                         f"reachable ({exc})") from None


def gate_table(target: Target) -> dict[str, Any] | None:
    """The server's learned gate table (--overlap-gating auto), if it serves one."""
    try:
        info = _get_json(f"{target.url}/server_info")
    except (urllib.error.URLError, OSError, ValueError):
        return None
    for state in info.get("internal_states") or []:
        if isinstance(state, dict) and "sglang_overlap_gate" in state:
            table: dict[str, Any] = state["sglang_overlap_gate"]
            return table
    return None


def run_once(args: argparse.Namespace, target: Target, seed: int, work: Path) -> dict[str, float]:
    out = work / f"{target.label}-{seed}.jsonl"
    argv = bench_argv(args, target.url, seed, out)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"bench_serving against {target.label} ({target.url}) ran past "
                         f"--timeout {args.timeout:.0f} s") from None
    if proc.returncode != 0:
        raise BenchError(f"bench_serving against {target.label} ({target.url}) exited "
                         f"{proc.returncode}:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return read_result(out)


def _progress(total: int, disabled: bool) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with sglang; without it, no bar
        disabled = True
    if disabled:
        class _Quiet:
            def update(self, n: int = 1) -> None: ...
            def set_description(self, text: str) -> None: ...
            def close(self) -> None: ...
        return _Quiet()
    return tqdm(total=total, file=sys.stderr, unit="run", dynamic_ncols=True)


def bench(args: argparse.Namespace) -> list[Target]:
    """Run the warmup and measured rounds; the targets with their rounds' metrics."""
    check_args(args)
    targets = targets_of(args)
    for t in targets:
        check_reachable(t)
    orders = round_orders(len(targets), args.warmup_rounds + args.rounds)
    bar = _progress(len(orders) * len(targets), args.no_progress)
    with tempfile.TemporaryDirectory(prefix="sglang-overlap-bench-") as tmp:
        for r, order in enumerate(orders):
            warm = r < args.warmup_rounds
            for i in order:
                t = targets[i]
                bar.set_description(f"{'warmup' if warm else 'round'} "
                                    f"{r + 1 - (0 if warm else args.warmup_rounds)} {t.label}")
                result = run_once(args, t, args.seed + r, Path(tmp))
                if not warm:
                    t.rounds.append(result)
                bar.update(1)
    bar.close()
    for t in targets:
        t.gate = gate_table(t)
    return targets


def summary(targets: list[Target]) -> dict[str, Any]:
    base = targets[0]
    out: dict[str, Any] = {"servers": []}
    for t in targets:
        entry: dict[str, Any] = {"label": t.label, "url": t.url, "rounds": t.rounds}
        for key, _, _ in METRICS:
            series = [r[key] for r in t.rounds]
            ratio = paired_ratio(series, [r[key] for r in base.rounds])
            entry[key] = mean(series)
            entry[f"{key}_ratio"] = {"ratio": ratio.ratio, "ci95": [ratio.low, ratio.high]}
        if t.gate is not None:
            entry["gate"] = t.gate
        out["servers"].append(entry)
    return out


def format_table(targets: list[Target], args: argparse.Namespace) -> str:
    base = targets[0]
    head = (f"sglang-overlap bench: {args.rounds} rounds (+{args.warmup_rounds} warmup) x "
            f"{args.num_prompts} prompts ({args.dataset}, in {args.input_len} / out "
            f"{args.output_len}, concurrency {args.max_concurrency}); ratios vs {base.label} "
            "with 95% CI")
    cols = ["server", "out tok/s", "TTFT ms", "ITL ms", "throughput ratio", "TTFT ratio",
            "ITL ratio"]
    rows = []
    for t in targets:
        ratios: list[Ratio] = [paired_ratio([r[k] for r in t.rounds], [r[k] for r in base.rounds])
                               for k, _, _ in METRICS]
        rows.append([t.label, *(f"{mean([r[k] for r in t.rounds]):.2f}" for k, _, _ in METRICS),
                     *(x.text() for x in ratios)])
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
    lines = [head, "  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
    for t in targets:
        lines.append(f"  {t.label}: {t.url}" + (
            f"  (gate: {t.gate['steps']} steps, {t.gate['explored']} explored)" if t.gate else ""))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        targets = bench(args)
    except BenchError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(summary(targets), indent=2))
    else:
        print(format_table(targets, args))
    return 0
