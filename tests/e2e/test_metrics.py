"""The plugin's series in SGLang's own GET /metrics, on a real CPU server (tiny random
DeepSeek-V3, --tp 2, torch_a2a, TBO + SBO + --overlap-gating auto, --enable-metrics
--enable-metrics-for-all-schedulers): the "auto" server of overlap_runs.py, scraped before and
after its fixed prompts (sglang/metrics_collector.py documents the series)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from overlap_runs import Metrics, OverlapRuns
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.e2e

Sample = tuple[str, dict[str, str], float]
# the series' own labels, on top of the scheduler collector's (sglang/metrics_collector.py)
DOCUMENTED = {
    "sglang_overlap_steps_total": {"phase", "mode", "runner"},
    "sglang_overlap_eager_fallbacks_total": {"mode", "reason"},
    "sglang_overlap_gate_decisions_total": {"phase", "mode"},
    "sglang_overlap_gate_decision_changes_total": {"phase"},
    "sglang_overlap_gate_explored_steps_total": {"phase", "mode"},
    "sglang_overlap_gate_step_time_seconds": {"phase", "bucket", "mode"},
    "sglang_overlap_gate_step_samples": {"phase", "bucket", "mode"},
    "sglang_overlap_info": {"sbo_path", "sbo_producer", "deep_gemm_version", "deep_ep_version",
                            "guard"},
}


def _samples(text: str) -> list[Sample]:
    return [(s.name, dict(s.labels), s.value) for f in text_string_to_metric_families(text)
            for s in f.samples]


def _ours(text: str, name: str, rank: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of `name` on TP rank `rank`, keyed by their own (non-collector) labels."""
    out = {}
    for n, labels, value in _samples(text):
        if n == name and labels.get("tp_rank") == rank:
            out[tuple(sorted((k, v) for k, v in labels.items() if k in DOCUMENTED[name]))] = value
    return out


@pytest.fixture(scope="module")
def metrics(overlap_runs: OverlapRuns) -> Metrics:
    found = overlap_runs["auto"].metrics
    assert found is not None
    return found


def test_labels_are_the_collectors_plus_the_documented_ones(metrics: Metrics) -> None:
    base = {frozenset(labels) for n, labels, _ in _samples(metrics.after)
            if n == "sglang:num_running_reqs"}
    assert len(base) == 1, base  # every scheduler's collector has the same label names
    names = set(next(iter(base)))
    seen = set()
    for n, labels, _ in _samples(metrics.after):
        if n.startswith("sglang_overlap"):
            assert n in DOCUMENTED, n
            assert set(labels) == names | DOCUMENTED[n], (n, labels)
            seen.add(n)
    assert {"sglang_overlap_gate_decisions_total", "sglang_overlap_gate_step_time_seconds",
            "sglang_overlap_gate_step_samples", "sglang_overlap_info"} <= seen, seen


@pytest.mark.parametrize("rank", ["0", "1"])
def test_counters_move_with_traffic(metrics: Metrics, rank: str) -> None:
    name = "sglang_overlap_gate_decisions_total"
    before, after = _ours(metrics.before, name, rank), _ours(metrics.after, name, rank)
    for phase in ("prefill", "decode"):
        grew = sum(v - before.get(k, 0.0) for k, v in after.items() if ("phase", phase) in k)
        assert grew >= 1, f"{rank=} {phase=} {before=} {after=}"


def test_each_rank_counts_its_own_steps_once(metrics: Metrics) -> None:
    """Both TP ranks run every step and gate it alike: each rank's decisions equal the gate's
    own per-mode step counts (GET /server_info), not their sum over the ranks."""
    name = "sglang_overlap_gate_decisions_total"
    chosen: dict[str, float] = defaultdict(float)
    for (phase, mode), n in ((k.split("/"), v) for k, v in metrics.gate["chosen"].items()):
        chosen[f"{phase}/{mode}"] += n
    for rank in ("0", "1"):
        got = {f"{dict(k)['phase']}/{dict(k)['mode']}": v
               for k, v in _ours(metrics.after, name, rank).items() if v}
        assert got == dict(chosen), f"{rank=} {got=} {metrics.gate['chosen']=}"


def test_learned_step_times_are_the_gate_table(metrics: Metrics) -> None:
    served = _ours(metrics.after, "sglang_overlap_gate_step_time_seconds", "0")
    samples = _ours(metrics.after, "sglang_overlap_gate_step_samples", "0")
    want = {}
    for row in metrics.gate["rows"]:
        lo, hi = row["tokens"]
        bucket = str(lo) if lo == hi else f"{lo}-{hi if hi < 1 << 62 else 'inf'}"
        key = (("bucket", bucket), ("mode", row["mode"]), ("phase", row["phase"]))
        want[key] = row
    assert set(served) == set(want) and set(samples) == set(want)
    for key, row in want.items():
        assert served[key] == pytest.approx(row["mean_ms"] / 1e3, abs=1e-7), key
        assert samples[key] == row["count"], key


@pytest.mark.parametrize("rank", ["0", "1"])
def test_info_series(metrics: Metrics, rank: str) -> None:
    info = _ours(metrics.after, "sglang_overlap_info", rank)
    assert len(info) == 1, info
    labels, value = next(iter(info.items()))
    assert value == 1
    assert dict(labels)["sbo_path"] == "torch_a2a"
    assert dict(labels)["sbo_producer"] == "torch_experts" and dict(labels)["guard"] == "ok"
