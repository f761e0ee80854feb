"""The gate (--overlap-gating auto) under step-time noise: how often it runs the slower mode.

The plugin's real `ModeSelector` behind its real `SelectorRuntime` (flat prior: measurements
alone decide), fed the way a server feeds it (benchmarks/gating_trace.py: `tick`, `decide`, the
step's two timing events, measurements merged every `sync_steps` steps), over a decode trace of
batch sizes 1-16 padded to the graphs 1, 2, 4, 8, 16. Each step's time is synthetic, so which
mode is faster is known by construction:

    none(bs) = 1000 + 40 * bs  us;   tbo(bs) = factor * none(bs)
    measured = true time * lognormal(0, sd), and x `outlier` on a `rate` share of the steps

Per scenario, over seeds: auto's share of TBO-eligible steps run as TBO (the slower mode when
factor > 1, the faster when < 1), and auto's total time against the best fixed mode's (> 1:
slower). Ideal: 0 % TBO when factor > 1, 100 % when < 1, after a few measured steps.

Two rules on the same seeds and traces (`RULES`): "old", the selector on its means alone
(`SelectorConfig(confidence=0, clip=0)`: the rule before 2026-12-07), and "new", the defaults
(each step clipped at 1.5x its cell's mean; the current mode left only for a lead of at least
one standard error of its mean).

    .venv/bin/python benchmarks/bench_gate_noise.py [--seeds 20] [--steps 300 3000] [--json F]

No GPU and no SGLang needed (pure Python, ~2 min for both rules).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import gating_trace as gt  # noqa: E402
from sglang_overlap.modes import Mode  # noqa: E402
from sglang_overlap.planning.selector import SelectorConfig  # noqa: E402

SIZES = (1, 2, 4, 8, 16)
GRAPHS = frozenset({("none", b) for b in SIZES} | {("tbo", b) for b in SIZES if b >= 2})


@dataclass(frozen=True)
class Scenario:
    factor: float
    """TBO's true step time over none's (> 1: TBO slower)."""
    sd: float
    """Lognormal sigma of each measured step time (0: exact)."""
    rate: float = 0.0
    """Share of steps measured `outlier` times their true time (a host hiccup)."""
    outlier: float = 4.0

    def label(self) -> str:
        spikes = f"{self.rate:.0%} x{self.outlier:g}" if self.rate else "none"
        return f"tbo x{self.factor:.2f}, noise {self.sd:.0%}, spikes {spikes}"


RULES = {"old": SelectorConfig(confidence=0.0, clip=0.0), "new": SelectorConfig()}
SCENARIOS = [Scenario(f, sd, rate) for f in (1.2, 1 / 1.2) for sd, rate in
             ((0.0, 0.0), (0.0, 0.03), (0.1, 0.0), (0.1, 0.03), (0.25, 0.0), (0.25, 0.03))]


def true_us(mode: Mode | str, bs: int, factor: float) -> float:
    base = 1000.0 + 40.0 * bs
    return base * factor if Mode(mode) == Mode.TBO else base


def noisy_replayer(scenario: Scenario, seed: int) -> gt.Replay:
    """A step runner on a fake clock: events with CUDA's interface, times as the docstring."""
    rng = random.Random(seed)
    clock = [0.0]

    def replay(mode: str, bs: int) -> tuple[gt.FakeEvent, gt.FakeEvent]:
        t = true_us(mode, bs, scenario.factor) * rng.lognormvariate(0.0, scenario.sd)
        if rng.random() < scenario.rate:
            t *= scenario.outlier
        start = gt.FakeEvent(clock[0])
        clock[0] += t
        return start, gt.FakeEvent(clock[0])

    return replay


def one_pass(scenario: Scenario, steps: int, seed: int,
             config: SelectorConfig | None = None) -> dict[str, float]:
    """auto's share of TBO-eligible steps run as TBO, and its true total over the best fixed
    mode's (both on this seed's trace), under the selector's `config` (None: the defaults)."""
    trace = gt.decode_trace(steps, max(SIZES), seed=seed, mean_len=32, period=200)
    res = gt.run_policy("auto", trace, SIZES, GRAPHS, noisy_replayer(scenario, seed),
                        gt.new_runtime(frozenset({Mode.TBO}), config))
    eligible = [m for m, bs, p in zip(res.modes, trace, res.padded, strict=True)
                if Mode.TBO in gt.available(bs, p, GRAPHS)]
    auto = sum(true_us(m, p, scenario.factor) for m, p in zip(res.modes, res.padded, strict=True))
    exact = Scenario(scenario.factor, 0.0)  # the fixed policies' true times: run on exact steps
    fixed = {policy: sum(gt.run_policy(policy, trace, SIZES, GRAPHS,
                                       noisy_replayer(exact, seed)).step_us())
             for policy in ("none", "tbo")}
    return {"tbo_share": sum(m == Mode.TBO for m in eligible) / max(1, len(eligible)),
            "vs_best_fixed": auto / min(fixed.values())}


def run(seeds: int, steps: list[int]) -> list[dict[str, Any]]:
    """One row per (steps, scenario, rule), every rule on the same seeds."""
    rows = []
    for n in steps:
        for sc in SCENARIOS:
            for rule, config in RULES.items():
                passes = [one_pass(sc, n, seed, config) for seed in range(seeds)]
                shares = sorted(p["tbo_share"] for p in passes)
                rows.append({"steps": n, "scenario": sc.label(), "rule": rule,
                             "factor": sc.factor, "sd": sc.sd, "rate": sc.rate,
                             "outlier": sc.outlier, "seeds": seeds,
                             "tbo_share_mean": statistics.mean(shares),
                             "tbo_share_p90": shares[min(len(shares) - 1,
                                                         int(0.9 * len(shares)))],
                             "vs_best_fixed": statistics.mean(p["vs_best_fixed"]
                                                              for p in passes)})
    return rows


def wrong(row: dict[str, Any]) -> float:
    """The share of a row's TBO-eligible steps run in the slower mode."""
    share = float(row["tbo_share_mean"])
    return share if row["factor"] > 1 else 1.0 - share


def table(rows: list[dict[str, Any]]) -> str:
    """Old and new rule side by side per scenario; `wrong` = the share of TBO-eligible steps
    run in the slower mode (TBO share when TBO is slower, 1 - it when faster), new / old."""
    by = {(r["steps"], r["scenario"], r["rule"]): r for r in rows}
    lines = [f"{'steps':>5}  {'scenario':<36} {'TBO share old':>13} {'new':>6} "
             f"{'p90 old':>7} {'new':>6} {'ideal':>5} {'wrong new/old':>13} "
             f"{'time vs best fixed old':>22} {'new':>6}"]
    for (steps, scenario, rule), old in by.items():
        if rule != "old":
            continue
        new = by[steps, scenario, "new"]
        slow = old["factor"] > 1
        ratio = f"{wrong(new) / wrong(old):.2f}" if wrong(old) > 0 else "-"
        lines.append(f"{steps:>5}  {scenario:<36} {old['tbo_share_mean']:>13.1%} "
                     f"{new['tbo_share_mean']:>6.1%} {old['tbo_share_p90']:>7.1%} "
                     f"{new['tbo_share_p90']:>6.1%} {'0%' if slow else '100%':>5} "
                     f"{ratio:>13} {old['vs_best_fixed']:>21.3f}x {new['vs_best_fixed']:>5.3f}x")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=20)
    p.add_argument("--steps", type=int, nargs="+", default=[300, 3000])
    p.add_argument("--json", type=Path, help="write the rows here too")
    a = p.parse_args(argv)
    if a.seeds < 1 or min(a.steps) < 1:
        p.error(f"--seeds and --steps must be positive (got {a.seeds}, {a.steps})")
    rows = run(a.seeds, a.steps)
    print(table(rows))
    if a.json:
        a.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
