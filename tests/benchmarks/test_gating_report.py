"""benchmarks/bench_gating.py's report on known rounds: phase 2 paired with its own `none`
rounds (the benchmark) or, measured alone (`run(phase2_none=False)`, the e2e test), against
phase 1's `none`, labelled as such."""

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


@pytest.mark.parametrize("paired", [True, False])
def test_phase_two_reference(bg, paired: bool) -> None:  # type: ignore[no-untyped-def]
    run = bg.Run()
    phase2 = [_target("auto_wrong", [90.0, 90.0, 90.0])]
    if paired:
        phase2.insert(0, _target("none", [60.0, 60.0, 60.0]))
    run.phases = [[_target("none", [100.0, 100.0, 100.0]), _target("auto", [95.0] * 3),
                   _target("tbo", [70.0] * 3)], phase2]
    run.tokens = {name: [[1, 2]] for name in ("none", "tbo", "auto", "auto_wrong")}
    text, data = bg.report(run)
    wrong = data["servers"]["auto_wrong"]
    # 90 against phase 2's own none (60) when paired, else against phase 1's none (100)
    assert wrong["vs"] == ("none" if paired else "none (ph. 1)")
    assert wrong["output_throughput_ratio"][0] == pytest.approx(1.5 if paired else 0.9)
    assert ("none (phase 2)" in data["servers"]) is paired
    assert data["best_fixed"] == "none"
    assert data["servers"]["auto"]["output_throughput_ratio"][0] == pytest.approx(0.95)
    assert "none (ph. 1)" in text or paired
