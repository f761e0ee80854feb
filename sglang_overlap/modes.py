"""The overlap modes, the step phases and the step's decision: the one owner of their names.

Every other module names a mode or a phase through these enums, never by a string literal (a test
reads the package's source for such literals). `Mode` and `Phase` are `StrEnum`s: a member equals
its value (`Mode.TBO == "tbo"`), prints as it, hashes as it and serializes as it, so JSON
profiles, metric labels and counters keep their plain names.

Adding a mode: a member here (and the sets below it belongs to), its cost in
`planning/cost/cost_model.py`, what the server runs for it in `sglang/upstream/`, and its flag in
`settings.py`.

Imports nothing of the package: every layer may import it. Plain Python; mypy --strict.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import NamedTuple


class Mode(enum.StrEnum):
    """How one step's MoE layers overlap communication with computation."""

    NONE = "none"
    """Serial: dispatch, experts, combine, one after the other."""
    TBO = "tbo"
    """Two micro-batches interleaved: one's all-to-all runs while the other computes."""
    SBO = "sbo"
    """One batch: the shared expert runs during dispatch-receive, and the combine sends the down
    GEMM's tiles as they finish."""
    TWO_CHUNK = "two_chunk"
    """Prefill TBO that cut one request in two (the second chunk's prefix is the first). The
    selector and the graph sets treat it as TBO; the planner and the counters name it."""


class Phase(enum.StrEnum):
    """What a step does: decode (every rank decodes or verifies drafts) or prefill (a rank
    extends)."""

    DECODE = "decode"
    PREFILL = "prefill"


class Feature(enum.StrEnum):
    """What the plugin serves, as the version guard, the models table and the refusals name it."""

    ARGS = "args"
    TBO = "tbo"
    TWO_CHUNK = "two_chunk"
    SBO = "sbo"
    GATE = "gate"
    TORCH_A2A = "torch_a2a"
    METRICS = "metrics"


PHASES: tuple[Phase, ...] = (Phase.DECODE, Phase.PREFILL)
SELECTOR_MODES: tuple[Mode, ...] = (Mode.NONE, Mode.TBO, Mode.SBO)
"""The modes the selector chooses among, in the order of the step table's cells."""
PLAN_MODES: tuple[Mode, ...] = (Mode.NONE, Mode.TBO, Mode.SBO, Mode.TWO_CHUNK)
"""The modes the cost model predicts."""
ENABLABLE: frozenset[Mode] = frozenset({Mode.TBO, Mode.SBO, Mode.TWO_CHUNK})
"""The modes a flag turns on (none always can run)."""
TIE_ORDER: Mapping[Mode, int] = {Mode.NONE: 0, Mode.TBO: 1, Mode.SBO: 2, Mode.TWO_CHUNK: 3}
"""Equal estimates go to the simpler mode (the lower number)."""
GRAPH_ORDER: tuple[Mode, ...] = (Mode.TBO, Mode.SBO, Mode.NONE)
"""The order decode graph sets are captured in, under the selector: largest first."""
SPLITS_BATCH: frozenset[Mode] = frozenset({Mode.TBO, Mode.TWO_CHUNK})
"""The modes that run a step as two micro-batches."""
CANDIDATES: Mapping[Phase, Mapping[Mode, frozenset[Mode]]] = {
    Phase.DECODE: {Mode.TBO: frozenset({Mode.TBO}), Mode.SBO: frozenset({Mode.SBO})},
    Phase.PREFILL: {Mode.TBO: frozenset({Mode.TBO, Mode.TWO_CHUNK})},
}
"""Per phase, each mode the selector may choose besides none, and the enabled modes that make it a
candidate (a prefill TBO step may cut a request in two: two-chunk is TBO's own plan per batch).
SBO needs the low-latency dispatch, which SGLang runs for decode only."""


def mode_of(value: str) -> Mode:
    """The `Mode` named `value`; ValueError naming the known modes otherwise."""
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"unknown overlap mode {value!r} (known: "
                         f"{', '.join(m.value for m in Mode)})") from None


def phase_of(value: str) -> Phase:
    """The `Phase` named `value`; ValueError naming the phases otherwise."""
    try:
        return Phase(value)
    except ValueError:
        raise ValueError(f"phase must be {' or '.join(p.value for p in Phase)} "
                         f"(got {value!r})") from None


class StepDecision(NamedTuple):
    """One step's mode, made once per step and read by every hook that acts on it: the decode
    graph set replayed, whether the MoE layers run SBO, whether SGLang splits the batch, the
    timing cell and the counters. A NamedTuple: built every step, cheaply.

    Made by the mode selector (--overlap-gating auto) for each step it decides, or, for a step it
    does not decide (no selector, or SGLang skipped its metadata sync), by `upstream_rule` from
    what SGLang runs for the batch; `source` says which.
    """

    mode: Mode
    phase: Phase
    cell: int | None = None
    """The step table's cell this step's time goes into (None: not timed)."""
    why: str = ""
    source: str = "selector"
    """"selector", "upstream" (SGLang's own rule for an undecided step) or "capture" (a graph
    captured for this mode)."""
    estimates: Mapping[Mode, float] = {}
    """Microseconds per candidate mode: measured, or the calibrated prior."""
    measured: frozenset[Mode] = frozenset()
    """The candidates whose estimate is measured."""
    busiest: int = 0
    """Tokens on the busiest rank (0: an idle step, which decides nothing)."""
    mean: float = 0.0
    """Mean tokens per rank."""
    bucket: int = 0
    """The step table's token bucket of `busiest`."""
    step: int = 0
    """The selector's step counter (the same on every rank)."""
    explored: bool = False
    """Chosen to measure the mode rather than on the estimates."""
    changed: bool = False
    """The mode, or being an exploration, differs from the phase's last decided step."""

    @property
    def reason(self) -> str:
        """One line for the logs: load, mode, why, and each candidate's estimate."""
        times = ", ".join(f"{m}={t / 1e3:.3f}ms{'' if m in self.measured else '(prior)'}"
                          for m, t in sorted(self.estimates.items()))
        return (f"step {self.step} {self.phase} busiest={self.busiest} mean={self.mean:.1f} "
                f"tokens/rank: {self.mode} ({self.why}); {times}")


def upstream_rule(phase: Phase, split: bool, sbo_enabled: bool) -> StepDecision:
    """The decision for a step no selector decided: what SGLang runs on its own. TBO (two-chunk
    included) when SGLang split the batch (`split`), else SBO when enabled, else none."""
    mode = Mode.TBO if split else Mode.SBO if sbo_enabled else Mode.NONE
    return StepDecision(mode, phase, why="SGLang's own rule (no selector decision)",
                        source="upstream")


__all__ = ["CANDIDATES", "ENABLABLE", "GRAPH_ORDER", "PHASES", "PLAN_MODES", "SELECTOR_MODES",
           "SPLITS_BATCH", "TIE_ORDER", "Feature", "Mode", "Phase", "StepDecision", "mode_of",
           "phase_of", "upstream_rule"]
