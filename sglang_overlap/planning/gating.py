"""Automatic gating (--overlap-gating auto): per step, run the enabled mode measured fastest.

The prior (`cost/prior.py`: the cost model for the served model, or a flat prior where no
hardware profile applies) ranks the modes before anything is measured; measured step times
(`step_table.py`) replace it cell by cell as they arrive. Per step, for the bucket of the
busiest rank's token count:

    estimate(mode) = measured mean                  if this bucket has measured it
                   = prior'(mode) x calibration     otherwise

where prior'(mode) = prior(mode) x correction(phase, mode): the geometric mean, over the buckets
that measured both, of measured(mode) / measured(none) divided by the prior's same ratio (1 until
such a bucket exists), and calibration is the measured / prior' ratio of the modes this bucket
has measured (1 if none). So what one bucket learns about a mode carries to its neighbours.

Exploration: a candidate chosen fewer than `min_trials` times in a bucket is run instead of the
estimate's choice, most promising first, while explored steps stay at most `explore_share` of
the phase's steps (each phase its own budget: prefill steps are fewer and longer, so decode's
many steps must not pay for exploring prefill). Once other buckets have measured a mode (its
correction is known), it is explored only where its estimate is within `explore_margin` of the
best: a mode measured clearly slower elsewhere is not paid for again in every bucket. Trials
count the gate's own choices, so exploration is a function of the inputs only.

Refresh: a mode the bucket has not chosen for a while is measured again, because what it was
measured at may no longer hold: the times of a mode the gate stopped choosing are frozen at the
moment it stopped, while the chosen mode's follow the server (other traffic, longer contexts,
a busy host). The first re-try comes `refresh_first` of the bucket's steps after the mode last
ran, each later one after twice the previous gap, at most `refresh_every` (0: never). A refresh
runs the mode `min_trials` times (inside the exploration share, whatever its estimate; with no
trials there is no refresh either), and once that many fresh measurements have arrived they
replace the cell's old ones: the two modes are then compared on times taken close together, not
on a stale record.

Same decision on every rank: every data-parallel rank must run the same mode in the same step
(their all-to-alls pair up). `decide` sees only what all ranks share after SGLang's DP sync (the
phase, every rank's token count, which modes can run this step), and the measurements enter only
through `merge`, which the glue calls with the ranks' all-reduced sums at the same step on every
rank. The rest of the state (hysteresis, trials) changes only as a function of that shared
sequence, so ranks that start together decide the same modes, step after step.

Hysteresis: the gate leaves its current mode only for one estimated at least `hysteresis` (a
fraction) faster, so a workload hovering at a break-even point does not flap.
Plain Python; mypy --strict.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

from sglang_overlap.planning.cost.prior import (
    ENABLABLE,
    CostModelPrior,
    FlatPrior,
    Prior,
    token_bucket,
)
from sglang_overlap.planning.step_table import (
    MODES,
    StepTable,
    cell_index,
    measure_bucket,
    vector_cells,
)

logger = logging.getLogger("sglang_overlap.gating")

Mode = Literal["none", "tbo", "sbo", "two_chunk"]
GatePhase = Literal["decode", "prefill"]
_ORDER = {"none": 0, "tbo": 1, "sbo": 2, "two_chunk": 3}
_OFFSET = {m: i for i, m in enumerate(MODES)}  # a mode's cell is its bucket's base + this
_PREFILL_BASE = cell_index("prefill", 0, "none")  # bases below it are decode buckets
HYSTERESIS_FLAG = "--overlap-gating-hysteresis"
EXPLORE_FLAG = "--overlap-gating-explore"
TRIALS_FLAG = "--overlap-gating-trials"


def check_hysteresis(hysteresis: float) -> None:
    """Raise ValueError unless 0 <= hysteresis <= 0.5."""
    if not (isinstance(hysteresis, (int, float)) and 0.0 <= hysteresis <= 0.5):
        raise ValueError(f"{HYSTERESIS_FLAG} must be in [0, 0.5] (got {hysteresis!r})")


def check_explore_share(share: float) -> None:
    """Raise ValueError unless 0 <= share <= 0.5."""
    if not (isinstance(share, (int, float)) and 0.0 <= share <= 0.5):
        raise ValueError(f"{EXPLORE_FLAG} must be in [0, 0.5] (got {share!r}); 0 turns "
                         "exploration off (the prior then decides until a mode is measured)")


def check_trials(trials: int) -> None:
    if not (isinstance(trials, int) and not isinstance(trials, bool) and 0 <= trials <= 100):
        raise ValueError(f"{TRIALS_FLAG} must be an integer in [0, 100] (got {trials!r})")


@dataclass(frozen=True)
class GateConfig:
    hysteresis: float = 0.03
    min_trials: int = 3  # times each candidate runs in a bucket before the estimates decide
    explore_share: float = 0.05  # explored steps stay at most this share of the phase's steps
    refresh_first: int = 64  # first re-try of a mode not chosen for this many of a bucket's steps
    refresh_every: int = 2000  # the re-try gap doubles up to this (0: no re-tries)
    max_count: int = 64  # measurements per cell before older ones fade (StepTable.cap)
    explore_margin: float = 0.10  # with a known correction, explore only within this of the best

    def __post_init__(self) -> None:
        check_hysteresis(self.hysteresis)
        check_explore_share(self.explore_share)
        check_trials(self.min_trials)
        if (self.refresh_every < 0 or self.refresh_first < 1 or self.max_count < 1
                or self.explore_margin < 0):
            raise ValueError(f"GateConfig: refresh_every >= 0, refresh_first >= 1, max_count "
                             f">= 1 and explore_margin >= 0 (got {self.refresh_every}, "
                             f"{self.refresh_first}, {self.max_count}, {self.explore_margin})")


class GateDecision(NamedTuple):
    """One step's decision (a NamedTuple: built every step, cheaply)."""

    mode: Mode
    estimates: Mapping[str, float]  # us per candidate: measured, or the calibrated prior
    measured: frozenset[str] = frozenset()  # the candidates whose estimate is measured
    phase: str = "decode"
    busiest: int = 0
    mean: float = 0.0
    bucket: int = 0
    step: int = 0  # the gate's step counter (same on every rank)
    why: str = ""
    explored: bool = False
    changed: bool = False  # mode, or being an exploration, differs from the phase's last step

    @property
    def predicted_us(self) -> Mapping[str, float]:
        return self.estimates

    @property
    def reason(self) -> str:
        times = ", ".join(f"{m}={t / 1e3:.3f}ms{'' if m in self.measured else '(prior)'}"
                          for m, t in sorted(self.estimates.items()))
        return (f"step {self.step} {self.phase} busiest={self.busiest} mean={self.mean:.1f} "
                f"tokens/rank: {self.mode} ({self.why}); {times}")


class Gate:
    """Chooses a mode per step from shared data; one instance per rank, fed the same inputs."""

    def __init__(self, prior: Prior, config: GateConfig | None = None) -> None:
        self.prior = prior
        self.config = config or GateConfig()
        self.enabled = prior.enabled
        self.table = StepTable()  # the shared measurements (only `merge` changes it)
        self.steps = 0
        self._phase_steps = {"decode": 0, "prefill": 0}
        self._phase_explored = {"decode": 0, "prefill": 0}
        self.chosen: dict[tuple[str, str], int] = {}  # (phase, mode) -> steps it ran
        self._current: dict[str, str] = {}
        self._last: dict[str, tuple[str, bool]] = {}  # phase -> (mode, explored) last step
        self._trials: dict[int, int] = {}  # cell -> times chosen
        self._last_trial: dict[int, int] = {}  # cell -> the bucket's step when last chosen
        self._bucket_steps: dict[int, int] = {}  # cell of mode "none" -> steps in the bucket
        self._gap: dict[int, int] = {}  # cell -> bucket steps until its next refresh
        self._fresh: dict[int, tuple[int, int]] = {}  # refreshing cell -> (count, total us) so far
        self._prior_ratio: dict[int, dict[str, float]] = {}  # bucket base -> prior(m) / prior(none)
        self._correction: dict[str, dict[str, float]] = {"decode": {}, "prefill": {}}

    @property
    def explored(self) -> int:
        """Steps run to measure a mode rather than on the estimates, both phases."""
        return sum(self._phase_explored.values())

    def merge(self, vector: Sequence[int]) -> None:
        """Add all ranks' summed new measurements (`StepTable.to_vector` layout); call it at
        the same step on every rank."""
        self.merge_cells(vector_cells(vector))

    def merge_cells(self, cells: Sequence[tuple[int, int, int]]) -> None:
        """`merge` in sparse form: (cell, count, total us) triples (`StepTable.take`); call it
        with the same triples at the same step on every rank."""
        if not cells:
            return
        if self._fresh:
            kept = []
            for c in cells:
                if c[0] in self._fresh:
                    self._refreshed(*c)
                else:
                    kept.append(c)
            cells = kept
        self.table.add_cells(cells, self.config.max_count)
        self._update_corrections()

    def _refreshed(self, cell: int, count: int, total: int) -> None:
        """A refreshing cell's new measurements: collected until `min_trials` have arrived,
        then they replace the cell's old ones."""
        n, t = self._fresh[cell]
        n, t = n + count, t + total
        if n < self.config.min_trials:
            self._fresh[cell] = (n, t)
        else:
            del self._fresh[cell]
            self.table.take((cell,))
            self.table.add_cells(((cell, n, t),), self.config.max_count)

    def correction(self, phase: str, mode: str) -> float | None:
        """measured / predicted of `mode` relative to none, from other buckets (None: unknown)."""
        return self._correction[phase].get(mode)

    def _update_corrections(self) -> None:
        counts, totals = self.table.counts, self.table.totals
        logs: dict[tuple[str, str], list[float]] = {}
        for base, ratios in self._prior_ratio.items():
            n_none = counts[base]
            if not n_none:
                continue
            phase = "decode" if base < _PREFILL_BASE else "prefill"
            none_us = totals[base] / n_none
            for m, prior_ratio in ratios.items():
                cell = base + _OFFSET[m]
                n = counts[cell]
                if n and none_us > 0 and prior_ratio > 0 and totals[cell] > 0:
                    measured_ratio = totals[cell] / n / none_us
                    logs.setdefault((phase, m), []).append(math.log(measured_ratio / prior_ratio))
        for phase in ("decode", "prefill"):
            self._correction[phase] = {m: math.exp(sum(v) / len(v))
                                       for (p, m), v in logs.items() if p == phase}

    def estimates(self, phase: str, busiest: int, mean: float,
                  candidates: Sequence[str]) -> tuple[dict[str, float], frozenset[str]]:
        """(us per candidate, the measured ones) for this load."""
        base = cell_index(phase, measure_bucket(busiest), "none")
        return self._estimates(base, self.prior.predictions(phase, busiest, mean), candidates,
                               self._correction[phase])

    def _estimates(self, base: int, prior: Mapping[str, float], candidates: Sequence[str],
                   correction: Mapping[str, float]) -> tuple[dict[str, float], frozenset[str]]:
        counts, totals = self.table.counts, self.table.totals
        out: dict[str, float] = {}
        for m in candidates:
            cell = base + _OFFSET[m]
            n = counts[cell]
            if n:
                out[m] = totals[cell] / n
        measured = frozenset(out)
        if len(out) == len(candidates):
            return out, measured
        corrected = {m: prior[m] * correction.get(m, 1.0) for m in candidates} if correction \
            else prior
        scale = 1.0
        if out:
            predicted = sum(corrected[m] for m in out)
            scale = sum(out.values()) / predicted if predicted > 0 else 1.0
        return {m: out[m] if m in out else corrected[m] * scale for m in candidates}, measured

    def decide(self, phase: GatePhase, global_tokens_per_rank: Sequence[int],
               available: frozenset[str] | None = None) -> GateDecision:
        """The mode for this step. `global_tokens_per_rank`: every DP rank's token count (the
        all-gathered `global_num_tokens`), identical on all ranks; `available`: the modes that
        can run this step (None: every candidate), identical on all ranks."""
        if phase != "decode" and phase != "prefill":
            raise ValueError(f"Gate.decide: phase must be decode or prefill (got {phase!r})")
        busiest = max(global_tokens_per_rank, default=0)
        if busiest <= 0:
            return GateDecision("none", {}, phase=phase, step=self.steps,
                                why="idle step: every rank has 0 tokens")
        mean = sum(global_tokens_per_rank) / len(global_tokens_per_rank)
        candidates = self.prior.candidates(phase)
        if available is not None:
            candidates = tuple(m for m in candidates if m == "none" or m in available)
        self.steps += 1
        self._phase_steps[phase] += 1
        bucket = measure_bucket(busiest)
        base = cell_index(phase, bucket, "none")
        prior = self.prior.predictions(phase, busiest, mean)
        if base not in self._prior_ratio:
            none = prior.get("none", 0.0)
            self._prior_ratio[base] = {m: t / none for m, t in prior.items()
                                       if m != "none" and none > 0}
        correction = self._correction[phase]
        estimates, measured = self._estimates(base, prior, candidates, correction)
        chosen, why = self._choose(phase, estimates)
        explore = self._exploration(phase, base, chosen, estimates, correction)
        if explore is not None:
            self._phase_explored[phase] += 1
            chosen, why = explore
        self._count_trial(base, chosen, explore is not None)
        key = (phase, chosen)
        self.chosen[key] = self.chosen.get(key, 0) + 1
        last = (chosen, explore is not None)
        changed = self._last.get(phase) != last
        if changed:
            self._last[phase] = last
        decision = GateDecision(chosen, estimates, measured, phase, busiest,  # type: ignore[arg-type]
                                mean, bucket, self.steps, why, explore is not None, changed)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("overlap gating: %s", decision.reason)
        return decision

    def _choose(self, phase: str, estimates: Mapping[str, float]) -> tuple[str, str]:
        best = min(estimates, key=lambda m: (estimates[m], _ORDER[m]))
        current = self._current.get(phase)
        if current is None or current not in estimates:
            if current is None:
                self._current[phase] = best
                return best, "first step of this phase"
            return best, f"{current} cannot run this step"
        if best == current:
            return current, "still the fastest"
        if estimates[best] <= estimates[current] * (1.0 - self.config.hysteresis):
            self._current[phase] = best
            return best, f"beats {current} by more than {self.config.hysteresis:.0%}"
        return current, f"{best} is within the {self.config.hysteresis:.0%} hysteresis"

    def _exploration(self, phase: str, base: int, chosen: str, estimates: Mapping[str, float],
                     correction: Mapping[str, float]) -> tuple[str, str] | None:
        """(the mode to measure instead of `chosen`, why), or None."""
        cfg = self.config
        if self._phase_explored[phase] + 1 > cfg.explore_share * self._phase_steps[phase]:
            return None  # the budget first: the common case costs one comparison
        if cfg.min_trials <= 0 or len(estimates) < 2:
            return None
        now = self._bucket_steps.get(base, 0) + 1  # this step's number in the bucket
        best = min(estimates.values())
        due = []
        stale: str | None = None
        for m in estimates:
            if m == chosen:
                continue
            cell = base + _OFFSET[m]
            last = self._last_trial.get(cell)
            if (last is not None and cfg.refresh_every > 0 and stale is None
                    and now - last >= self._refresh_gap(cell)):
                stale = m  # ran here before, not for a while: measure it again
            elif self._trials.get(cell, 0) < cfg.min_trials and (
                    cell in self._fresh or m not in correction
                    or estimates[m] <= best * (1.0 + cfg.explore_margin)):
                due.append(m)
        if due:
            return min(due, key=lambda m: (estimates[m], _ORDER[m])), \
                "exploring: measured too few times here"
        if stale is None:
            return None
        cell = base + _OFFSET[stale]
        self._gap[cell] = min(2 * self._refresh_gap(cell), cfg.refresh_every)
        self._trials[cell] = 0  # the refresh runs min_trials times, like a first visit
        self._fresh.setdefault(cell, (0, 0))
        return stale, f"refreshing: not run here for {now - self._last_trial[cell]} steps"

    def _refresh_gap(self, cell: int) -> int:
        """The bucket steps `cell`'s mode may go unchosen before it is refreshed."""
        return self._gap.get(cell, min(self.config.refresh_first, self.config.refresh_every))

    def _count_trial(self, base: int, mode: str, explored: bool) -> None:
        now = self._bucket_steps.get(base, 0) + 1
        self._bucket_steps[base] = now
        cell = base + _OFFSET[mode]
        self._trials[cell] = self._trials.get(cell, 0) + 1
        self._last_trial[cell] = now
        if not explored and self._gap:
            self._gap.pop(cell, None)  # chosen on its estimate: re-tries start short again


__all__ = ["ENABLABLE", "CostModelPrior", "FlatPrior", "Gate", "GateConfig", "GateDecision",
           "GatePhase", "Mode", "check_explore_share", "check_hysteresis", "check_trials",
           "token_bucket"]
