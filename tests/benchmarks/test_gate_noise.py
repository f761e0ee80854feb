"""benchmarks/bench_gate_noise.py: the real selector and runtime over synthetic step times whose
faster mode is known by construction. On exact measurements the gate settles on that mode (the
ground truth is the construction, not the selector); the step-time model and the command line."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from benchmarks import bench_gate_noise as bn


@pytest.mark.parametrize("rule", sorted(bn.RULES))
@pytest.mark.parametrize(("factor", "low", "high"), [(1.2, 0.0, 0.03), (1 / 1.2, 0.93, 1.0)])
def test_on_exact_measurements_auto_settles_on_the_faster_mode(factor: float, low: float,
                                                               high: float, rule: str) -> None:
    # 3000 steps: TBO slower -> 0.9 % of its eligible steps (exploration, refreshes); TBO
    # faster -> 96 % (the steps before each bucket measured it); both rules alike
    passes = [bn.one_pass(bn.Scenario(factor, 0.0), 3000, seed, bn.RULES[rule])
              for seed in range(4)]
    share = statistics.mean(p["tbo_share"] for p in passes)
    assert low <= share <= high, share
    assert all(p["vs_best_fixed"] < 1.03 for p in passes), passes


@pytest.mark.parametrize(("factor", "low", "high"), [(1.2, 0.0, 0.03), (1 / 1.2, 0.93, 1.0)])
def test_the_new_rule_keeps_those_bounds_when_3_percent_of_steps_spike(factor: float, low: float,
                                                                      high: float) -> None:
    # the same bounds as exact measurements; the old rule broke them (5.9 % and 90 % in
    # results/gate_noise.md): one step measured at 4x handed a bucket to the slower mode
    spiky = bn.Scenario(factor, 0.0, rate=0.03)
    new = [bn.one_pass(spiky, 3000, seed, bn.RULES["new"]) for seed in range(4)]
    share = statistics.mean(p["tbo_share"] for p in new)
    assert low <= share <= high, share
    old = [bn.one_pass(spiky, 3000, seed, bn.RULES["old"]) for seed in range(4)]
    assert not low <= statistics.mean(p["tbo_share"] for p in old) <= high, "spikes hurt old"


def test_wrong_is_the_share_run_in_the_slower_mode() -> None:
    assert bn.wrong({"factor": 1.2, "tbo_share_mean": 0.25}) == 0.25
    assert bn.wrong({"factor": 0.8, "tbo_share_mean": 0.75}) == 0.25


def test_the_replayer_measures_the_true_time_times_its_noise() -> None:
    exact = bn.noisy_replayer(bn.Scenario(1.5, 0.0), seed=1)
    start, end = exact("tbo", 8)
    assert start.elapsed_time(end) * 1e3 == pytest.approx(1.5 * (1000 + 40 * 8))
    start, end = exact("none", 8)
    assert start.elapsed_time(end) * 1e3 == pytest.approx(1000 + 40 * 8)
    spiky = bn.noisy_replayer(bn.Scenario(1.0, 0.0, rate=1.0, outlier=4.0), seed=1)
    start, end = spiky("none", 2)
    assert start.elapsed_time(end) * 1e3 == pytest.approx(4 * (1000 + 40 * 2))


def test_main_prints_the_table_and_writes_the_rows(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rows.json"
    assert bn.main(["--seeds", "1", "--steps", "40", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    rows = json.loads(out.read_text())
    assert len(rows) == 2 * len(bn.SCENARIOS) and len(text.splitlines()) - 1 == len(bn.SCENARIOS)
    assert {(r["rule"], r["seeds"]) for r in rows} == {("old", 1), ("new", 1)}
    assert {r["steps"] for r in rows} == {40} and "tbo x1.20, noise 25%, spikes 3% x4" in text


def test_bad_counts_name_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bn.main(["--seeds", "0"])
    assert exc.value.code == 2 and "--seeds and --steps must be positive" in capsys.readouterr().err
