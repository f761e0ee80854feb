"""SGLang's bench_serving at several concurrencies in one process: its import and start-up (~25 s
a process on the GPU machine, 2026-12-07) paid once per server, not once per concurrency.

    python3 benchmarks/serve/bench_many.py --concurrency 1,16,64 --out OUT/bench_NAME \
        -- <sglang.benchmark.serving flags but --max-concurrency, --num-prompts, --output-file>

Per concurrency C, in that order: `--max-concurrency C --num-prompts max(16, 8 C)`, the result
appended to OUT_cC.jsonl (bench_serving's own record) and its printout in OUT_cC.log. Exit 0 when
every concurrency ran; a failing one is logged (its .log ends with the traceback) and the rest
still run, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import traceback
from pathlib import Path


def prompts_for(concurrency: int) -> int:
    """Prompts per run: 8 per concurrent request, at least 16. (With 4, the 2026-12-07 runs, c=16
    and c=64 lasted 2.4-9.4 s, and output throughput moved by up to 1.8x between servers.)"""
    return max(16, 8 * concurrency)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", required=True,
                    help="comma-separated positive integers, run in that order")
    ap.add_argument("--out", required=True, type=Path, help="prefix of OUT_cC.jsonl / .log")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    try:
        levels = [int(c) for c in a.concurrency.split(",")]
    except ValueError:
        ap.error(f"--concurrency {a.concurrency!r}: comma-separated integers")
    if not levels or min(levels) < 1:
        ap.error(f"--concurrency {a.concurrency!r}: each at least 1")
    rest = a.bench_args[1:] if a.bench_args[:1] == ["--"] else a.bench_args
    # `--num-prompts 3` and `--num-prompts=3` alike
    owned = {"--max-concurrency", "--num-prompts", "--output-file"} & {
        arg.split("=", 1)[0] for arg in rest}
    if owned:
        ap.error(f"{sorted(owned)}: set per concurrency by bench_many.py")
    from sglang.benchmark import serving

    failed = 0
    for c in levels:
        res = Path(f"{a.out}_c{c}.jsonl")
        sys.argv = ["sglang.benchmark.serving", *rest, "--max-concurrency", str(c),
                    "--num-prompts", str(prompts_for(c)), "--output-file", str(res)]
        with open(f"{a.out}_c{c}.log", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            try:
                serving.cli_main()
            except BaseException:  # noqa: BLE001 - the next concurrency still runs
                traceback.print_exc()
                failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
