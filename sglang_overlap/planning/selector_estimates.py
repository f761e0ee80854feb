"""What the mode selector believes a mode costs at a load: the measured mean where the load's
bucket has measured it, else the prior carried over from what other buckets measured.

    estimate(mode) = measured mean                   if this bucket measured it
                   = prior(mode) x correction(mode, bucket) x calibration   otherwise

correction(phase, mode, bucket): geometric mean, over the buckets nearest to `bucket` in load
among those that measured both (both sides at an equal distance), of measured(mode) /
measured(none) over the prior's same ratio (none measured: 1): what a mode's ratio to none was
at the nearest loads measured, since it moves with the load (TBO loses at small batches and
wins at large ones). calibration: this bucket's measured / corrected-prior ratio over the modes
it measured (none measured: 1).

Measurements enter only through `merge_cells`, with the same cells at the same step on every
rank, so every rank holds the same table. A refreshing cell (`start_refresh`) collects
`min_trials` new measurements before they replace its old ones.
Plain Python; mypy --strict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sglang_overlap.modes import PHASES, SELECTOR_MODES, Mode, Phase
from sglang_overlap.planning.step_table import Cell, StepTable, bucket_of, cell_index

OFFSET = {m: i for i, m in enumerate(SELECTOR_MODES)}  # a mode's cell: its bucket's base + this
_PREFILL_BASE = cell_index(Phase.PREFILL, 0, Mode.NONE)  # bases below it are decode buckets


class Estimates:
    """The shared step-time table and what it teaches about the prior."""

    def __init__(self, min_trials: int, max_count: int) -> None:
        self.min_trials = min_trials
        self.max_count = max_count
        self.table = StepTable()
        self.fresh: dict[int, Cell] = {}  # refreshing cell -> its new (cell, count, total, squares)
        self._prior_ratio: dict[int, dict[Mode, float]] = {}  # base -> prior(m) / prior(none)
        self._correction: dict[Phase, dict[Mode, float]] = {p: {} for p in PHASES}
        # phase -> mode -> bucket -> log(measured ratio / prior ratio)
        self._logs: dict[Phase, dict[Mode, dict[int, float]]] = {p: {} for p in PHASES}
        self._near: dict[tuple[Phase, Mode, int], float] = {}  # correction() at a bucket, cached

    def correction(self, phase: Phase, mode: Mode, bucket: int | None = None) -> float | None:
        """measured / predicted of `mode` relative to none at the buckets nearest to `bucket`
        that measured it (None: over every such bucket); None where none measured it."""
        if bucket is None:
            return self._correction[phase].get(mode)
        key = (phase, mode, bucket)
        if key not in self._near:
            logs = self._logs[phase].get(mode)
            if not logs:
                return None
            d = min(abs(b - bucket) for b in logs)
            near = [v for b, v in logs.items() if abs(b - bucket) == d]
            self._near[key] = math.exp(sum(near) / len(near))
        return self._near[key]

    def corrections(self, phase: Phase) -> Mapping[Mode, float]:
        """mode -> its correction over every bucket that measured it (the modes measured)."""
        return self._correction[phase]

    def note_prior(self, base: int, prior: Mapping[Mode, float]) -> None:
        """Remember the prior's ratios at bucket `base` (once), for the corrections."""
        if base not in self._prior_ratio:
            none = prior.get(Mode.NONE, 0.0)
            self._prior_ratio[base] = {m: t / none for m, t in prior.items()
                                       if m != Mode.NONE and none > 0}

    def start_refresh(self, cell: int) -> None:
        self.fresh.setdefault(cell, (cell, 0, 0, 0))

    def merge_cells(self, cells: Sequence[Cell]) -> None:
        """Add (cell, count, total us, squares us^2) cells (`StepTable.take`); same cells, same
        step, on every rank."""
        if not cells:
            return
        if self.fresh:
            kept = []
            for c in cells:
                if c[0] in self.fresh:
                    self._refreshed(*c)
                else:
                    kept.append(c)
            cells = kept
        self.table.add_cells(cells, self.max_count)
        self._update_corrections()

    def _refreshed(self, cell: int, count: int, total: int, squares: int) -> None:
        _, n, t, q = self.fresh[cell]
        new = (cell, n + count, t + total, q + squares)
        if new[1] < self.min_trials:
            self.fresh[cell] = new
        else:
            del self.fresh[cell]
            self.table.take((cell,))
            self.table.add_cells((new,), self.max_count)

    def _update_corrections(self) -> None:
        counts, totals = self.table.counts, self.table.totals
        self._logs = {p: {} for p in PHASES}
        self._near = {}
        for base, ratios in self._prior_ratio.items():
            n_none = counts[base]
            if not n_none:
                continue
            phase = Phase.DECODE if base < _PREFILL_BASE else Phase.PREFILL
            none_us = totals[base] / n_none
            for m, prior_ratio in ratios.items():
                cell = base + OFFSET[m]
                n = counts[cell]
                if n and none_us > 0 and prior_ratio > 0 and totals[cell] > 0:
                    measured_ratio = totals[cell] / n / none_us
                    log = math.log(measured_ratio / prior_ratio)
                    self._logs[phase].setdefault(m, {})[bucket_of(base)] = log
        self._correction = {phase: {m: math.exp(sum(v.values()) / len(v))
                                    for m, v in by_mode.items()}
                            for phase, by_mode in self._logs.items()}

    def typical(self, cell: int) -> float | None:
        """The mean step time (us) of `cell`, or where it holds nothing, the fastest mean of
        its bucket's cells; None where the bucket measured nothing."""
        own = self.table.mean(cell)
        if own is not None:
            return own
        base = cell - cell % len(SELECTOR_MODES)
        means = [x for i in range(len(SELECTOR_MODES))
                 if (x := self.table.mean(base + i)) is not None]
        return min(means, default=None)

    def estimate(self, base: int, prior: Mapping[Mode, float], candidates: Sequence[Mode],
                 phase: Phase) -> tuple[dict[Mode, float], frozenset[Mode]]:
        """(us per candidate, the measured ones) at bucket `base`."""
        counts, totals = self.table.counts, self.table.totals
        out: dict[Mode, float] = {}
        for m in candidates:
            cell = base + OFFSET[m]
            n = counts[cell]
            if n:
                out[m] = totals[cell] / n
        measured = frozenset(out)
        if len(out) == len(candidates):
            return out, measured
        bucket = bucket_of(base)
        corrected = {m: prior[m] * (self.correction(phase, m, bucket) or 1.0) for m in candidates}
        scale = 1.0
        if out:
            predicted = sum(corrected[m] for m in out)
            scale = sum(out.values()) / predicted if predicted > 0 else 1.0
        return {m: out[m] if m in out else corrected[m] * scale for m in candidates}, measured
