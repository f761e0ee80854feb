"""SGLang's bench_serving at several concurrencies in one process: its import and start-up (~25 s
a process on the GPU machine, 2026-12-07) paid once per server, not once per concurrency.

    python3 benchmarks/serve/bench_many.py --concurrency 1,16,64 --out OUT/bench_NAME \
        -- <sglang.benchmark.serving flags but --max-concurrency, --num-prompts, --output-file>

Per concurrency C, in that order: `--max-concurrency C --num-prompts max(16, 8 C)`, the result
appended to OUT_cC.jsonl (bench_serving's own record) and its printout in OUT_cC.log. With
`--watch-pid PID` (the server's process), OUT_cC.cpu.json gets the CPU seconds each of the server's
processes spent during that run, by title ({"sglang::scheduler_TP0": 1.93, ...}). Exit 0 when
every concurrency ran; a failing one is logged (its .log ends with the traceback) and the rest
still run, exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path


def prompts_for(concurrency: int) -> int:
    """Prompts per run: 8 per concurrent request, at least 16. (With 4, the 2026-12-07 runs, c=16
    and c=64 lasted 2.4-9.4 s, and output throughput moved by up to 1.8x between servers.)"""
    return max(16, 8 * concurrency)


def tree_cpu_seconds(root: int, proc: Path = Path("/proc")) -> dict[str, float]:
    """CPU time (user + system, all threads; seconds) of process `root` and every process below
    it, summed by title: `main` for `root`, else the first word of the command line (SGLang
    titles its processes `sglang::scheduler_TP0`, `sglang::detokenizer`). A process that ends
    while it is read is left out; {} when `root` is gone. Reads Linux's /proc (`proc`)."""
    tick = os.sysconf("SC_CLK_TCK")
    stats: dict[int, tuple[int, int]] = {}  # pid -> (ppid, utime + stime in ticks)
    for d in proc.iterdir():
        if not d.name.isdigit():
            continue
        try:
            raw = (d / "stat").read_text()
        except OSError:
            continue
        f = raw[raw.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ... (field 3 on)
        stats[int(d.name)] = (int(f[1]), int(f[11]) + int(f[12]))  # fields 4, 14, 15
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in stats.items():
        children.setdefault(ppid, []).append(pid)
    out: dict[str, float] = {}
    todo = [root] if root in stats else []
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        try:
            words = (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").split()
        except OSError:
            continue
        title = "main" if pid == root else words[0].decode(errors="replace") if words else "?"
        out[title] = out.get(title, 0.0) + stats[pid][1] / tick
    return out


def cpu_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Seconds per title between two `tree_cpu_seconds` readings (a title new in `after`
    counts from 0; one gone from it is left out)."""
    return {k: round(v - before.get(k, 0.0), 3) for k, v in after.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concurrency", required=True,
                    help="comma-separated positive integers, run in that order")
    ap.add_argument("--out", required=True, type=Path, help="prefix of OUT_cC.jsonl / .log")
    ap.add_argument("--watch-pid", type=int, help="the server's process: OUT_cC.cpu.json gets "
                    "its processes' CPU seconds per run")
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
        before = tree_cpu_seconds(a.watch_pid) if a.watch_pid else {}
        with open(f"{a.out}_c{c}.log", "w") as log, contextlib.redirect_stdout(log), \
                contextlib.redirect_stderr(log):
            try:
                serving.cli_main()
            except BaseException:  # noqa: BLE001 - the next concurrency still runs
                traceback.print_exc()
                failed += 1
        if a.watch_pid:
            Path(f"{a.out}_c{c}.cpu.json").write_text(
                json.dumps(cpu_delta(before, tree_cpu_seconds(a.watch_pid))))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
