"""The metrics glue (sglang/metrics_collector.py) in prometheus_client's multiprocess mode, as
SGLang runs it: two scheduler-like processes write their series into one
PROMETHEUS_MULTIPROC_DIR, and the endpoint's collector (`MultiProcessCollector`) reads them back.
A real SGLang server's /metrics is scraped in tests/e2e/test_metrics.py."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client")

from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402
from prometheus_client.multiprocess import MultiProcessCollector  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from sglang_overlap.sglang.upstream import metrics_collector as mc  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TABLE = {"rows": [{"phase": "decode", "tokens": [16, 19], "mode": "none", "count": 60,
                   "mean_ms": 69.61},
                  {"phase": "prefill", "tokens": [1, 1], "mode": "tbo", "count": 2,
                   "mean_ms": 30.0}]}
INFO = {"sbo_path": "per_expert", "sbo_producer": "triton", "deep_gemm_version": "0.2.3.post2",
        "deep_ep_version": "0.1.2.post1", "guard": "ok"}
# One scheduler process: counts, writes, counts more, writes twice (the second write adds
# nothing: only growth is added).
SCRIPT = textwrap.dedent("""
    import sys
    from sglang_overlap import stats
    from sglang_overlap.sglang.upstream import metrics_collector as mc
    mc.info_labels = lambda: {info!r}
    rank = sys.argv[1]
    ex = mc.Exporter({{"model_name": "tiny", "tp_rank": int(rank), "pp_rank": 0}})
    stats.add("steps", "decode", "tbo", "eager", n=5)
    stats.add("decisions", "decode", "none", n=3)
    ex.write(stats.snapshot(), None)
    stats.add("steps", "decode", "tbo", "eager", n=2)
    stats.add("steps", "prefill", "none", "graph")
    stats.add("decision_changes", "decode")
    ex.write(stats.snapshot(), {table!r})
    ex.write(stats.snapshot(), {table!r})
""").format(info=INFO, table=TABLE)


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, frozenset], float]:
    """name + labels -> value, as GET /metrics would serve them after both ranks wrote."""
    path = tmp_path_factory.mktemp("prom")
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(path),
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    for rank in ("0", "1"):
        subprocess.run([sys.executable, "-c", SCRIPT, rank], env=env, check=True, timeout=120)
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(path))
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def _get(scraped: dict, name: str, **labels: str) -> float | None:
    return scraped.get((name, frozenset(labels.items())))


@pytest.mark.parametrize("rank", ["0", "1"])
def test_each_rank_has_its_own_counters(scraped: dict, rank: str) -> None:
    base = {"model_name": "tiny", "tp_rank": rank, "pp_rank": "0"}
    assert _get(scraped, "sglang_overlap_steps_total", **base, phase="decode", mode="tbo",
                runner="eager") == 7
    assert _get(scraped, "sglang_overlap_steps_total", **base, phase="prefill", mode="none",
                runner="graph") == 1
    assert _get(scraped, "sglang_overlap_gate_decisions_total", **base, phase="decode",
                mode="none") == 3
    assert _get(scraped, "sglang_overlap_gate_decision_changes_total", **base,
                phase="decode") == 1
    assert _get(scraped, "sglang_overlap_gate_step_time_seconds", **base, phase="decode",
                bucket="16-19", mode="none") == pytest.approx(0.06961)
    assert _get(scraped, "sglang_overlap_gate_step_samples", **base, phase="prefill",
                bucket="1", mode="tbo") == 2
    assert _get(scraped, "sglang_overlap_info", **base, **INFO) == 1


def test_no_series_beyond_the_documented_ones(scraped: dict) -> None:
    names = {name for name, _ in scraped}
    assert names == {"sglang_overlap_steps_total", "sglang_overlap_gate_decisions_total",
                     "sglang_overlap_gate_decision_changes_total",
                     "sglang_overlap_gate_step_time_seconds", "sglang_overlap_gate_step_samples",
                     "sglang_overlap_info"}
    # 2 ranks x (2 steps + 1 decisions + 1 changes + 2 times + 2 samples + 1 info)
    assert len(scraped) == 18


def test_every_stats_series_is_exported() -> None:
    from sglang_overlap import stats

    assert set(mc.COUNTERS) == set(stats.SERIES)


def test_bucket_label() -> None:
    assert [mc.bucket_label(16, 19), mc.bucket_label(1, 1), mc.bucket_label(7, 1 << 62)] == [
        "16-19", "1", "7-inf"]


def test_info_labels_of_a_plain_process() -> None:
    pytest.importorskip("sglang")
    labels = mc.info_labels()
    assert set(labels) == set(mc.INFO_LABELS)
    assert labels["sbo_path"] == "off" and labels["sbo_producer"] == "none"
    from sglang_overlap.kernels.package_source import package_version

    assert labels["deep_gemm_version"] == (package_version("deep_gemm") or "none")
    assert labels["guard"] == "ok"


def test_info_guard_label_names_the_features_turned_off() -> None:
    pytest.importorskip("sglang")
    from types import SimpleNamespace

    from sglang_overlap.sglang.upstream import server_args

    server_args.set_verdict(SimpleNamespace(off={"tbo": "changed", "gate": "changed"}))
    try:
        assert mc.info_labels()["guard"] == "off: gate,tbo"
    finally:
        server_args.set_verdict(None)
    assert mc.info_labels()["guard"] == "ok"


def test_the_hook_is_registered_and_pinned() -> None:
    from sglang_overlap.sglang import hooks

    assert "metrics_collector" in hooks.GLUE_MODULES
    pytest.importorskip("sglang")
    from sglang_overlap.sglang import guard

    live = guard.current_fingerprints([mc.LOG_STATS])[mc.LOG_STATS]
    assert live == mc.HOOKS[0].fingerprint


def test_dashboard_queries_only_exported_series() -> None:
    """docs/grafana-sglang-overlap.json is valid JSON and every series it queries is one the
    glue exports (a renamed series breaks the dashboard: this fails first)."""
    import json
    import re

    dash = json.loads((REPO / "docs" / "grafana-sglang-overlap.json").read_text())
    exported = {f"{mc.PREFIX}_{name}_total" for name, _ in mc.COUNTERS.values()}
    exported |= {f"{mc.PREFIX}_gate_step_time_seconds", f"{mc.PREFIX}_gate_step_samples",
                 f"{mc.PREFIX}_info"}
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in re.findall(r"sglang_overlap_\w+", e)}
    assert used and used <= exported, used - exported
    assert {f"{mc.PREFIX}_gate_decisions_total", f"{mc.PREFIX}_steps_total",
            f"{mc.PREFIX}_gate_step_time_seconds", f"{mc.PREFIX}_info"} <= used


def test_metrics_doc_names_every_series() -> None:
    text = (REPO / "docs" / "metrics.md").read_text()
    for name, _ in mc.COUNTERS.values():
        assert f"`{mc.PREFIX}_{name}_total`" in text, name
    for series in ("gate_step_time_seconds", "gate_step_samples", "info"):
        assert f"`{mc.PREFIX}_{series}`" in text, series


def test_sbo_served() -> None:
    from types import SimpleNamespace

    from sglang_overlap.planning.sbo_path import SboDecision, SboPath

    def s(sbo: bool, a2a: str = "deepep") -> SimpleNamespace:
        return SimpleNamespace(enable_single_batch_overlap=sbo, requested_a2a_backend=a2a)

    shared = SboDecision(SboPath.SHARED_EXPERT_ONLY, "no signal path")
    assert mc.sbo_served(s(False), shared) == ("off", "none")
    assert mc.sbo_served(s(True, "torch_a2a"), None) == ("torch_a2a", "torch_experts")
    assert mc.sbo_served(s(True), None) == ("upstream", "upstream")
    assert mc.sbo_served(s(True), shared) == ("shared_expert_only", "none")
    per_expert = SboDecision(SboPath.PER_EXPERT, "x", granularity="expert")
    path, producer = mc.sbo_served(s(True), per_expert)
    from sglang_overlap.kernels.down_gemm import deepgemm_signal_unavailable

    assert path == "per_expert"
    assert producer == ("triton" if deepgemm_signal_unavailable() else "patched_deepgemm")


DASHBOARD_VARIABLES = ("model_name", "engine_type", "instance", "dp_rank", "tp_rank")


def test_dashboard_variables_are_multi_select_with_all() -> None:
    import json

    dash = json.loads((REPO / "docs" / "grafana-sglang-overlap.json").read_text())
    found = {v["name"]: v for v in dash["templating"]["list"]}
    for name in DASHBOARD_VARIABLES:
        v = found[name]
        assert v["multi"] and v["includeAll"] and v["allValue"] == ".*", name
        assert v["definition"].startswith("label_values(sglang_overlap_info") and (
            v["definition"].endswith(f", {name})")), name


def test_every_dashboard_query_filters_by_every_variable_and_aggregates_over_ranks() -> None:
    """Each query keeps only the selected model, engine type, instance, DP and TP ranks
    (`label=~"$label"`, so "All" also matches a series without the label), and sums, averages
    or takes the max by labels that keep prefill and decode servers apart (engine_type) - never
    a bare series whose rows multiply with the ranks selected."""
    import json
    import re

    dash = json.loads((REPO / "docs" / "grafana-sglang-overlap.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 8
    for expr in exprs:
        for name in DASHBOARD_VARIABLES:
            assert f'{name}=~"${name}"' in expr, (name, expr)
        assert re.match(r"(sum|avg|max) by \(engine_type, ", expr), expr
        assert '="$' not in expr, expr  # an exact match would break multi-select
