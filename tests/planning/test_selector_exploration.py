"""planning/selector_exploration.py on its own: which mode is measured instead of the choice,
why, and the refresh gaps."""

from __future__ import annotations

from dataclasses import dataclass

from sglang_overlap.planning.selector_estimates import Estimates
from sglang_overlap.planning.selector_exploration import NEAR_BUCKETS, Exploration
from sglang_overlap.planning.step_table import cell_index


@dataclass(frozen=True)
class Config:
    min_trials: int = 1
    explore_share: float = 1.0
    refresh_first: int = 10
    refresh_every: int = 80
    explore_margin: float = 0.25


def _exploration(**config: object) -> tuple[Exploration, Estimates]:
    est = Estimates(min_trials=1, max_count=64)
    return Exploration(Config(**config), est), est  # type: ignore[arg-type]


def _step(e: Exploration, bucket: int, chosen: str, estimates: dict[str, float]
          ) -> tuple[str, str] | None:
    """One decode step at `bucket`: what `pick` says, then the mode that ran is counted."""
    base = cell_index("decode", bucket, "none")
    e.phase_steps["decode"] += 1
    picked = e.pick("decode", base, chosen, estimates)
    e.count("decode", base, picked[0] if picked else chosen, picked is not None)
    return picked


def _learn_tbo_ratio(est: Estimates, bucket: int, ratio_us: int) -> None:
    base = cell_index("decode", bucket, "none")
    est.note_prior(base, {"none": 1.0, "tbo": 1.0})
    est.merge_cells([(base, 1, 1000, 1000**2),
                     (cell_index("decode", bucket, "tbo"), 1, ratio_us, ratio_us**2)])


def test_a_mode_ran_near_within_a_factor_of_two_of_load() -> None:
    e, _ = _exploration()
    base = cell_index("decode", 20, "none")
    assert not e.ran_near("decode", "tbo", base)  # never ran anywhere
    e.count("decode", base, "tbo", True)
    for bucket, near in ((20, True), (20 + NEAR_BUCKETS, True), (20 - NEAR_BUCKETS, True),
                         (21 + NEAR_BUCKETS, False), (19 - NEAR_BUCKETS, False)):
        assert e.ran_near("decode", "tbo", cell_index("decode", bucket, "none")) == near, bucket
    assert not e.ran_near("prefill", "tbo", cell_index("prefill", 20, "none"))
    assert not e.ran_near("decode", "sbo", base)


def test_a_known_slower_mode_is_explored_within_the_margin_or_far_from_where_it_ran() -> None:
    e, est = _exploration()
    assert _step(e, 20, "none", {"none": 1.0, "tbo": 2.0}) == (
        "tbo", "exploring: measured too few times here"), "unknown: tried whatever its estimate"
    _learn_tbo_ratio(est, 20, 2000)  # known: 2x none
    assert _step(e, 22, "none", {"none": 1.0, "tbo": 2.0}) is None, "near, beyond the margin"
    assert _step(e, 23, "none", {"none": 1.0, "tbo": 1.25}) == (
        "tbo", "exploring: measured too few times here"), "near, at the margin exactly"
    assert _step(e, 40, "none", {"none": 1.0, "tbo": 2.0}) == (
        "tbo", "exploring: measured too few times here"), "far from every load it ran at"


def test_refresh_after_the_gap_says_how_long_and_restarts_short_once_chosen() -> None:
    e, _ = _exploration()
    est = {"none": 1.0, "tbo": 2.0}
    cell = cell_index("decode", 5, "tbo")
    assert _step(e, 5, "none", est) == ("tbo", "exploring: measured too few times here")
    picks = [_step(e, 5, "none", est) for _ in range(10)]
    assert picks[:9] == [None] * 9
    assert picks[9] == ("tbo", "refreshing: not run here for 10 steps")
    assert e.refresh_gap(cell) == 20
    _step(e, 5, "tbo", est)  # chosen on its estimate: the next gap is the first one again
    assert e.refresh_gap(cell) == 10


def test_a_refresh_every_of_one_still_refreshes() -> None:
    e, _ = _exploration(refresh_first=1, refresh_every=1)
    est = {"none": 1.0, "tbo": 2.0}
    _step(e, 5, "none", est)  # tbo's first trial
    assert _step(e, 5, "none", est) == ("tbo", "refreshing: not run here for 1 steps")
    assert _step(e, 5, "none", est) == ("tbo", "refreshing: not run here for 1 steps")
