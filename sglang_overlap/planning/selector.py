"""The mode selector (--overlap-gating auto): per step, the enabled overlap mode estimated
fastest at this load.

Inputs, identical on every rank: the phase, every DP rank's token count and the modes that can
run this step (`decide`), and the ranks' summed measurements, merged at the same step
everywhere (`merge_cells`). The selector's state changes only as a function of that sequence,
so ranks that start together choose the same mode step after step (their all-to-alls pair up).

Estimates: `selector_estimates.py`; exploration and refresh: `selector_exploration.py`.
Hysteresis: the selector leaves its current mode only for one estimated at least `hysteresis`
(a fraction) faster, so a load at a break-even point does not flap, and only for a lead of at
least `confidence` standard errors of the current mode's mean at this load (`StepTable.spread`):
while a few noisy or spiked steps make that mean uncertain, the current mode keeps running and
so is measured further. Only the current mode's error counts: a challenger's is resolved by
switching to it, which measures it.
Spikes: a measured step is clipped at `clip` x its cell's mean before it enters a table
(`clip`, called by the runtime that times the steps), so one host hiccup measured at 4x counts
as 1.5x.
Plain Python; mypy --strict.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_overlap.modes import TIE_ORDER, Mode, Phase, StepDecision, phase_of
from sglang_overlap.planning.cost.prior import Prior
from sglang_overlap.planning.selector_estimates import Estimates
from sglang_overlap.planning.selector_exploration import Exploration
from sglang_overlap.planning.step_table import Cell, StepTable, cell_index, measure_bucket

logger = logging.getLogger("sglang_overlap.selector")

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
    """Raise ValueError unless `trials` is an integer in [0, 100]."""
    if not (isinstance(trials, int) and not isinstance(trials, bool) and 0 <= trials <= 100):
        raise ValueError(f"{TRIALS_FLAG} must be an integer in [0, 100] (got {trials!r})")


@dataclass(frozen=True)
class SelectorConfig:
    hysteresis: float = 0.03
    min_trials: int = 3  # times each candidate runs in a bucket before the estimates decide
    explore_share: float = 0.05  # explored steps stay at most this share of the phase's steps
    refresh_first: int = 64  # first re-try of a mode not chosen for this many of a bucket's steps
    refresh_every: int = 2000  # the re-try gap doubles up to this (0: no re-tries)
    max_count: int = 64  # measurements per cell before older ones fade (StepTable cap)
    explore_margin: float = 0.10  # with a known correction, explore only within this of the best
    confidence: float = 1.0  # leave the current mode only for a lead of this x its mean's error
    clip: float = 1.5  # a step counts at most this x its cell's mean (`ModeSelector.clip`; 0: off)

    def __post_init__(self) -> None:
        check_hysteresis(self.hysteresis)
        check_explore_share(self.explore_share)
        check_trials(self.min_trials)
        if not (self.confidence >= 0 and (self.clip == 0 or self.clip >= 1)):
            raise ValueError(f"SelectorConfig: confidence >= 0 and clip 0 (off) or >= 1 (got "
                             f"{self.confidence}, {self.clip})")
        if (self.refresh_every < 0 or self.refresh_first < 1 or self.max_count < 1
                or self.explore_margin < 0):
            raise ValueError(f"SelectorConfig: refresh_every >= 0, refresh_first >= 1, "
                             f"max_count >= 1 and explore_margin >= 0 (got {self.refresh_every}, "
                             f"{self.refresh_first}, {self.max_count}, {self.explore_margin})")


class ModeSelector:
    """Chooses a mode per step from shared data; one instance per rank, fed the same inputs."""

    def __init__(self, prior: Prior, config: SelectorConfig | None = None) -> None:
        self.prior = prior
        self.config = config or SelectorConfig()
        self.enabled = prior.enabled
        self._estimates = Estimates(self.config.min_trials, self.config.max_count)
        self.exploration = Exploration(self.config, self._estimates)
        self.steps = 0
        self.chosen: dict[tuple[Phase, Mode], int] = {}  # (phase, mode) -> steps it ran
        self._current: dict[Phase, Mode] = {}  # phase -> the mode hysteresis holds on to
        self._last: dict[Phase, tuple[Mode, bool]] = {}  # phase -> (mode, explored) last step

    @property
    def table(self) -> StepTable:
        """The shared measurements (only `merge_cells` changes them)."""
        return self._estimates.table

    @property
    def explored(self) -> int:
        """Steps run to measure a mode rather than on the estimates, both phases."""
        return sum(self.exploration.phase_explored.values())

    def merge_cells(self, cells: Sequence[Cell]) -> None:
        """All ranks' summed new measurements as (cell, count, total us, squares us^2) cells
        (`StepTable.take`); call it with the same cells at the same step on every rank."""
        self._estimates.merge_cells(cells)

    def clip(self, cell: int, us: float) -> float:
        """A step of `us` microseconds measured into `cell` (`decide`'s `cell`), as it should
        enter a step table: at most `clip` x the cell's mean, or where the cell holds nothing
        yet, x the fastest mean measured in its bucket (nothing measured there, or clip 0:
        `us` unchanged). One host hiccup then weighs like a step 1.5x slower, not 4x, so it
        cannot hand a bucket to the slower mode on its own. Reads only the shared table; a
        rank clips its own steps before they are summed, so every rank still merges the same
        cells."""
        if not self.config.clip:
            return us
        ceiling = self._estimates.typical(cell)
        return us if ceiling is None else min(us, self.config.clip * ceiling)

    def correction(self, phase: Phase, mode: Mode, bucket: int | None = None) -> float | None:
        """`mode`'s measured / predicted ratio to none, carried to load `bucket` from the
        nearest buckets that measured it (None: over all of them); None: never measured."""
        return self._estimates.correction(phase, mode, bucket)

    def estimates(self, phase: Phase, busiest: int, mean: float,
                  candidates: Sequence[Mode]) -> tuple[dict[Mode, float], frozenset[Mode]]:
        """(us per candidate, the measured ones) at this load."""
        base = cell_index(phase, measure_bucket(busiest), Mode.NONE)
        return self._estimates.estimate(base, self.prior.predictions(phase, busiest, mean),
                                        candidates, phase)

    def decide(self, phase: Phase | str, global_tokens_per_rank: Sequence[int],
               available: frozenset[Mode] | None = None) -> StepDecision:
        """The decision for this step. `global_tokens_per_rank`: every DP rank's token count
        (the all-gathered `global_num_tokens`), identical on all ranks; `available`: the modes
        that can run this step (None: every candidate), identical on all ranks. The decision's
        `cell` is the step table cell its time goes into (None for an idle step)."""
        try:
            phase = phase_of(phase)
        except ValueError as exc:
            raise ValueError(f"ModeSelector.decide: {exc}") from None
        busiest = max(global_tokens_per_rank, default=0)
        if busiest <= 0:
            return StepDecision(Mode.NONE, phase, step=self.steps,
                                why="idle step: every rank has 0 tokens")
        mean = sum(global_tokens_per_rank) / len(global_tokens_per_rank)
        candidates = self.prior.candidates(phase)
        if available is not None:
            candidates = tuple(m for m in candidates if m == Mode.NONE or m in available)
        self.steps += 1
        self.exploration.phase_steps[phase] += 1
        bucket = measure_bucket(busiest)
        base = cell_index(phase, bucket, Mode.NONE)
        prior = self.prior.predictions(phase, busiest, mean)
        self._estimates.note_prior(base, prior)
        estimates, measured = self._estimates.estimate(base, prior, candidates, phase)
        chosen, why = self._choose(phase, estimates, bucket)
        explore = self.exploration.pick(phase, base, chosen, estimates)
        if explore is not None:
            chosen, why = explore
        self.exploration.count(phase, base, chosen, explore is not None)
        key = (phase, chosen)
        self.chosen[key] = self.chosen.get(key, 0) + 1
        last = (chosen, explore is not None)
        changed = self._last.get(phase) != last
        if changed:
            self._last[phase] = last
        decision = StepDecision(chosen, phase, cell_index(phase, bucket, chosen), why,
                                "selector", estimates, measured, busiest, mean, bucket,
                                self.steps, explore is not None, changed)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("mode selector: %s", decision.reason)
        return decision

    def _choose(self, phase: Phase, estimates: Mapping[Mode, float], bucket: int
                ) -> tuple[Mode, str]:
        best = min(estimates, key=lambda m: (estimates[m], TIE_ORDER[m]))
        current = self._current.get(phase)
        if current is None or current not in estimates:
            if current is None:
                self._current[phase] = best
                return best, "first step of this phase"
            return best, f"{current} cannot run this step"
        if best == current:
            return current, "still the fastest"
        cfg = self.config
        if estimates[best] > estimates[current] * (1.0 - cfg.hysteresis):
            return current, f"{best} is within the {cfg.hysteresis:.0%} hysteresis"
        # the current mode's own mean is uncertain (noisy or spiked steps): keep running it,
        # which measures it further, rather than leave it on its noise
        error = self.table.spread(cell_index(phase, bucket, current)) or 0.0
        if estimates[current] - estimates[best] < cfg.confidence * error:
            return current, (f"{best} leads by less than {cfg.confidence:g} standard error(s) "
                             f"of {current}'s mean ({error:.0f} us)")
        self._current[phase] = best
        return best, f"beats {current} by at least {cfg.hysteresis:.0%}"


__all__ = ["ModeSelector", "SelectorConfig", "check_explore_share",
           "check_hysteresis", "check_trials"]
