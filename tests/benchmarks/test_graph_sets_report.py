"""benchmarks/graph_sets_report.py on CPU: the capture, replay and selector tables of
bench_graph_sets.py from known numbers."""

from __future__ import annotations

import pytest

from benchmarks import gating_trace as gt
from benchmarks.graph_sets_report import capture_md, capture_rows, render, replay_md
from tests.benchmarks.test_gating_trace import GRAPHS, SIZES, cost, replayer


def test_report_tables() -> None:
    caps = [{"round": r, "modes": modes, "graphs": 7 * len(modes), "wall_s": w,
             "pool_bytes": 100 * len(modes) << 20, "reserved_delta": 0, "allocated_delta": 0}
            for r, w in ((0, 1.0), (1, 3.0)) for modes in (["none"], ["tbo", "none"])]
    rows = capture_rows(caps)
    assert [r["wall_s"] for r in rows] == [2.0, 2.0]
    md = capture_md(rows)
    assert "| tbo + none | 14 | 2.00 (1.00, 3.00) | 1.00x | 200.0 (200.0, 200.0) | 2.00x |" in md
    table = {(m, b): {"median": cost(m, b), "p10": 0.0, "p90": 0.0, "rel_vs_none": 0.0}
             for m, b in GRAPHS}
    assert "| 256 | 2024.0 [0.0-0.0] | 1416.8 [0.0-0.0] | 2428.8 [0.0-0.0] | tbo | 0.70x |" \
        in replay_md(table)
    trace = [1, 64, 256]
    runs = [gt.run_policy("auto", trace, SIZES, GRAPHS, replayer()[0],
                          gt.new_runtime(frozenset({"tbo", "sbo"}))) for _ in range(2)]
    sel = {"wall_ms": {"none": [3.0, 3.0], "tbo": [2.0, 2.2], "sbo": [4.0, 4.0],
                       "auto": [2.0, 2.0]},
           "steps_ms": {"none": [3.0, 3.0], "tbo": [2.0, 2.0], "sbo": [4.0, 4.0],
                        "auto": [2.0, 2.2]}, "auto_runs": runs}
    text, data = render({"card": "X"}, {"tbo@4": 1e-3}, caps, table, sel, trace, GRAPHS)
    assert data["selector"]["best_fixed_wall"] == "tbo"
    assert data["selector"]["oracle_ms"] == pytest.approx(
        (cost("sbo", 1) + cost("none", 64) + cost("tbo", 256)) / 1e3)
    assert "| auto | 2.0 | 1.049x [" in text
