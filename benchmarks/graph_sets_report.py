"""The markdown tables (and JSON) of benchmarks/bench_graph_sets.py, from plain numbers.

Inputs: capture rows (`graph_sets.CaptureResult.row()` plus "round"), the replay table
{(mode, bs): {"median", "p10", "p90" us, "rel_vs_none"}}, the selector rounds {"wall_ms",
"steps_ms": {policy: [per round]}, "auto_runs": [gating_trace.PassResult]}, the trace and the
captured (mode, bs) keys. No torch.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks import gating_trace as gt

MIB = 1 << 20


def _mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MIB:.1f}"


def _ratio(v: float | None, base: float | None) -> str:
    return "-" if v is None or not base else f"{v / base:.2f}x"


def capture_rows(caps: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per config: median wall over rounds, memory of its last round."""
    by: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for c in caps:
        by.setdefault(tuple(c["modes"]), []).append(c)
    rows = []
    for modes, runs in by.items():
        last = runs[-1]
        rows.append({"modes": list(modes), "graphs": last["graphs"],
                     "wall_s": statistics.median(r["wall_s"] for r in runs),
                     "wall_runs": [r["wall_s"] for r in runs],
                     "pool_runs": [r["pool_bytes"] for r in runs],
                     **{k: last[k] for k in ("pool_bytes", "reserved_delta", "allocated_delta")}})
    return rows


def capture_md(rows: Sequence[Mapping[str, Any]]) -> str:
    base = next((r for r in rows if r["modes"] == ["none"]), rows[0])
    out = ["| graph sets | graphs | capture s (median; runs) | vs none set | pool MiB (runs) | "
           "vs none set | reserved +MiB | allocated +MiB |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        runs = ", ".join(f"{w:.2f}" for w in r["wall_runs"])
        pools = ", ".join(_mib(p) for p in r.get("pool_runs", [r["pool_bytes"]]))
        out.append(f"| {' + '.join(r['modes'])} | {r['graphs']} | {r['wall_s']:.2f} ({runs}) | "
                   f"{_ratio(r['wall_s'], base['wall_s'])} | {_mib(r['pool_bytes'])} ({pools}) | "
                   f"{_ratio(r['pool_bytes'], base['pool_bytes'])} | "
                   f"{_mib(r['reserved_delta'])} | {_mib(r['allocated_delta'])} |")
    return "\n".join(out)


def replay_md(table: Mapping[tuple[str, int], Mapping[str, float]]) -> str:
    sizes = sorted({bs for _m, bs in table})
    out = ["| batch | none us [p10-p90] | tbo us [p10-p90] | sbo us [p10-p90] | fastest | "
           "tbo / none | sbo / none | rel err tbo, sbo vs none |",
           "|---|---|---|---|---|---|---|---|"]
    for bs in sizes:
        cells, errs = [], []
        for m in gt.FIXED:
            r = table.get((m, bs))
            cells.append("-" if r is None else
                         f"{r['median']:.1f} [{r['p10']:.1f}-{r['p90']:.1f}]")
            if r is not None and m != "none":
                errs.append(f"{r['rel_vs_none']:.1e}")
        have = {m: table[m, bs]["median"] for m in gt.FIXED if (m, bs) in table}
        none = have["none"]
        out.append(f"| {bs} | {' | '.join(cells)} | {min(have, key=have.__getitem__)} | "
                   f"{_ratio(have.get('tbo'), none)} | {_ratio(have.get('sbo'), none)} | "
                   f"{', '.join(errs) or '-'} |")
    return "\n".join(out)


def selector_md(sel: Mapping[str, Any], table: Mapping[tuple[str, int], Mapping[str, float]],
                trace: Sequence[int], keys: frozenset[tuple[str, int]]) -> tuple[str, dict]:
    wall, steps = sel["wall_ms"], sel["steps_ms"]
    sw, ss = gt.summarize(wall), gt.summarize(steps)
    runs: list[gt.PassResult] = sel["auto_runs"]
    med = {k: v["median"] for k, v in table.items()}
    oracle = gt.oracle_us(runs[0].padded, trace, med, keys) / 1e3 if runs else None
    per_mode = {m: statistics.mean(r.per_mode().get(m, 0) for r in runs) for m in gt.FIXED}
    explored = [sum(r.explored) for r in runs]
    cost = [gt.explore_cost_us(r, med, keys, trace) / 1e3 for r in runs]
    out = ["| policy | pass wall ms (mean) | throughput vs best fixed, wall [95% CI] | "
           "step-time sum ms (mean) | vs best fixed, step times [95% CI] | steps per mode |",
           "|---|---|---|---|---|---|"]
    for p in wall:
        modes = (", ".join(f"{m} {per_mode[m]:.0f}" for m in gt.FIXED) if p == "auto"
                 else f"{p} where it can run")
        out.append(f"| {p} | {sw['mean'][p]:.1f} | {sw['ratios'][p]['text']} | "
                   f"{ss['mean'][p]:.1f} | {ss['ratios'][p]['text']} | {modes} |")
    facts = {"best_fixed_wall": sw["best_fixed"], "best_fixed_steps": ss["best_fixed"],
             "oracle_ms": oracle, "explored_steps": explored, "explore_cost_ms": cost,
             "auto_steps_per_mode": per_mode, "wall": sw, "steps": ss}
    out.append("")
    out.append(f"Best fixed mode: {sw['best_fixed']} (wall), {ss['best_fixed']} (step times). "
               f"Per-step oracle from the median isolated replays (each followed by a sync, "
               f"so a little slower than back-to-back steps): {oracle:.1f} ms. Auto "
               f"explored {statistics.mean(explored):.0f} of {len(trace)} steps per round "
               f"(rounds: {explored}), costing {statistics.mean(cost):.2f} ms per round over "
               f"the fastest mode at their size (median replays).")
    return "\n".join(out), facts


def render(info: Mapping[str, Any], errs: Mapping[str, float], caps: Sequence[Mapping[str, Any]],
           table: Mapping[tuple[str, int], Mapping[str, float]], sel: Mapping[str, Any],
           trace: Sequence[int], keys: frozenset[tuple[str, int]]) -> tuple[str, dict[str, Any]]:
    """(markdown, JSON-ready dict)."""
    rows = capture_rows(caps)
    sel_text, facts = selector_md(sel, table, trace, keys)
    worst = max((v for k, v in errs.items() if not k.startswith("tbo_halves")), default=0.0)
    halves = max((v for k, v in errs.items() if k.startswith("tbo_halves")), default=0.0)
    text = "\n\n".join([
        f"{info.get('card')}: {info.get('layers')} MoE layers, E {info.get('experts')}, "
        f"deep_ep {info.get('deep_ep')} ({info.get('form')}), torch {info.get('torch')}; "
        f"sizes {info.get('sizes')}; trace {len(trace)} steps, batch 1-{max(trace)}, mean "
        f"{statistics.mean(trace):.1f}; eager tbo/sbo vs none: worst rel err {worst:.1e}; "
        f"tbo vs none on each micro-batch alone: worst {halves:.1e}",
        "Capture (one shared pool, largest size first):", capture_md(rows),
        "Replay (single replays, CUDA events, us):", replay_md(table),
        f"Selector over the trace ({len(sel['wall_ms']['none'])} rounds, alternating order):",
        sel_text])
    data = {"info": dict(info), "eager_rel_err": dict(errs), "capture": rows,
            "capture_runs": list(caps),
            "replay": {f"{m}@{bs}": dict(v) for (m, bs), v in table.items()},
            "selector": {"wall_ms": sel["wall_ms"], "steps_ms": sel["steps_ms"], **facts},
            "trace": list(trace)}
    return text, data


__all__ = ["capture_md", "capture_rows", "render", "replay_md", "selector_md"]
