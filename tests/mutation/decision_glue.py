"""Hand-made mutants of the step-decision glue, and the tests that must kill them.

mutmut cannot start SGLang servers, so the glue is mutated by hand: each mutant is one edit that a
plausible bug would make (the graph set, the SBO switch, the counters, the timing cell, the
hand-over, the TBO split, the capture, the draft model, the followers...). `NEW` mutates this
tree; `OLD` mutates the same concepts in the tree before the decision object (commit 33729e2,
where the mode travelled by `state.set_step_mode` and was re-derived by each hook), so the two
scores compare.

    python -m tests.mutation.decision_glue [--tree DIR] [--old] [--only ID ...]

runs each mutant in DIR (default: this checkout; it must be a clean git worktree: each file is
restored with `git checkout` after its mutant) and prints killed / survived per mutant.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[2]
UNIT = ["tests/sglang/test_gate_glue.py", "tests/sglang/test_decode_cuda_graph_runner.py",
        "tests/sglang/test_deepseek_v2.py", "tests/sglang/test_state.py",
        "tests/sglang/test_operations.py", "tests/kit/test_graphs.py",
        "tests/planning/test_selector.py"]
E2E = ["tests/e2e/test_selector_graphs.py"]


class Mutant(NamedTuple):
    id: str
    what: str
    file: str
    before: str
    after: str
    e2e: bool = False  # killed only by a server run (slow: run with --e2e)


G = "sglang_overlap/sglang/upstream/decode_cuda_graph_runner.py"
R = "sglang_overlap/sglang/upstream/model_runner.py"
D = "sglang_overlap/sglang/upstream/dp_attn.py"
S = "sglang_overlap/sglang/state.py"
RT = "sglang_overlap/sglang/selector_runtime.py"

NEW = [
    Mutant("M1", "graph choice ignores the decision", G,
           "    d = state.decision()\n    if d is not None:\n        return d\n",
           "    d = None\n    if d is not None:\n        return d\n"),
    Mutant("M2", "SBO switch ignores the decision", S,
           "    if d is not None:\n        return d.mode == Mode.SBO\n",
           "    if False:\n        return d.mode == Mode.SBO\n"),
    Mutant("M3", "counters name another mode", R,
           'stats.add("steps", decision.phase, decision.mode, runner)',
           'stats.add("steps", decision.phase, Mode.NONE, runner)'),
    Mutant("M4", "timing cell of another mode", "sglang_overlap/planning/selector.py",
           "cell_index(phase, bucket, chosen)", "cell_index(phase, bucket, Mode.NONE)"),
    Mutant("M5", "decision not handed to the forward", D,
           "    state.hand_over(decision)\n", "    state.hand_over(None)\n"),
    Mutant("M6", "a handed decision is not consumed", S,
           "    d, _handed[0] = _handed[0], None\n", "    d = _handed[0]\n"),
    Mutant("M7", "SGLang's TBO split kept whatever the mode", D,
           "    if decision.mode != Mode.TBO:\n", "    if False:\n"),
    Mutant("M8", "graph key does not name the mode", G,
           "    if d is None or not runner_modes(self):\n", "    if True:\n"),
    Mutant("M9", "a graph set captured as another mode", G,
           "StepDecision(mode, Phase.DECODE, why=\"graph capture\"",
           "StepDecision(Mode.NONE, Phase.DECODE, why=\"graph capture\""),
    Mutant("M10", "a draft model's forward taken as the step", R,
           "    if self.is_draft_worker:\n        return orig(self, forward_batch, *args, **kwargs)"
           "\n    decision = step_decision",
           "    if False:\n        return orig(self, forward_batch, *args, **kwargs)\n"
           "    decision = step_decision"),
    Mutant("M11", "a follower times its steps", RT,
           "return decision.cell if self.source else None", "return decision.cell"),
    Mutant("M12", "an undecided step keeps the last decision", D,
           "        state.hand_over(None)  # undecided", "        pass  # undecided"),
    Mutant("M13", "a decision the batch contradicts runs anyway", R,
           "    if split != (handed.mode == Mode.TBO)", "    if False"),
    Mutant("M14", "SGLang's own rule: SBO before the split", "sglang_overlap/modes.py",
           "mode = Mode.TBO if split else Mode.SBO if sbo_enabled else Mode.NONE",
           "mode = Mode.SBO if sbo_enabled else Mode.TBO if split else Mode.NONE"),
    Mutant("M15", "the runner's TBO switch not following the mode", G,
           "runner.enable_two_batch_overlap = saved_tbo and mode == Mode.TBO",
           "runner.enable_two_batch_overlap = saved_tbo"),
    Mutant("M16", "a replay outside the step's mode", G,
           "    with _as_step(self, step_graph_decision(forward_batch)):\n"
           "        return orig(self, forward_batch, *args, **kwargs)",
           "    with contextlib.nullcontext():\n"
           "        return orig(self, forward_batch, *args, **kwargs)"),
    Mutant("M17", "the GPU issue's planted bug: a one-sequence none step replays SBO", G,
           "    d = state.decision()\n    if d is not None:\n        return d\n",
           "    d = state.decision()\n    if d is not None:\n"
           "        if d.mode == Mode.NONE and forward_batch.batch_size == 1:\n"
           "            return d._replace(mode=Mode.SBO)\n        return d\n", e2e=True),
]

GO = "sglang_overlap/sglang/decode_cuda_graph_runner.py"
RO = "sglang_overlap/sglang/model_runner.py"
DO = "sglang_overlap/sglang/dp_attn.py"
OLD = [
    Mutant("M1", "graph choice ignores the decision", GO,
           '    return "sbo" if state.sbo_active() else "none"',
           '    return "sbo" if state.settings().enable_single_batch_overlap else "none"'),
    Mutant("M2", "SBO switch ignores the decision", S,
           '    return s.overlap_gating != "auto" or _step_mode in (None, "sbo")',
           "    return True"),
    Mutant("M3", "counters name another mode", RO,
           'stats.add("steps", *phase_mode, runner)',
           'stats.add("steps", phase_mode[0], "none", runner)'),
    Mutant("M4", "timing cell of another mode", RT,
           "cell = cell_index(decision.phase, decision.bucket, decision.mode)",
           'cell = cell_index(decision.phase, decision.bucket, "none")'),
    Mutant("M5", "decision not handed to the forward", DO,
           "    state.set_step_mode(decision.mode)\n", "    state.set_step_mode(None)\n"),
    Mutant("M6", "a handed decision is not consumed", RT,
           "        cell, self.pending = self.pending, None\n", "        cell = self.pending\n"),
    Mutant("M7", "SGLang's TBO split kept whatever the mode", DO,
           '    if decision.mode != "tbo":\n', "    if False:\n"),
    Mutant("M8", "graph key does not name the mode", GO,
           "    if mode is None or not runner_modes(self):\n", "    if True:\n"),
    Mutant("M9", "a graph set captured as another mode", GO,
           "        state.set_step_mode(mode)\n", '        state.set_step_mode("none")\n'),
    Mutant("M10", "a draft model's forward taken as the step", RO,
           "    if self.is_draft_worker:\n        return orig(self, forward_batch, *args, **kwargs)"
           "\n    phase_mode",
           "    if False:\n        return orig(self, forward_batch, *args, **kwargs)\n"
           "    phase_mode"),
    Mutant("M11", "a follower times its steps", RT,
           "        self.pending = cell if self.source else None",
           "        self.pending = cell"),
    Mutant("M12", "an undecided step keeps the last decision", DO,
           "        state.set_step_mode(None)  # undecided", "        pass  # undecided"),
    Mutant("M14", "SGLang's own rule: SBO before the split", GO,
           '    if forward_batch.can_run_tbo:\n        return "tbo"\n'
           '    return "sbo" if state.sbo_active() else "none"',
           '    if state.sbo_active():\n        return "sbo"\n'
           '    return "tbo" if forward_batch.can_run_tbo else "none"'),
    Mutant("M15", "the runner's TBO switch not following the mode", GO,
           'runner.enable_two_batch_overlap = saved_tbo and mode == "tbo"',
           "runner.enable_two_batch_overlap = saved_tbo"),
    Mutant("M16", "a replay outside the step's mode", GO,
           "    with _as_mode(self, step_graph_mode(forward_batch)):\n"
           "        return orig(self, forward_batch, *args, **kwargs)",
           "    with contextlib.nullcontext():\n"
           "        return orig(self, forward_batch, *args, **kwargs)"),
    Mutant("M17", "the GPU issue's planted bug: a one-sequence none step replays SBO", GO,
           '    return "sbo" if state.sbo_active() else "none"',
           '    return "sbo" if state.sbo_active() or forward_batch.batch_size == 1 else "none"',
           e2e=True),
]


def run(tree: Path, mutant: Mutant, tests: list[str]) -> tuple[bool, float]:
    """(killed, seconds): apply `mutant` in `tree`, run `tests`, restore the file."""
    path = tree / mutant.file
    text = path.read_text()
    if text.count(mutant.before) != 1:
        raise SystemExit(f"{mutant.id}: the text to mutate is not in {mutant.file} exactly once")
    path.write_text(text.replace(mutant.before, mutant.after))
    t0 = time.time()
    try:
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                             *tests], cwd=tree, capture_output=True, check=False).returncode
    finally:
        subprocess.run(["git", "checkout", "--", mutant.file], cwd=tree, check=True)
    return rc != 0, time.time() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tree", type=Path, default=ROOT)
    ap.add_argument("--old", action="store_true", help="the mutants of the tree before (33729e2)")
    ap.add_argument("--e2e", action="store_true", help="also the mutants only servers kill")
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    mutants = [m for m in (OLD if args.old else NEW)
               if (args.only is None or m.id in args.only) and (args.e2e or not m.e2e)]
    unit = [*UNIT, "tests/test_mode_literals.py"] if not args.old else list(UNIT)
    return report(args.tree, mutants, lambda m: E2E if m.e2e else unit)


def report(tree: Path, mutants: list[Mutant], tests: Callable[[Mutant], list[str]]) -> int:
    """Run each mutant against `tests(mutant)`, print killed / survived per mutant and the
    score; 0 when every mutant was killed, else 1."""
    killed = 0
    for m in mutants:
        dead, secs = run(tree, m, tests(m))
        killed += dead
        print(f"{m.id:<4} {'killed  ' if dead else 'SURVIVED'} {secs:6.0f} s  {m.what}", flush=True)
    print(f"{killed}/{len(mutants)} killed")
    return 0 if killed == len(mutants) else 1


if __name__ == "__main__":
    raise SystemExit(main())
