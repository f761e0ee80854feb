"""The serve table from serve_suite.py's records (OUT/serve_<name>.json, OUT/stack.json).

    python3 benchmarks/serve/report.py OUT [--json ALL.json]

Per server: greedy tokens against the baseline without the plugin on the same DeepEP tree
("base" for sgl-deep-ep, "base_ant" for antgroup-opt; "base" where that did not run),
bench_serving's median ITL and output throughput per concurrency (and the ratio to that
baseline, same run), graph capture time and memory from SGLang's log, the plugin's steps per mode
and SBO producer launches from /metrics, and, for --overlap-gating auto, the selector's decode
decisions per mode against the graph replays per mode counted by the probe plugin (outside
sglang-overlap). The planted-bug server (`planted`) passes only if that check FAILS on it.
Below the table: each server's CPU time per output token during each bench_serving run, by
process (where the records hold it: bench_many.py --watch-pid), and its mean forward step by
kind, host and GPU time (the probe's).

Token criterion (fp8, random weights): a prompt passes when its greedy ids equal the baseline's,
or first differ at a position where the baseline's top-2 log-probabilities are within
NEAR_TIE nats and the server picked the baseline's second token (a near-tie resolved the other
way by a kernel's rounding; everything after it is a different sequence and is not compared).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

NEAR_TIE = 0.05
HELD_MIB = 2048  # GPU memory in use before a server starts above this: an earlier one's remains
BASELINE = {"sgl-deep-ep": "base", "antgroup-opt": "base_ant"}


def token_verdict(rows: list[dict[str, Any]], base: list[dict[str, Any]]) -> tuple[bool, str]:
    equal, ties, bad = 0, [], []
    for i, (r, b) in enumerate(zip(rows, base, strict=True)):
        diff = next((p for p, (x, y) in enumerate(zip(r["ids"], b["ids"], strict=False))
                     if x != y), None)
        if diff is None and len(r["ids"]) == len(b["ids"]):
            equal += 1
            continue
        top = b["top2"][diff] if diff is not None else []
        gap = top[0][0] - top[1][0] if len(top) == 2 else float("inf")
        if diff is not None and len(top) == 2 and r["ids"][diff] == top[1][1] and gap < NEAR_TIE:
            ties.append(f"p{i}@{diff} gap {gap:.3f}")
        else:
            bad.append(f"p{i}@{diff} gap {gap:.3f}")
    text = f"{equal}/{len(rows)} equal" + (f", near-tie {'; '.join(ties)}" if ties else "")
    return not bad, text + (f", DIFFERENT {'; '.join(bad)}" if bad else "")


def decisions_vs_replays(rec: dict[str, Any]) -> tuple[bool, str]:
    """Decode decisions of the selector per mode == graph replays labelled with that mode."""
    if not rec.get("modes"):
        return True, "-"
    dec: dict[str, int] = {}
    for *key, n in (rec.get("gate") or {}).get("counters", {}).get("decisions", []):
        if key[0] == "decode":
            dec[key[1]] = dec.get(key[1], 0) + n
    rep = {m: sum(n for lab, n in rec["graphs"]["replays"].items() if lab.endswith(f"overlap:{m}"))
           for m in rec["modes"]}
    ok = all(dec.get(m, 0) == rep[m] for m in rec["modes"]) and sum(rep.values()) > 0
    return ok, " ".join(f"{m} {dec.get(m, 0)}/{rep[m]}" for m in rec["modes"])


def metric_counts(rec: dict[str, Any], series: str, label: str) -> dict[str, float]:
    """Sum of a `sglang_overlap_<series>_total` counter from the record's /metrics lines, by the
    value of `label`."""
    out: dict[str, float] = {}
    for line in rec.get("metrics", []):
        name, _, rest = line.partition("{")
        if name != f"sglang_overlap_{series}_total":
            continue
        labels, _, value = rest.rpartition("}")
        key = next((kv.split("=", 1)[1].strip('"') for kv in labels.split(",")
                    if kv.split("=", 1)[0] == label), "?")
        out[key] = out.get(key, 0.0) + float(value)
    return out


def fmt_counts(counts: dict[str, float]) -> str:
    return " ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items())) or "-"


CPU_GROUPS = (("scheduler", "sglang::scheduler"), ("main", "main"),
              ("detokenizer", "sglang::detokenizer"))


def cpu_per_token(bench: dict[str, Any]) -> dict[str, float] | None:
    """One bench_serving record's CPU milliseconds per output token by process group (the
    scheduler processes, the server's main process, the detokenizer, "other": the rest); None
    where the record has no CPU reading or no output tokens."""
    cpu, tokens = bench.get("cpu_s"), bench.get("total_output_tokens")
    if not cpu or not tokens:
        return None
    out = {g: 0.0 for g, _ in CPU_GROUPS} | {"other": 0.0}
    for title, secs in cpu.items():
        group = next((g for g, prefix in CPU_GROUPS if title.startswith(prefix)), "other")
        out[group] += secs * 1e3 / tokens
    return out


def cpu_table(recs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines: per server and concurrency, CPU ms per output token by process group."""
    rows = {name: {c: v for c, b in r.get("bench", {}).items()
                   if (v := cpu_per_token(b)) is not None} for name, r in recs.items()}
    concs = sorted({int(c) for per in rows.values() for c in per})
    if not concs:
        return []
    groups = [g for g, _ in CPU_GROUPS] + ["other"]
    lines = ["", "CPU ms per output token during bench_serving (user + system, all threads): "
             + " / ".join(groups), "",
             "| server | " + " | ".join(f"c={c}" for c in concs) + " |",
             "|" + "---|" * (1 + len(concs))]
    for name, per in rows.items():
        if per:
            lines.append(f"| {name} | " + " | ".join(
                " / ".join(f"{per[str(c)][g]:.2f}" for g in groups) if str(c) in per else "-"
                for c in concs) + " |")
    return lines


STEP_KINDS = ("decode bs=1", "decode bs=64", "prefill")


def step_times(rec: dict[str, Any]) -> dict[str, tuple[float, float | None, int]]:
    """Per step kind the probe timed (STEP_KINDS): (mean host ms, mean GPU ms or None, steps)."""
    out = {}
    for kind in STEP_KINDS:
        row = ((rec.get("graphs") or {}).get("steps") or {}).get(kind)
        if row and row.get("n"):
            gpu = row["gpu_ms"] / row["gpu_n"] if row.get("gpu_n") else None
            out[kind] = (row["host_s"] * 1e3 / row["n"], gpu, int(row["n"]))
    return out


def steps_table(recs: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines: each server's mean forward step, host and GPU, by kind (the probe's)."""
    rows = {name: t for name, r in recs.items() if (t := step_times(r))}
    if not rows:
        return []
    lines = ["", "Forward steps timed by the probe (every server): mean host ms / GPU ms (steps)",
             "", "| server | " + " | ".join(STEP_KINDS) + " |",
             "|" + "---|" * (1 + len(STEP_KINDS))]
    for name, t in rows.items():
        cells = [f"{t[k][0]:.2f} / " + (f"{t[k][1]:.2f}" if t[k][1] is not None else "-")
                 + f" ({t[k][2]})" if k in t else "-" for k in STEP_KINDS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def table(recs: dict[str, dict[str, Any]],
          kernels: list[dict[str, Any]] | dict[str, str]) -> tuple[str, bool]:
    """The markdown table and whether every check passed. `kernels`: stage.sh's kernel checks
    (stack.json's "kernels": a list of rows, or {"skipped": why} under STAGE_CHECKS=0)."""
    lines, all_ok = [], True
    if isinstance(kernels, dict):
        why = kernels.get("skipped", kernels)
        lines.append(f"Kernels on the staged stack: not checked ({why})")
    elif kernels:
        lines.append("Kernels on the staged stack: " + ", ".join(
            f"{k['check']} {'ok' if k['ok'] else 'FAIL'}"
            + (f" ({k['rel_err']:.1e})" if "rel_err" in k and k["bound"] < 1 else "")
            for k in kernels))
        all_ok &= all(k["ok"] for k in kernels)
    concs = sorted({int(c) for r in recs.values() for c in r.get("bench", {})})
    lines += ["", "| server | DeepEP tree | flags | tokens vs baseline | "
              + " | ".join(f"ITL p50 ms c={c} (x base)" for c in concs)
              + f" | out tok/s c={concs[-1] if concs else '-'} (x base) | graph capture s / GB"
              " | steps by mode | decode decisions/replays | SBO producer launches |",
              "|" + "---|" * (9 + len(concs))]
    for name, r in recs.items():
        base = recs.get(BASELINE.get(r["tree"], "base")) or recs.get("base")
        if "error" in r:
            all_ok = False
            lines.append(f"| {name} | {r['tree']} | {' '.join(r['flags'])} | FAILED: "
                         f"{r['error'][:160]} |" + " |" * (5 + len(concs)))
            continue
        if r.get("refused_needle"):  # passed: refused at start with its message (else: error)
            lines.append(f"| {name} | {r['tree']} | {' '.join(r['flags'])} | refused at start, "
                         f"as it must be: \"...{r['refused_needle']}...\" |"
                         + " |" * (5 + len(concs)))
            continue
        tok_ok, tok = (True, "baseline") if base is r else (False, "no baseline") if not base \
            or "error" in base else token_verdict(r["tokens_batch"] + r["tokens_single"],
                                                  base["tokens_batch"] + base["tokens_single"])
        cells = []
        for c in concs:
            itl = r["bench"].get(str(c), {}).get("median_itl_ms")
            b = (base or {}).get("bench", {}).get(str(c), {}).get("median_itl_ms")
            cells.append(f"{itl:.2f}" + (f" ({itl / b:.3f})" if b and base is not r else "")
                         if itl else "-")
        thr = r["bench"].get(str(concs[-1]), {}).get("output_throughput") if concs else None
        bthr = (base or {}).get("bench", {}).get(str(concs[-1]), {}).get("output_throughput") \
            if concs else None
        thr_s = f"{thr:.0f}" + (f" ({thr / bthr:.3f})" if bthr and base is not r else "") \
            if thr else "-"
        cap = " + ".join(f"{c['time_s']:.1f} s / {c['mem_gb']:.2f}" for c in r["capture"]) or "-"
        sets = (r.get("graphs") or {}).get("captures") or {}
        if sets:  # graphs captured per set (the probe's labels: "overlap:<mode>", "" = SGLang's)
            cap += " (" + ", ".join(f"{lab.split(':')[-1] or 'one set'} {n}"
                                    for lab, n in sorted(sets.items())) + ")"
        dr_ok, dr = decisions_vs_replays(r)
        if r.get("planted"):  # the planted bug must be caught by the check
            dr_ok, dr = not dr_ok, ("caught: " if not dr_ok else "NOT CAUGHT: ") + dr
        steps = fmt_counts(metric_counts(r, "steps", "mode"))
        producer = fmt_counts(metric_counts(r, "sbo_producer_launches", "producer"))
        all_ok &= tok_ok and dr_ok
        lines.append(f"| {name} | {r['tree']} | {' '.join(r['flags']) or '-'} | {tok} | "
                     + " | ".join(cells) + f" | {thr_s} | {cap} | {steps} | {dr} | {producer} |")
    held = [f"{name} ({r['gpu_used_mib_before']} MiB)" for name, r in recs.items()
            if (r.get("gpu_used_mib_before") or 0) > HELD_MIB]
    if held:  # its timings share the GPU with what an earlier server left
        lines.append(f"\nGPU memory already in use when a server started: {', '.join(held)}")
    lines += cpu_table(recs)
    lines += steps_table(recs)
    return "\n".join(lines), all_ok


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    recs = {json.loads(p.read_text())["name"]: json.loads(p.read_text())
            for p in sorted(args.out.glob("serve_*.json"), key=lambda p: p.stat().st_mtime)}
    spath = args.out / "stack.json"  # stage.sh's checks of the staged stack
    kernels = json.loads(spath.read_text()).get("kernels", []) if spath.is_file() else []
    text, ok = table(recs, kernels)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"servers": recs, "kernels": kernels}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
