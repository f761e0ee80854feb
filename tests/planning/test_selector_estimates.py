"""planning/selector_estimates.py: corrections carried from the nearest measured loads, the
global correction, refreshes, and the edges of the prior (zero or missing predictions)."""

from __future__ import annotations

import pytest

from sglang_overlap.planning.selector_estimates import Estimates
from sglang_overlap.planning.step_table import cell_index

FLAT = {"none": 1.0, "tbo": 1.0}


def _measure(est: Estimates, bucket: int, times: dict[str, int],
             prior: dict[str, float] | None = None, phase: str = "decode") -> None:
    """One measurement per mode at `bucket` (integer us), after the prior was noted there."""
    base = cell_index(phase, bucket, "none")
    est.note_prior(base, prior or FLAT)
    est.merge_cells([(cell_index(phase, bucket, m), 1, us, us * us) for m, us in times.items()])


def test_the_correction_comes_from_the_nearest_measured_loads() -> None:
    est = Estimates(min_trials=1, max_count=64)
    _measure(est, 10, {"none": 1000, "tbo": 2000})  # tbo 2x at bucket 10
    _measure(est, 20, {"none": 1000, "tbo": 500})  # 0.5x at bucket 20
    assert est.correction("decode", "tbo", 10) == 2.0
    assert est.correction("decode", "tbo", 13) == 2.0  # nearer 10 than 20
    assert est.correction("decode", "tbo", 17) == 0.5
    assert est.correction("decode", "tbo", 15) == 1.0  # both at 5: their geometric mean
    assert est.correction("decode", "tbo", 40) == 0.5
    assert est.correction("decode", "tbo") == 1.0  # over every bucket
    assert est.corrections("decode") == {"tbo": 1.0}
    assert est.correction("prefill", "tbo", 10) is None  # phases apart
    assert est.correction("decode", "sbo", 10) is None
    _measure(est, 30, {"none": 1000, "tbo": 4000})
    assert est.correction("decode", "tbo", 29) == 4.0, "the cache is dropped on new data"
    assert est.correction("decode", "tbo") == pytest.approx(4 ** (1 / 3))  # (2 * 0.5 * 4) ** (1/3)


def test_unmeasured_estimates_use_the_local_correction_and_calibration() -> None:
    est = Estimates(min_trials=1, max_count=64)
    _measure(est, 10, {"none": 1000, "tbo": 2000})
    _measure(est, 20, {"none": 1000, "tbo": 500})
    base = cell_index("decode", 18, "none")
    prior = {"none": 300.0, "tbo": 300.0}
    est.note_prior(base, prior)
    got, measured = est.estimate(base, prior, ("none", "tbo"), "decode")
    assert got == {"none": 300.0, "tbo": 150.0} and measured == frozenset()
    est.merge_cells([(base, 1, 600, 600**2)])  # none measured here: 2x the prior, tbo follows
    got, measured = est.estimate(base, prior, ("none", "tbo"), "decode")
    assert got == {"none": 600.0, "tbo": 300.0} and measured == frozenset({"none"})


def test_a_zero_prediction_of_the_measured_modes_leaves_the_rest_uncalibrated() -> None:
    est = Estimates(min_trials=1, max_count=64)
    base = cell_index("decode", 5, "none")
    prior = {"none": 0.0, "tbo": 5.0}
    est.note_prior(base, prior)
    est.merge_cells([(base, 1, 700, 700**2)])
    got, _ = est.estimate(base, prior, ("none", "tbo"), "decode")
    assert got == {"none": 700.0, "tbo": 5.0}


@pytest.mark.parametrize("prior", [{"tbo": 1.0}, {"none": 0.0, "tbo": 1.0}])
def test_a_prior_without_a_positive_none_teaches_no_correction(prior: dict[str, float]) -> None:
    est = Estimates(min_trials=1, max_count=64)
    _measure(est, 10, {"none": 1000, "tbo": 2000}, prior)
    assert est.corrections("decode") == {}


@pytest.mark.parametrize(("none_us", "tbo_us", "prior_tbo", "want"), [
    (1, 2, 1.0, 2.0), (2, 1, 1.0, 0.5),  # integer microseconds: the smallest times still count
    (0, 5, 1.0, None), (5, 0, 1.0, None), (5, 5, 0.0, None),  # nothing to take a log of
])
def test_corrections_need_positive_times_and_prior(none_us: int, tbo_us: int, prior_tbo: float,
                                                   want: float | None) -> None:
    est = Estimates(min_trials=1, max_count=64)
    _measure(est, 10, {"none": none_us, "tbo": tbo_us}, {"none": 1.0, "tbo": prior_tbo})
    assert est.correction("decode", "tbo") == want
    assert est.correction("decode", "tbo", 10) == want


def test_a_refresh_replaces_the_cell_with_its_new_measurements_capped() -> None:
    est = Estimates(min_trials=3, max_count=2)
    cell = cell_index("decode", 7, "tbo")
    est.merge_cells([(cell, 2, 4000, 2 * 2000**2)])
    est.start_refresh(cell)
    est.merge_cells([(cell, 1, 1000, 1000**2), (cell, 1, 1000, 1000**2)])
    assert est.table.mean(cell) == 2000.0, "collecting: the old mean stands"
    est.merge_cells([(cell, 1, 1301, 1301**2)])
    assert cell not in est.fresh
    assert (est.table.counts[cell], est.table.totals[cell]) == (2, 2200)  # 3301 us over 3, capped
    assert est.table.squares[cell] == (2 * 1000**2 + 1301**2) * 2 // 3, "squares capped alike"
