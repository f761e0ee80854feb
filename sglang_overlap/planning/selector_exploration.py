"""When the mode selector runs a mode to measure it instead of the estimates' choice.

Exploration: a candidate chosen fewer than `min_trials` times in a bucket runs instead, the
most promising first, while explored steps stay at most `explore_share` of the phase's steps
(each phase its own budget). Once other buckets measured a mode (its correction is known), it
is explored only within `explore_margin` of the best estimate, unless no bucket within
`NEAR_BUCKETS` of this one (a factor of two in load) ran it: a ratio measured at one load says
little about a load far from it (TBO loses at small batches and wins at large ones).

Refresh: a mode not chosen in a bucket for `refresh_first` of the bucket's steps is run again
(`min_trials` times, inside the share), each later gap twice the previous, at most
`refresh_every` (0: never; no trials: no refresh either); its new measurements then replace
the old (`Estimates.start_refresh`). Trials count the selector's own choices, so all of this
is a function of the shared inputs only.
Plain Python; mypy --strict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from sglang_overlap.modes import PHASES, TIE_ORDER, Mode, Phase
from sglang_overlap.planning.selector_estimates import OFFSET, Estimates
from sglang_overlap.planning.step_table import bucket_of

NEAR_BUCKETS = 4  # buckets per power of two of load (`step_table.measure_bucket`)


class ExploreConfig(Protocol):
    @property
    def min_trials(self) -> int: ...
    @property
    def explore_share(self) -> float: ...
    @property
    def refresh_first(self) -> int: ...
    @property
    def refresh_every(self) -> int: ...
    @property
    def explore_margin(self) -> float: ...


class Exploration:
    """Per-bucket trial counts, refresh gaps and each phase's exploration budget."""

    def __init__(self, config: ExploreConfig, estimates: Estimates) -> None:
        self.config = config
        self._estimates = estimates
        self.phase_steps = dict.fromkeys(PHASES, 0)
        self.phase_explored = dict.fromkeys(PHASES, 0)
        self._trials: dict[int, int] = {}  # cell -> times chosen
        self._last_trial: dict[int, int] = {}  # cell -> the bucket's step when last chosen
        self._bucket_steps: dict[int, int] = {}  # bucket base -> steps in the bucket
        self._gap: dict[int, int] = {}  # cell -> bucket steps until its next refresh
        self._ran: dict[tuple[Phase, Mode], set[int]] = {}  # (phase, mode) -> buckets it ran in

    def pick(self, phase: Phase, base: int, chosen: Mode, estimates: Mapping[Mode, float]
             ) -> tuple[Mode, str] | None:
        """(the mode to measure instead of `chosen`, why), or None."""
        cfg = self.config
        if self.phase_explored[phase] + 1 > cfg.explore_share * self.phase_steps[phase]:
            return None  # the budget first: the common case costs one comparison
        if cfg.min_trials <= 0 or len(estimates) < 2:
            return None
        now = self._bucket_steps.get(base, 0) + 1  # this step's number in the bucket
        best = min(estimates.values())
        correction = self._estimates.corrections(phase)
        due = []
        stale: Mode | None = None
        for m in estimates:
            if m == chosen:
                continue
            cell = base + OFFSET[m]
            last = self._last_trial.get(cell)
            if (last is not None and cfg.refresh_every > 0 and stale is None
                    and now - last >= self.refresh_gap(cell)):
                stale = m  # ran here before, not for a while: measure it again
            elif self._trials.get(cell, 0) < cfg.min_trials and (
                    cell in self._estimates.fresh or m not in correction
                    or estimates[m] <= best * (1.0 + cfg.explore_margin)
                    or not self.ran_near(phase, m, base)):
                due.append(m)
        if due:
            return min(due, key=lambda m: (estimates[m], TIE_ORDER[m])), \
                "exploring: measured too few times here"
        if stale is None:
            return None
        cell = base + OFFSET[stale]
        self._gap[cell] = min(2 * self.refresh_gap(cell), cfg.refresh_every)
        self._trials[cell] = 0  # the refresh runs min_trials times, like a first visit
        self._estimates.start_refresh(cell)
        return stale, f"refreshing: not run here for {now - self._last_trial[cell]} steps"

    def ran_near(self, phase: Phase, mode: Mode, base: int) -> bool:
        """Whether `mode` ran in a bucket of `phase` within `NEAR_BUCKETS` of bucket `base`."""
        here = bucket_of(base)
        return any(abs(b - here) <= NEAR_BUCKETS for b in self._ran.get((phase, mode), ()))

    def refresh_gap(self, cell: int) -> int:
        """The bucket steps `cell`'s mode may go unchosen before it is refreshed."""
        return self._gap.get(cell, min(self.config.refresh_first, self.config.refresh_every))

    def count(self, phase: Phase, base: int, mode: Mode, explored: bool) -> None:
        """`mode` ran in bucket `base` (explored: to measure it)."""
        self.phase_explored[phase] += explored
        now = self._bucket_steps.get(base, 0) + 1
        self._bucket_steps[base] = now
        cell = base + OFFSET[mode]
        self._trials[cell] = self._trials.get(cell, 0) + 1
        self._last_trial[cell] = now
        self._ran.setdefault((phase, mode), set()).add(bucket_of(base))
        if not explored and self._gap:
            self._gap.pop(cell, None)  # chosen on its estimate: re-tries start short again
