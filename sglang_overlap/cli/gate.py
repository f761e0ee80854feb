"""`sglang-overlap gate --url URL`: the step times a server's --overlap-gating auto has learned.

Reads GET /server_info (the `sglang_overlap_gate` entry each DP rank's scheduler adds) and prints,
per phase and token bucket, every measured mode's mean step time and sample count; `--json`
prints the entries as served; `--plot FILE.png` draws them (`gate_plot.py`, needs matplotlib).
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.request
from typing import Any


def add_parser(subparsers: Any, name: str, help: str) -> None:  # noqa: A002 - dispatcher's API
    p = subparsers.add_parser(name, help=help, description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--json", action="store_true", help="print the served entries as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw step time per token bucket and "
                   "mode, the served mode shaded (needs matplotlib)")
    p.add_argument("--dp-rank", type=int, default=0,
                   help="with --plot: whose table to draw (default 0)")
    p.set_defaults(func=run)


def tables(url: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url.rstrip('/')}/server_info", timeout=30) as r:
        info = json.loads(r.read())
    return [s["sglang_overlap_gate"] for s in info.get("internal_states") or []
            if isinstance(s, dict) and "sglang_overlap_gate" in s]


def format_table(table: dict[str, Any]) -> str:
    lines = [f"prior: {table['prior']}", f"setup: {table['setup']}",
             f"{table['steps']} steps, {table['explored']} explored, {table['syncs']} syncs",
             "steps run per mode: " + ", ".join(f"{k}={v}" for k, v in table["chosen"].items())]
    grouped: dict[tuple[str, int, int], list[str]] = {}
    for r in table["rows"]:
        lo, hi = r["tokens"]
        grouped.setdefault((r["phase"], lo, hi), []).append(
            f"{r['mode']}={r['mean_ms']:.3f}ms x{r['count']}")
    for (phase, lo, hi), cells in grouped.items():
        span = str(lo) if lo == hi else f"{lo}-{hi if hi < 1 << 62 else 'inf'}"
        best = min(cells, key=lambda c: float(c.split("=")[1].split("ms")[0]))
        lines.append(f"{phase:8s} tokens {span:>11s}: {', '.join(cells)}  (fastest "
                     f"{best.split('=')[0]})")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        found = tables(args.url)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"sglang-overlap gate: cannot read {args.url}/server_info ({exc})", file=sys.stderr)
        return 2
    if not found:
        print(f"sglang-overlap gate: {args.url} serves no gate table (is it running with "
              "--overlap-gating auto and this plugin?)", file=sys.stderr)
        return 1
    if args.plot:
        if not 0 <= args.dp_rank < len(found):
            print(f"sglang-overlap gate: --dp-rank {args.dp_rank}: the server has DP ranks "
                  f"0-{len(found) - 1}", file=sys.stderr)
            return 2
        from sglang_overlap.cli.gate_plot import draw_gate

        draw_gate(found[args.dp_rank], args.plot, title=f"{args.url}, DP rank {args.dp_rank}: "
                  f"what --overlap-gating auto learned")
    if args.json:
        print(json.dumps(found, indent=2))
    else:
        print("\n\n".join(f"DP rank {i}:\n{format_table(t)}" for i, t in enumerate(found)))
    if args.plot:
        print(f"plot: {args.plot}")
    return 0
