"""benchmarks/bench_gating.py's report on known rounds: with the fixed modes measured (the
benchmark), ratios to the best fixed mode in phase 1 and to phase 2's own `none` rounds;
without them (`run(fixed=False)`, the e2e test), no ratios."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from sglang_overlap.cli.bench import Target
from tests.conftest import REPO


@pytest.fixture(scope="module")
def bg():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bench_gating_report",
                                                  REPO / "benchmarks" / "bench_gating.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _target(label: str, tput: list[float]) -> Target:
    return Target(label, "http://x", [{"output_throughput": t, "mean_ttft_ms": 10.0,
                                       "mean_itl_ms": 5.0} for t in tput])


def test_ratios_against_the_best_fixed_mode_and_phase_two_none(bg) -> None:  # type: ignore[no-untyped-def]
    run = bg.Run()
    run.phases = [[_target("none", [100.0, 100.0, 100.0]), _target("auto", [95.0] * 3),
                   _target("tbo", [70.0] * 3)],
                  [_target("none", [60.0, 60.0, 60.0]), _target("auto_wrong", [90.0] * 3)]]
    run.tokens = {name: [[1, 2]] for name in ("none", "tbo", "auto", "auto_wrong")}
    text, data = bg.report(run)
    assert data["best_fixed"] == "none"
    assert data["servers"]["auto"]["output_throughput_ratio"][0] == pytest.approx(0.95)
    assert data["servers"]["tbo"]["output_throughput_ratio"][0] == pytest.approx(0.7)
    # 90 against phase 2's own none (60), not phase 1's (100)
    assert data["servers"]["auto_wrong"]["output_throughput_ratio"][0] == pytest.approx(1.5)
    assert "none (phase 2)" in data["servers"]
    assert data["tbo_vs_none"][0] == pytest.approx(0.7)
    assert "fixed TBO vs none: 0.700x" in text and "best fixed mode: none" in text


def test_tbo_faster_is_the_best_fixed_mode(bg) -> None:  # type: ignore[no-untyped-def]
    run = bg.Run()
    run.phases = [[_target("none", [100.0] * 3), _target("auto", [120.0] * 3),
                   _target("tbo", [125.0] * 3)],
                  [_target("none", [100.0] * 3), _target("auto_wrong", [110.0] * 3)]]
    run.tokens = {name: [[1]] for name in ("none", "tbo", "auto", "auto_wrong")}
    _, data = bg.report(run)
    assert data["best_fixed"] == "tbo"
    assert data["servers"]["auto"]["output_throughput_ratio"][0] == pytest.approx(0.96)
    assert data["servers"]["auto"]["vs"] == "tbo"


def test_without_the_fixed_modes_no_ratios(bg) -> None:  # type: ignore[no-untyped-def]
    run = bg.Run()
    run.phases = [[_target("auto", [95.0, 97.0, 99.0])], [_target("auto_wrong", [90.0] * 3)]]
    run.tokens = {"none": [[1, 2]], "auto": [[1, 2]], "auto_wrong": [[1, 3]]}
    text, data = bg.report(run)
    assert data["best_fixed"] is None and "tbo_vs_none" not in data
    auto = data["servers"]["auto"]
    assert auto["output_throughput"] == pytest.approx(97.0) and auto["vs"] == "-"
    assert not any(k.endswith("_ratio") for k in auto)
    assert data["servers"]["auto"]["tokens_equal_none"] is True
    assert data["servers"]["auto_wrong"]["tokens_equal_none"] is False
    assert "fixed modes not measured" in text and "fixed TBO vs none" not in text
