"""Hand-made mutants of the gate's robustness (2026-12-07): the step table's sums of squares,
the clip of each measured step, the current mode's error; and the tests that must kill them.

    python -m tests.mutation.gate_robust [--tree DIR] [--only ID ...]

runs each mutant in DIR (default: this checkout; a clean git worktree: each file is restored
with `git checkout` after its mutant) and prints killed / survived per mutant.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.mutation.decision_glue import ROOT, Mutant, report

UNIT = ["tests/planning/test_step_table.py", "tests/planning/test_selector.py",
        "tests/planning/test_selector_estimates.py", "tests/planning/test_selector_exploration.py",
        "tests/benchmarks/test_gate_noise.py", "tests/sglang/test_gate_glue.py"]

T = "sglang_overlap/planning/step_table.py"
E = "sglang_overlap/planning/selector_estimates.py"
S = "sglang_overlap/planning/selector.py"
RT = "sglang_overlap/sglang/selector_runtime.py"

MUTANTS = [
    Mutant("T1", "squares add the value, not its square", T,
           "self.squares[cell] += v * v", "self.squares[cell] += v"),
    Mutant("T2", "squares of the unrounded time", T,
           "self.squares[cell] += v * v", "self.squares[cell] += int(us * us)"),
    Mutant("T3", "spread of a single step", T, "        if n < 2:\n            return None",
           "        if n < 1:\n            return None"),
    Mutant("T4", "population variance, not sample", T,
           "scaled / (n * n * (n - 1))", "scaled / (n * n * n)"),
    Mutant("T5", "no floor at 0 after a cap", T,
           "scaled = max(0, n * self.squares[cell] - t * t)",
           "scaled = n * self.squares[cell] - t * t"),
    Mutant("T6", "add_cells ignores the incoming squares", T,
           "q = squares[cell] + square", "q = squares[cell]"),
    Mutant("T7", "add_cells caps the squares not", T,
           "t, q, n = t * max_count // n, q * max_count // n, max_count",
           "t, q, n = t * max_count // n, q, max_count"),
    Mutant("T8", "take leaves the squares behind", T,
           "counts[c] = totals[c] = squares[c] = 0", "counts[c] = totals[c] = 0"),
    Mutant("T9", "take hands out no squares", T,
           "out.append((c, n, totals[c], squares[c]))", "out.append((c, n, totals[c], 0))"),
    Mutant("T10", "cap keeps the squares", T,
           "                self.squares[i] = self.squares[i] * max_count // n\n", ""),
    Mutant("T11", "clear keeps the squares", T,
           "        self.totals = [0] * NUM_CELLS\n        self.squares = [0] * NUM_CELLS\n\n"
           "    def empty",
           "        self.totals = [0] * NUM_CELLS\n\n    def empty"),
    Mutant("E1", "a refresh drops its squares", E,
           "n, t, q = n + count, t + total, q + squares",
           "n, t, q = n + count, t + total, q"),
    Mutant("E2", "clip ignores the cell's own mean", E,
           "        if own is not None:\n            return own\n",
           "        if False:\n            return own\n"),
    Mutant("E3", "clip at the slowest mean of the bucket", E,
           "return min(means, default=None)", "return max(means, default=None)"),
    Mutant("S1", "clip does nothing", S,
           "return us if ceiling is None else min(us, self.config.clip * ceiling)",
           "return us"),
    Mutant("S2", "clip at the mean itself", S,
           "min(us, self.config.clip * ceiling)", "min(us, ceiling)"),
    Mutant("S3", "clip 0 clips to 0", S,
           "        if not self.config.clip:\n            return us\n", ""),
    Mutant("S4", "a lead of exactly the error does not switch", S,
           "if estimates[current] - estimates[best] < cfg.confidence * error:",
           "if estimates[current] - estimates[best] <= cfg.confidence * error:"),
    Mutant("S5", "the challenger's error holds the current mode", S,
           "error = self.table.spread(cell_index(phase, bucket, current)) or 0.0",
           "error = self.table.spread(cell_index(phase, bucket, best)) or 0.0"),
    Mutant("S6", "confidence ignored (1 error)", S,
           "< cfg.confidence * error:", "< error:"),
    Mutant("S7", "no confidence rule", S,
           "if estimates[current] - estimates[best] < cfg.confidence * error:",
           "if False:"),
    Mutant("S8", "hysteresis boundary moved", S,
           "if estimates[best] > estimates[current] * (1.0 - cfg.hysteresis):",
           "if estimates[best] >= estimates[current] * (1.0 - cfg.hysteresis):"),
    Mutant("S9", "clip below 1 accepted", S,
           "(self.clip == 0 or self.clip >= 1)", "(self.clip == 0 or self.clip >= 0)"),
    Mutant("S10", "negative confidence accepted", S,
           "self.confidence >= 0 and", "self.confidence >= -1 and"),
    Mutant("S11", "confidence 2 by default", S,
           "    confidence: float = 1.0", "    confidence: float = 2.0"),
    Mutant("S12", "clip 2 by default", S, "    clip: float = 1.5", "    clip: float = 2.0"),
    Mutant("R1", "record does not clip", RT,
           "self.local.add(cell, self.selector.clip(cell, us))", "self.local.add(cell, us)"),
    Mutant("R2", "the all-reduce carries the totals as squares", RT,
           "+ [local.squares[c] for c in keys])", "+ [local.totals[c] for c in keys])"),
    Mutant("R3", "the all-reduce drops the squares", RT,
           "summed[2 * n + i])", "0)"),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    mutants = [m for m in MUTANTS if args.only is None or m.id in args.only]
    return report(args.tree, mutants, lambda m: UNIT)


if __name__ == "__main__":
    raise SystemExit(main())
