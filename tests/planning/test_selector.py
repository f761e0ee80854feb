"""Tests for planning/selector.py with selector_estimates.py and selector_exploration.py: same
decisions on every rank, measurements override the prior, bounded deterministic exploration, no
flapping."""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping

import pytest

from sglang_overlap.modes import StepDecision
from sglang_overlap.planning.cost.prior import CostModelPrior, FlatPrior
from sglang_overlap.planning.cost.profiles import Deployment, load_hardware, load_model
from sglang_overlap.planning.selector import (
    ModeSelector,
    SelectorConfig,
    check_explore_share,
    check_hysteresis,
    check_trials,
)
from sglang_overlap.planning.step_table import NUM_CELLS, StepTable, cell_index, measure_bucket

DSV3 = load_model("deepseek-v3")
PRIOR_ONLY = SelectorConfig(min_trials=0)


def _gate(enabled: frozenset[str] = frozenset({"tbo", "sbo"}), hysteresis: float = 0.03,
          hw_name: str = "H20", **config: object) -> ModeSelector:
    prior = CostModelPrior(DSV3, load_hardware(hw_name), Deployment(), enabled)
    cfg = dataclasses.replace(SelectorConfig(hysteresis=hysteresis, min_trials=0), **config)
    return ModeSelector(prior, cfg)


class TablePrior:
    """A prior from a table: (phase, mode) -> us, the same at every load."""

    def __init__(self, values: Mapping[tuple[str, str], float]) -> None:
        self.values = dict(values)
        self.enabled = frozenset(m for _, m in values if m != "none")
        self.name = "table"

    def candidates(self, phase: str) -> tuple[str, ...]:
        return tuple(m for p, m in self.values if p == phase)

    def predictions(self, phase: str, busiest: int, mean: float) -> Mapping[str, float]:
        return {m: us for (p, m), us in self.values.items() if p == phase}


def _workload(seed: int, steps: int, ranks: int = 16) -> list[tuple[str, list[int]]]:
    rng = random.Random(seed)
    out: list[tuple[str, list[int]]] = []
    level = 32
    for _ in range(steps):
        level = max(1, min(300, level + rng.randint(-24, 24)))
        if rng.random() < 0.1:
            out.append(("prefill", [rng.choice([0, 2048, 4096, 8192]) for _ in range(ranks)]))
        else:
            out.append(("decode", [max(0, level + rng.randint(-4, 4)) for _ in range(ranks)]))
    return out


def _cells(measurements: list[tuple[int, float]]) -> list[tuple[int, int, int, int]]:
    """(cell, count, total us, squares) of `measurements`, as a rank's `StepTable.take` sends."""
    t = StepTable()
    for cell, us in measurements:
        t.add(cell, us)
    return t.take(range(NUM_CELLS))


def _decide(gate: ModeSelector, truth: Mapping[str, float], steps: int, tokens: int = 16,
            sync: int = 1) -> list[StepDecision]:
    """Decode steps at `tokens` tokens, each timed at `truth` of its mode; the times reach the
    gate every `sync` steps."""
    decisions, pending = [], []
    for step in range(steps):
        d = gate.decide("decode", [tokens])
        decisions.append(d)
        pending.append((cell_index("decode", d.bucket, d.mode), truth[d.mode]))
        if step % sync == sync - 1:
            gate.merge_cells(_cells(pending))
            pending = []
    return decisions


def _modes(gate: ModeSelector, truth: Mapping[str, float], steps: int, tokens: int = 16,
           sync: int = 1) -> list[str]:
    return [d.mode for d in _decide(gate, truth, steps, tokens, sync)]


# -- the prior alone (min_trials=0): what the cost model says -----------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_identical_decisions_across_ranks_prior_only(seed: int) -> None:
    steps = _workload(seed, 150)
    ranks = [_gate(frozenset({"tbo", "sbo", "two_chunk"})) for _ in range(4)]
    seen = set()
    for phase, tokens in steps:
        decisions = [g.decide(phase, tokens) for g in ranks]  # type: ignore[arg-type]
        assert len({(d.mode, d.reason) for d in decisions}) == 1, f"{phase=} {tokens=}"
        seen.add(decisions[0].mode)
    assert len(seen) >= 2, f"the workload should exercise several modes: {seen=}"


def test_rank_order_of_tokens_does_not_matter_but_values_do() -> None:
    a, b = _gate(), _gate()
    assert a.decide("decode", [32, 64, 200]).mode == b.decide("decode", [200, 32, 64]).mode


def _break_even(gate: ModeSelector, margin: float) -> tuple[int, int]:
    """Two nearby decode loads whose fastest modes differ, each within `margin` of the other."""
    def best_and_gap(t: int) -> tuple[str, float]:
        p = gate.prior.predictions("decode", t, t)
        ranked = sorted(p, key=p.__getitem__)
        return ranked[0], p[ranked[1]] / p[ranked[0]] - 1

    for t in range(100, 600, 4):
        (b1, g1), (b2, g2) = best_and_gap(t), best_and_gap(t + 4)
        if b1 != b2 and g1 < margin and g2 < margin:
            return t, t + 4
    raise AssertionError(f"no break-even pair within {margin=} between 100 and 600 tokens")


def test_no_flapping_on_a_steady_workload() -> None:
    probe = _gate(frozenset({"tbo"}), hysteresis=0.0)
    lo, hi = _break_even(probe, margin=0.03)
    loads = [[lo] * 16 if i % 2 else [hi] * 16 for i in range(60)]
    flappy, steady = _gate(frozenset({"tbo"}), 0.0), _gate(frozenset({"tbo"}), 0.03)
    modes_flappy = [flappy.decide("decode", x).mode for x in loads]
    modes_steady = [steady.decide("decode", x).mode for x in loads]
    switches = [sum(a != b for a, b in zip(m, m[1:], strict=False))
                for m in (modes_flappy, modes_steady)]
    assert switches[0] >= 50, f"without hysteresis this load flaps: {switches=}"
    assert switches[1] == 0, f"{switches=} {modes_steady[:6]=}"


def test_hysteresis_still_switches_on_a_real_change() -> None:
    gate = _gate(frozenset({"tbo"}), 0.03)
    assert gate.decide("decode", [16] * 16).mode == "none"
    assert gate.decide("decode", [600] * 16).mode == "tbo"
    assert gate.decide("decode", [8] * 16).mode == "none"


def test_only_enabled_and_available_modes_are_chosen() -> None:
    for enabled in (frozenset({"sbo"}), frozenset({"tbo"}), frozenset()):
        gate = _gate(enabled, min_trials=3, explore_share=0.5)
        for phase, tokens in _workload(5, 80):
            d = gate.decide(phase, tokens)  # type: ignore[arg-type]
            assert d.mode == "none" or d.mode in enabled, f"{enabled=} {d=}"
    gate = _gate(frozenset({"tbo", "sbo"}), min_trials=3, explore_share=0.5)
    for phase, tokens in _workload(6, 80):
        d = gate.decide(phase, tokens, frozenset({"sbo"}))  # type: ignore[arg-type]
        assert d.mode in ("none", "sbo"), d


def test_a_mode_that_cannot_run_this_step_does_not_reset_the_current_one() -> None:
    gate = ModeSelector(TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 5.0}), PRIOR_ONLY)
    assert gate.decide("decode", [8]).mode == "tbo"
    d = gate.decide("decode", [8], frozenset())
    assert d.mode == "none" and "tbo cannot run this step" in d.why
    assert gate.decide("decode", [8]).why == "still the fastest"


def test_seed_deployment_picks_sbo_and_says_why() -> None:
    d = _gate().decide("decode", [32] * 16)
    assert d.mode == "sbo", d
    assert d.estimates["sbo"] < d.estimates["none"] < d.estimates["tbo"]
    assert "sbo" in d.reason and "busiest=32" in d.reason and "(prior)" in d.reason


def test_idle_step() -> None:
    gate = _gate()
    d = gate.decide("decode", [0] * 16)
    assert d.mode == "none" and "idle" in d.why and gate.steps == 0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="unknown modes \\['dbo'\\]"):
        _gate(frozenset({"dbo"}))
    with pytest.raises(ValueError, match="--overlap-gating-hysteresis"):
        _gate(hysteresis=0.9)
    with pytest.raises(ValueError, match="--overlap-gating-explore"):
        SelectorConfig(explore_share=0.7)
    with pytest.raises(ValueError, match="--overlap-gating-trials"):
        SelectorConfig(min_trials=-1)
    with pytest.raises(ValueError, match="phase must be decode or prefill"):
        _gate().decide("verify", [1])  # type: ignore[arg-type]


def test_flag_ranges_are_closed_intervals() -> None:
    """--overlap-gating-hysteresis and --overlap-gating-explore take [0, 0.5],
    --overlap-gating-trials [0, 100]: both ends accepted, one step past either refused."""
    for h in (0.0, 0.5):
        check_hysteresis(h)
    for share in (0.0, 0.5):
        check_explore_share(share)
    for n in (0, 100):
        check_trials(n)
    for check, bad in ((check_hysteresis, -1e-9), (check_hysteresis, 0.5 + 1e-9),
                       (check_explore_share, -1e-9), (check_explore_share, 0.5 + 1e-9),
                       (check_trials, -1), (check_trials, 101), (check_trials, True)):
        with pytest.raises(ValueError, match="--overlap-gating-"):
            check(bad)  # type: ignore[operator]


@pytest.mark.parametrize(("challenger", "switches"), [(75.0, True), (75.5, False)])
def test_hysteresis_switches_at_exactly_the_margin(challenger: float, switches: bool) -> None:
    """The selector leaves its mode for one estimated at least `hysteresis` faster: with 25%,
    a mode measured at 75 us replaces one at 100 us, one at 75.5 us does not."""
    sel = ModeSelector(TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 20.0}),
                       SelectorConfig(hysteresis=0.25, min_trials=0))
    assert sel.decide("decode", [8]).mode == "none"  # the prior's choice: the current mode
    b = measure_bucket(8)
    sel.merge_cells([(cell_index("decode", b, "none"), 2, 200, 2 * 100**2),
                     (cell_index("decode", b, "tbo"), 2, int(2 * challenger),
                      2 * int(challenger) ** 2)])  # two equal steps each: no spread
    d = sel.decide("decode", [8])
    assert (d.mode == "tbo") is switches, f"{challenger=} {d.reason}"
    if switches:
        assert d.why == "beats none by at least 25%"


def test_no_trials_means_no_refresh_either() -> None:
    """--overlap-gating-trials 0: the estimates alone decide; a mode left behind is never
    re-run to measure it, however long ago it ran."""
    prior = TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 5.0})
    sel = ModeSelector(prior, SelectorConfig(min_trials=0, explore_share=0.5, refresh_first=1,
                                             refresh_every=2))
    none = cell_index("decode", measure_bucket(16), "none")
    sel.merge_cells([(none, 1, 1000, 1000**2)])  # none measured once (not by this selector)
    ds = _decide(sel, {"none": 1000.0, "tbo": 1300.0}, 40)
    assert [d.mode for d in ds[:2]] == ["tbo", "none"] and ds[-1].mode == "none"
    assert not any(d.explored for d in ds), [d.why for d in ds if d.explored]


# -- measurements --------------------------------------------------------------------------------

def test_calibrated_prior_hand_worked() -> None:
    # prior: none 10, tbo 5, sbo 8 us. Measured in this bucket: none = 30 us (3x the prior), so
    # the unmeasured tbo and sbo are estimated 15 and 24 us.
    prior = TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 5.0,
                        ("decode", "sbo"): 8.0})
    gate = ModeSelector(prior, PRIOR_ONLY)
    gate.merge_cells(_cells([(cell_index("decode", measure_bucket(8), "none"), 30.0)]))
    est, measured = gate.estimates("decode", 8, 8.0, ["none", "tbo", "sbo"])
    assert est == {"none": 30.0, "tbo": 15.0, "sbo": 24.0} and measured == {"none"}
    gate.merge_cells(_cells([(cell_index("decode", measure_bucket(8), "tbo"), 40.0)]))
    est, measured = gate.estimates("decode", 8, 8.0, ["none", "tbo", "sbo"])
    # calibration now (30 + 40) / (10 + 5) = 14/3: sbo = 8 x 14/3
    assert est["none"] == 30.0 and est["tbo"] == 40.0
    assert est["sbo"] == pytest.approx(8 * 70 / 15) and measured == {"none", "tbo"}
    # another bucket has measured nothing: the raw prior
    assert gate.estimates("decode", 100, 100.0, ["none", "tbo"])[0] == {"none": 10.0, "tbo": 5.0}


def test_wrong_prior_is_overridden_by_measurement() -> None:
    # The prior says TBO halves the step; the machine says TBO is 30% slower.
    prior = TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 5.0})
    gate = ModeSelector(prior, SelectorConfig(min_trials=2, explore_share=0.2))
    truth = {"none": 1000.0, "tbo": 1300.0}
    modes = _modes(gate, truth, 120)
    assert modes[0] == "tbo", "the prior decides before anything is measured"
    assert modes[-50:] == ["none"] * 50, modes
    assert gate.explored <= 0.2 * gate.steps


def test_an_exploration_that_becomes_the_choice_is_a_change() -> None:
    # The log shows changes only: "none (exploring)" followed by "none (beats tbo)" must show the
    # second too, or the override would never appear in the log.
    prior = TablePrior({("decode", "none"): 10.0, ("decode", "tbo"): 5.0})
    gate = ModeSelector(prior, SelectorConfig(min_trials=1, explore_share=0.5))
    truth = {"none": 1000.0, "tbo": 1300.0}
    ds = _decide(gate, truth, 6)
    assert [(d.mode, d.explored, d.changed) for d in ds[:4]] == [
        ("tbo", False, True), ("none", True, True), ("none", False, True), ("none", False, False)]
    assert ds[2].why == "beats tbo by at least 3%"


def test_measured_faster_mode_wins_against_a_flat_prior() -> None:
    gate = ModeSelector(FlatPrior(frozenset({"tbo", "sbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.5))
    truth = {"none": 1000.0, "tbo": 1100.0, "sbo": 900.0}
    seen = _modes(gate, truth, 60, tokens=40)
    assert seen[0] == "none", "a flat prior ties, and ties go to no overlap"
    assert seen.count("tbo") == 1, "tbo, measured 10% slower than none, is not tried again"
    assert seen[-30:] == ["sbo"] * 30, seen


def test_what_one_bucket_learns_carries_to_the_next() -> None:
    gate = ModeSelector(FlatPrior(frozenset({"tbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.5))
    slow = {"none": 1000.0, "tbo": 2000.0}
    first = _modes(gate, slow, 40)
    assert first.count("tbo") == 1 and gate.correction("decode", "tbo") == pytest.approx(2.0)
    d = gate.decide("decode", [24])  # a new bucket: tbo estimated from the correction
    assert d.estimates == {"none": 1.0, "tbo": 2.0}, "flat prior x correction, unmeasured"
    assert d.mode == "none" and _modes(gate, slow, 40, tokens=24).count("tbo") == 0, \
        "known 2x slower within a factor of two of this load: not explored again"
    close = ModeSelector(FlatPrior(frozenset({"tbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.5))
    near = {"none": 1000.0, "tbo": 1050.0}  # within the 10% exploration margin
    _modes(close, near, 40)
    assert _modes(close, near, 40, tokens=100).count("tbo") == 3, \
        "competitive: explored min_trials times"


def test_a_mode_losing_at_small_loads_is_found_where_it_wins() -> None:
    """TBO 1.3x none below 128 tokens, 0.7x from 128; the load ramps up from idle and back: TBO
    is measured again past a factor of two of the loads it lost at, found faster there, and
    then chosen at every load where it wins, the corrections being the nearest loads'."""
    gate = ModeSelector(FlatPrior(frozenset({"tbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.05))
    ramp = (4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
    up: dict[int, list[str]] = {}
    down: dict[int, list[str]] = {}
    for seen, loads in ((up, ramp), (down, ramp[::-1])):
        for tokens in loads:
            truth = {"none": 1000.0, "tbo": 1300.0 if tokens < 128 else 700.0}
            seen[tokens] = _modes(gate, truth, 200, tokens=tokens)
    assert up[256].count("tbo") >= 190, up[256]  # explored: no load near 256 had run TBO
    for tokens, ratio in ((256, 0.7), (192, 0.7), (64, 1.3), (4, 1.3)):  # the nearest loads'
        assert gate.correction("decode", "tbo", measure_bucket(tokens)) == pytest.approx(ratio,
                                                                                     rel=0.01)
    for tokens, modes in down.items():
        wins = tokens >= 128
        assert modes.count("tbo") >= 190 if wins else modes.count("tbo") <= 7, (tokens, modes)
    assert all(up[t].count("tbo") <= 7 for t in ramp if t < 128), up  # trials, refreshes
    near = ModeSelector(FlatPrior(frozenset({"tbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.05))
    _modes(near, {"none": 1000.0, "tbo": 1300.0}, 200, tokens=64)
    assert _modes(near, {"none": 1000.0, "tbo": 700.0}, 200, tokens=96).count("tbo") == 0, \
        "within a factor of two, the nearest load's correction stands: not explored"


def test_exploration_is_bounded_by_the_share_in_each_phase() -> None:
    for share in (0.0, 0.01, 0.05, 0.2):
        gate = ModeSelector(FlatPrior(frozenset({"tbo", "sbo", "two_chunk"})),
                    SelectorConfig(min_trials=3, explore_share=share))
        steps = {"decode": 0, "prefill": 0}
        explored = {"decode": 0, "prefill": 0}
        for phase, tokens in _workload(3, 2000):
            d = gate.decide(phase, tokens)  # type: ignore[arg-type]
            if d.busiest:
                steps[phase] += 1
                explored[phase] += d.explored
            assert explored[phase] <= share * steps[phase], f"{share=} {phase=} {explored=}"
        assert gate.explored == sum(explored.values())
        if share >= 0.05:  # about 200 prefill steps: each phase explores on its own budget
            assert min(explored.values()) > 0, f"{share=} {explored=}"
        assert (gate.explored > 0) == (share > 0), f"{share=} {gate.explored=}"


def test_refresh_retries_a_mode_not_chosen_for_long() -> None:
    prior = TablePrior({("decode", "none"): 1.0, ("decode", "tbo"): 2.0})
    gate = ModeSelector(prior, SelectorConfig(min_trials=1, explore_share=0.5, refresh_every=50))
    modes = [gate.decide("decode", [16]).mode for _ in range(200)]
    tries = [i for i, m in enumerate(modes) if m == "tbo"]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert len(tries) == 4 and min(gaps) >= 50, tries


def test_refresh_gaps_double_up_to_refresh_every() -> None:
    prior = TablePrior({("decode", "none"): 1.0, ("decode", "tbo"): 2.0})
    gate = ModeSelector(prior, SelectorConfig(min_trials=1, explore_share=0.5, refresh_first=10,
                                  refresh_every=80))
    ds = [gate.decide("decode", [16]) for _ in range(400)]
    tries = [i for i, d in enumerate(ds) if d.mode == "tbo"]
    gaps = [b - a for a, b in zip(tries, tries[1:], strict=False)]
    assert gaps == [10, 20, 40, 80, 80, 80, 80], tries
    assert all(ds[i].why.startswith("refreshing: not run here for") for i in tries[1:])


@pytest.mark.parametrize("refresh_every", [0, 2000])
def test_a_stale_measurement_is_replaced_by_a_refresh(refresh_every: int) -> None:
    """none was measured while the host was busy (2 ms), so TBO (1.5 ms) took over; the host is
    quiet now (none 1 ms). Only a refresh can see it: the gate never chooses none by itself."""
    gate = ModeSelector(FlatPrior(frozenset({"tbo"})),
                SelectorConfig(min_trials=3, explore_share=0.05, refresh_first=32,
                           refresh_every=refresh_every))
    busy = {"none": 2000.0, "tbo": 1500.0}
    first = _modes(gate, busy, 100, sync=4)
    assert first[-20:] == ["tbo"] * 20, first  # a refresh of none (if any) confirmed it
    quiet = {"none": 1000.0, "tbo": 1500.0}
    after = _modes(gate, quiet, 400, sync=4)
    none = cell_index("decode", measure_bucket(16), "none")
    if not refresh_every:
        assert after.count("none") == 0 and gate.table.mean(none) == 2000.0
        return
    assert gate.table.mean(none) == 1000.0, "fresh trials replace the stale ones, not dilute them"
    assert after.index("none") < 64, after  # the next refresh
    assert after[64:].count("tbo") <= 3 * 3, after  # tbo's own refreshes: 32, 64, 128 steps
    assert after[-50:] == ["none"] * 50, after


def test_refresh_confirming_the_choice_costs_little() -> None:
    """TBO is and stays 2x slower: each refresh re-runs it min_trials times, less and less often."""
    gate = ModeSelector(FlatPrior(frozenset({"tbo"})),
                        SelectorConfig(min_trials=3, explore_share=0.05))
    modes = _modes(gate, {"none": 1000.0, "tbo": 2000.0}, 4000, sync=4)
    assert modes[-100:] == ["none"] * 100
    assert modes.count("tbo") <= 3 * 7, modes.count("tbo")  # gaps 64, 128, ..., 2000: <= 7 visits


def test_recent_measurements_outweigh_old_ones() -> None:
    prior = TablePrior({("decode", "none"): 1.0, ("decode", "tbo"): 1.0})
    gate = ModeSelector(prior, SelectorConfig(min_trials=0, max_count=8))
    none = cell_index("decode", measure_bucket(16), "none")
    for _ in range(100):
        gate.merge_cells(_cells([(none, 1000.0)]))
    for _ in range(8):
        gate.merge_cells(_cells([(none, 2000.0)]))
    mean = gate.table.mean(none)  # old weight (8/9)^8 = 0.39: about 1610 us
    assert mean is not None and 1500 < mean < 1700, f"{mean=}"
    for _ in range(32):
        gate.merge_cells(_cells([(none, 2000.0)]))
    mean = gate.table.mean(none)
    assert mean is not None and mean > 1950, f"{mean=}"


# -- a reference gate, written independently, on seeded random inputs ----------------------------

class ReferenceSelector:
    """The documented rule, naively: recompute everything from the full history each step."""

    def __init__(self, prior: TablePrior, cfg: SelectorConfig) -> None:
        self.prior, self.cfg = prior, cfg
        self.sums: dict[tuple[str, int, str], list[float]] = {}
        self.history: list[tuple[str, int, str]] = []  # (phase, bucket, mode) chosen per step
        self.current: dict[str, str] = {}
        self.explored = {"decode": 0, "prefill": 0}
        self.prior_ratio: dict[tuple[str, int], dict[str, float]] = {}  # at first visit
        self.logs: dict[tuple[str, str], dict[int, float]] = {}  # -> bucket -> log ratio

    def mean(self, phase: str, bucket: int, mode: str) -> float | None:
        v = self.sums.get((phase, bucket, mode))
        return sum(v) / len(v) if v else None

    def error(self, phase: str, bucket: int, mode: str) -> float:
        """The standard error of a cell's mean: sample sd over sqrt(n) (below 2 steps: 0)."""
        v = self.sums.get((phase, bucket, mode), [])
        return statistics.stdev(v) / math.sqrt(len(v)) if len(v) >= 2 else 0.0

    def clip(self, phase: str, bucket: int, mode: str, us: float) -> float:
        """At most `clip` x the cell's mean, else x the bucket's fastest mean (0: as is)."""
        own = self.mean(phase, bucket, mode)
        means = [x for m in ("none", "tbo", "sbo")
                 if (x := self.mean(phase, bucket, m)) is not None]
        ceiling = own if own is not None else min(means, default=None)
        return us if not self.cfg.clip or ceiling is None else min(us, self.cfg.clip * ceiling)

    def merge(self, items: list[tuple[str, int, str, float]]) -> None:
        for phase, bucket, mode, us in items:
            self.sums.setdefault((phase, bucket, mode), []).append(float(int(us + 0.5)))
        self.logs = {}
        for (phase, bucket), ratios in self.prior_ratio.items():
            none = self.mean(phase, bucket, "none")
            for m, r in ratios.items():
                mine = self.mean(phase, bucket, m)
                if none and mine:
                    self.logs.setdefault((phase, m), {})[bucket] = math.log(mine / none / r)

    def corr(self, phase: str, mode: str, bucket: int) -> float:
        """The mean log ratio at the measured buckets nearest to `bucket`, as a factor."""
        logs = self.logs.get((phase, mode), {})
        if not logs:
            return 1.0
        nearest = min(abs(b - bucket) for b in logs)
        near = [v for b, v in logs.items() if abs(b - bucket) == nearest]
        return math.exp(sum(near) / len(near))

    def decide(self, phase: str, busiest: int, allowed: set[str]) -> str:
        bucket = measure_bucket(busiest)
        cands = [m for m in self.prior.candidates(phase) if m == "none" or m in allowed]
        prior = self.prior.predictions(phase, busiest, busiest)
        self.prior_ratio.setdefault((phase, bucket), {
            m: t / prior["none"] for m, t in prior.items() if m != "none"})
        meas = {m: x for m in cands if (x := self.mean(phase, bucket, m)) is not None}
        corrected = {m: prior[m] * self.corr(phase, m, bucket) for m in cands}
        scale = sum(meas.values()) / sum(corrected[m] for m in meas) if meas else 1.0
        est = {m: meas.get(m, corrected[m] * scale) for m in cands}
        order = ["none", "tbo", "sbo"]
        best = sorted(cands, key=lambda m: (est[m], order.index(m)))[0]
        cur = self.current.get(phase)
        if cur is None or cur not in est:
            chosen = best
        elif (est[best] <= est[cur] * (1 - self.cfg.hysteresis) and est[cur] - est[best]
              >= self.cfg.confidence * self.error(phase, bucket, cur)):
            chosen = best
        else:
            chosen = cur
        if cur is None or cur in est:
            self.current[phase] = chosen
        steps = sum(1 for h in self.history if h[0] == phase) + 1
        tried = {m: sum(1 for h in self.history if h == (phase, bucket, m)) for m in cands}
        low = min(est.values())
        near = {m: any(abs(b - bucket) <= 4 for p, b, x in self.history if (p, x) == (phase, m))
                for m in cands}
        due = [m for m in cands if m != chosen and tried[m] < self.cfg.min_trials
               and ((phase, m) not in self.logs or est[m] <= low * (1 + self.cfg.explore_margin)
                    or not near[m])]
        if due and self.explored[phase] + 1 <= self.cfg.explore_share * steps:
            chosen = sorted(due, key=lambda m: (est[m], order.index(m)))[0]
            self.explored[phase] += 1
        self.history.append((phase, bucket, chosen))
        return chosen


@pytest.mark.parametrize("seed", range(6))
def test_gate_matches_the_reference_on_random_workloads(seed: int) -> None:
    rng = random.Random(seed)
    prior = TablePrior({
        ("decode", "none"): rng.uniform(5, 10), ("decode", "tbo"): rng.uniform(3, 12),
        ("decode", "sbo"): rng.uniform(4, 11), ("prefill", "none"): 50.0,
        ("prefill", "tbo"): rng.uniform(30, 70)})
    cfg = SelectorConfig(hysteresis=rng.choice([0.0, 0.03, 0.1]), min_trials=rng.randint(1, 4),
                     explore_share=rng.choice([0.05, 0.2, 0.5]), max_count=10**9,
                     refresh_every=0, explore_margin=rng.choice([0.0, 0.1, 10.0]),
                     confidence=rng.choice([0.0, 1.0, 2.0]), clip=rng.choice([0.0, 1.2, 1.5]))
    gate, ref = ModeSelector(prior, cfg), ReferenceSelector(prior, cfg)
    loads = [3, 17, 18, 40, 70, 300]  # a mode's speed moves with the load, as TBO's does
    speed = {(m, t): rng.uniform(0.5, 1.5) for m in ("none", "tbo", "sbo") for t in loads}
    pending: list[tuple[str, int, str, float, float]] = []  # ..., clipped by gate / by ref
    for step in range(400):
        phase = "prefill" if rng.random() < 0.2 else "decode"
        level = rng.choice(loads)
        busiest = level * (8 if phase == "prefill" else 1)
        allowed = {m for m in ("tbo", "sbo") if rng.random() < 0.9}
        got = gate.decide(phase, [busiest, busiest // 2], frozenset(allowed))  # type: ignore[arg-type]
        want = ref.decide(phase, busiest, allowed)
        assert got.mode == want, f"{seed=} {step=} {phase=} {busiest=} {got=}"
        us = 1000.0 * speed[got.mode, level] * (1 + rng.uniform(-0.05, 0.05))
        if rng.random() < 0.05:
            us *= 4  # a host hiccup: clipped
        pending.append((phase, got.bucket, got.mode, gate.clip(got.cell, us),
                        ref.clip(phase, got.bucket, got.mode, us)))
        if step % 7 == 6:  # a sync: both see the same new measurements at the same step
            gate.merge_cells(_cells([(cell_index(p, b, m), t) for p, b, m, t, _ in pending]))
            ref.merge([(p, b, m, t) for p, b, m, _, t in pending])
            pending = []


@pytest.mark.parametrize("seed", [0, 1])
def test_ranks_with_different_timings_decide_identically_after_sharing(seed: int) -> None:
    """Four ranks time the same steps differently; they all-reduce (sum) every 8 steps."""
    rng = random.Random(seed)
    ranks = [ModeSelector(FlatPrior(frozenset({"tbo", "sbo", "two_chunk"})),
                  SelectorConfig(min_trials=3, explore_share=0.1)) for _ in range(4)]
    local = [StepTable() for _ in ranks]
    base = {"none": 1000.0, "tbo": 1150.0, "sbo": 980.0}
    for step, (phase, tokens) in enumerate(_workload(seed, 600, ranks=4)):
        if step % 8 == 7:
            total = StepTable()  # the all-reduce: integer sums, the same on every rank
            for t in local:
                total.add_cells(t.take(range(NUM_CELLS)))
            summed = total.take(range(NUM_CELLS))
            for g in ranks:
                g.merge_cells(summed)
        ds = [g.decide(phase, tokens) for g in ranks]  # type: ignore[arg-type]
        assert len({(d.mode, d.reason) for d in ds}) == 1, f"{step=} {[d.reason for d in ds]}"
        if ds[0].busiest:
            for t in local:  # each rank's own, noisy, timing of the step
                t.add(cell_index(phase, ds[0].bucket, ds[0].mode),
                      base[ds[0].mode] * rng.uniform(0.9, 1.1))


def test_one_expert_rank_with_sbo_enabled_decides_and_explores_sbo() -> None:
    """--overlap-gating auto on one GPU (H100 profile, --ep 1): every step decides (the KeyError
    that stopped the server at its first decode step is gone), the first choice is none (the prior
    prices SBO as none, ties go to none) and SBO is explored, so measurements decide."""
    prior = CostModelPrior(DSV3, load_hardware("H100"), Deployment(ep_size=1), frozenset({"sbo"}))
    gate = ModeSelector(prior, SelectorConfig())
    chosen = []
    for _ in range(64):
        d = gate.decide("decode", [8])
        chosen.append(d.mode)
        if d.cell is not None:
            us = 1000 if d.mode == "none" else 1250
            gate.merge_cells([(d.cell, 1, us, us * us)])
    assert chosen[0] == "none" and "sbo" in chosen, chosen
    assert chosen[-1] == "none"  # SBO measured 1.25x slower: none wins
    assert gate.explored >= 1


# -- robustness: clipped spikes, the current mode's error -------------------------------------

def _measured(confidence: float, none: tuple[int, ...], tbo: tuple[int, ...]) -> StepDecision:
    """none current (the prior's choice), then both measured at 8 tokens: the next decision."""
    sel = ModeSelector(TablePrior({("decode", "none"): 1.0, ("decode", "tbo"): 2.0}),
                       SelectorConfig(min_trials=0, confidence=confidence))
    assert sel.decide("decode", [8]).mode == "none"
    b = measure_bucket(8)
    sel.merge_cells(_cells([(cell_index("decode", b, "none"), us) for us in none]
                           + [(cell_index("decode", b, "tbo"), us) for us in tbo]))
    return sel.decide("decode", [8])


@pytest.mark.parametrize(("confidence", "tbo", "switches"), [
    (1.0, 900, True),    # none: 1000, 1400 us -> mean 1200, sd 282.8, error 200; lead 300
    (1.5, 900, True),    # 300 >= 1.5 x 200
    (1.51, 900, False),  # 300 < 302
    (2.0, 900, False),
    (1.0, 1000, True),   # a lead of exactly one error switches
    (0.0, 1150, True),   # no confidence: the hysteresis alone (1150 <= 0.97 x 1200)
])
def test_the_current_mode_is_left_only_for_a_lead_beyond_its_error(
        confidence: float, tbo: int, switches: bool) -> None:
    d = _measured(confidence, (1000, 1400), (tbo, tbo))
    assert (d.mode == "tbo") is switches, f"{confidence=} {tbo=} {d.why}"
    if not switches:
        assert d.why == (f"tbo leads by less than {confidence:g} standard error(s) of none's "
                         "mean (200 us)")


def test_only_the_current_modes_error_holds_it() -> None:
    """tbo's own steps scatter (100, 1500: error 700 us), none's do not: tbo's mean of 800 beats
    none's 1000 whatever the confidence; none measured once has no error either."""
    assert _measured(5.0, (1000, 1000), (100, 1500)).mode == "tbo"
    assert _measured(5.0, (1000,), (800, 800)).mode == "tbo"


def test_clip_hand_worked() -> None:
    sel = ModeSelector(FlatPrior(frozenset({"tbo", "sbo"})), SelectorConfig())
    b = 9
    none, tbo, sbo = (cell_index("decode", b, m) for m in ("none", "tbo", "sbo"))
    assert sel.clip(none, 4000.0) == 4000.0, "nothing measured in the bucket: as is"
    sel.merge_cells(_cells([(cell_index("decode", b + 1, "none"), 1000.0),
                            (cell_index("prefill", b, "none"), 1000.0)]))
    assert sel.clip(none, 4000.0) == 4000.0, "other buckets and phases do not count"
    sel.merge_cells(_cells([(none, 1000.0)]))
    assert (sel.clip(none, 4000.0), sel.clip(none, 1200.0)) == (1500.0, 1200.0)
    assert sel.clip(tbo, 4000.0) == 1500.0, "an empty cell: 1.5 x the bucket's fastest mean"
    sel.merge_cells(_cells([(sbo, 800.0)]))
    assert sel.clip(tbo, 4000.0) == 1200.0, "1.5 x sbo's 800, the fastest"
    sel.merge_cells(_cells([(tbo, 2000.0)]))
    assert sel.clip(tbo, 4000.0) == 3000.0, "a measured cell: 1.5 x its own mean"
    off = ModeSelector(FlatPrior(frozenset({"tbo"})), SelectorConfig(clip=0.0))
    off.merge_cells(_cells([(none, 1000.0)]))
    assert off.clip(none, 4000.0) == 4000.0


@pytest.mark.parametrize(("config", "message"), [
    ({"confidence": -0.1}, "confidence >= 0"), ({"clip": 0.99}, "clip 0 \\(off\\) or >= 1"),
])
def test_robustness_settings_are_checked(config: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SelectorConfig(**config)  # type: ignore[arg-type]
    SelectorConfig(confidence=0.0, clip=1.0)


def _one_spike(config: SelectorConfig) -> list[str]:
    """tbo 1.2x none, exact, but none's second step measured at 4x: the modes of 200 steps at
    8 tokens, each step clipped as the runtime clips it and merged at once."""
    gate = ModeSelector(FlatPrior(frozenset({"tbo"})), config)
    modes, nones = [], 0
    for _ in range(200):
        d = gate.decide("decode", [8])
        assert d.cell is not None
        nones += d.mode == "none"
        us = 1200.0 if d.mode == "tbo" else 4000.0 if nones == 2 else 1000.0
        gate.merge_cells(_cells([(d.cell, gate.clip(d.cell, us))]))
        modes.append(d.mode)
    return modes


def test_one_spike_on_the_faster_mode_does_not_hand_its_bucket_over() -> None:
    cfg = SelectorConfig(min_trials=3, explore_share=0.5, refresh_every=0)
    # ground truth: none is faster, so tbo runs only its 3 trials
    assert _one_spike(cfg).count("tbo") == 3
    old = _one_spike(dataclasses.replace(cfg, confidence=0.0, clip=0.0))
    assert old.count("tbo") > 100, "the rule before: one spike hands the bucket to tbo"
    clip_only = _one_spike(dataclasses.replace(cfg, confidence=0.0))
    assert clip_only.count("tbo") > 100, "1000, 1500: clipped, still above 1200 x 1.03"
