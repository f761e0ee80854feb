"""`sglang-overlap gsm8k`: few-shot GSM8K accuracy against a running server, or two of them.

    sglang-overlap gsm8k --url http://127.0.0.1:30000 --num-questions 1000
    sglang-overlap gsm8k --url http://ON:30000 --compare-url http://OFF:30000 --json

Compare mode sends the same questions to both servers (one after the other, so latencies are
not shared) and reports both accuracies, their difference with a paired 95% interval and how
often the extracted answers agree (100% expected for greedy decoding when overlap is exact).
Exit codes: 0 done, 1 some requests failed, 2 bad input or unreachable server.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from sglang_overlap.evals import gsm8k as ev


def add_parser(subparsers: Any, name: str, help: str) -> None:
    p = subparsers.add_parser(name, help=help, description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", default="http://127.0.0.1:30000",
                   help="server or router to evaluate (default: %(default)s)")
    p.add_argument("--compare-url", default=None,
                   help="a second server (overlap off) to run the same questions against")
    p.add_argument("--num-questions", type=int, default=200, help="default: %(default)s")
    p.add_argument("--num-shots", type=int, default=5, help="default: %(default)s")
    p.add_argument("--parallel", type=int, default=64,
                   help="requests in flight per server (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="default: %(default)s")
    p.add_argument("--data-path", default=None,
                   help="local GSM8K test.jsonl (default: download the public test set once "
                   f"into {ev.default_cache_dir() / 'gsm8k'})")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds per request (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    p.add_argument("--dump", default=None, metavar="PATH",
                   help="write one JSON line per question and server (output, answer, label)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


class _Progress:
    """tqdm when installed, else a one-line counter on stderr."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled, self.n = total, label, enabled, 0
        self._bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm  # type: ignore[import-untyped]

                self._bar = tqdm(total=total, desc=label, file=sys.stderr, unit="q")
            except ImportError:
                self._bar = None

    def __call__(self) -> None:
        self.n += 1
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
        else:
            end = "\n" if self.n == self.total else ""
            print(f"\r{self.label}: {self.n}/{self.total}", end=end, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _evaluate(url: str, examples: list[ev.Example], prompts: list[str],
              args: argparse.Namespace) -> ev.EvalResult:
    progress = _Progress(len(prompts), url, enabled=not args.no_progress)
    try:
        completions, wall = ev.run_requests(
            url, prompts, parallel=args.parallel, max_new_tokens=args.max_new_tokens,
            timeout=args.timeout, on_done=progress,
        )
    finally:
        progress.close()
    return ev.score(url, examples, completions, wall)


def _format_result(r: ev.EvalResult) -> list[str]:
    return [
        f"{r.url}: {r.num_questions} questions",
        f"  Accuracy: {r.accuracy:.3f}",
        f"  Invalid: {r.invalid_rate:.3f}",
        f"  Latency: {r.latency_s:.3f} s",
        f"  Output throughput: {r.output_throughput:.3f} token/s",
        *(f"  Failed requests: {len(r.errors)} (first: {r.errors[0]})" for _ in r.errors[:1]),
    ]


def _format_comparison(c: ev.Comparison) -> list[str]:
    d, lo, hi = c.difference
    lines = [*_format_result(c.a), *_format_result(c.b)]
    lines.append(f"Accuracy difference (url - compare-url): {d:+.3f}  "
                 f"95% CI [{lo:+.3f}, {hi:+.3f}]")
    lines.append(f"Answer agreement: {c.answer_agreement:.3f}  "
                 f"(identical texts: {c.text_agreement:.3f})")
    if c.disagreements():
        lines.append(f"Questions with different answers: {c.disagreements()[:20]}")
    return lines


def _canonical() -> Path:
    cache = ev.default_cache_dir()
    if not (cache / "gsm8k" / "test.jsonl").is_file():
        print(f"downloading the GSM8K test set from {ev.CANONICAL_URL} into {cache / 'gsm8k'}",
              file=sys.stderr, flush=True)
    return ev.fetch_canonical(cache)


def _load(args: argparse.Namespace) -> tuple[list[ev.Example], list[str]]:
    path = Path(args.data_path) if args.data_path else _canonical()
    examples = ev.load_examples(path)
    if args.num_questions > len(examples):
        raise ev.EvalError(
            f"--num-questions {args.num_questions} exceeds the {len(examples)} questions in {path}"
        )
    for flag, value in (("--parallel", args.parallel), ("--max-new-tokens", args.max_new_tokens)):
        if value < 1:
            raise ev.EvalError(f"{flag} must be >= 1 (got {value})")
    return examples, ev.build_prompts(examples, args.num_questions, args.num_shots)


def run(args: argparse.Namespace) -> int:
    try:
        examples, prompts = _load(args)
        urls = [args.url] + ([args.compare_url] if args.compare_url else [])
        for url in urls:
            ev.check_reachable(url)
        results = [_evaluate(url, examples, prompts, args) for url in urls]
    except ev.EvalError as exc:
        print(f"sglang-overlap gsm8k: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nsglang-overlap gsm8k: interrupted", file=sys.stderr, flush=True)
        os._exit(130)  # in-flight HTTP requests would otherwise hold the exit for their timeout
    if args.dump:
        with open(args.dump, "w", encoding="utf-8") as f:
            for r in results:
                f.writelines(json.dumps(rec) + "\n" for rec in r.records())
    report: dict[str, Any]
    if len(results) == 2:
        comparison = ev.Comparison(results[0], results[1])
        report, lines = comparison.to_dict(), _format_comparison(comparison)
    else:
        report, lines = results[0].to_dict(), _format_result(results[0])
    print(json.dumps(report, indent=2) if args.json else "\n".join(lines))
    return 1 if any(r.errors for r in results) else 0
