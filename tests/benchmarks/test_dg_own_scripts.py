"""Issue 35's GPU scripts on the CPU: argument parsing, tables and the tuner's file, no GPU.

benchmarks/bench_dg_releases.py (DeepGEMM's own launch as the baseline), benchmarks/
tune_producer.py (a GPU's producer table).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import bench_dg_releases as bench
from benchmarks import tune_producer as tune
from sglang_overlap.planning.producer_tables import parse_producer_tables

REPO = Path(__file__).resolve().parents[2]
RAW = REPO / "benchmarks" / "results" / "raw" / "h100_dg_releases" / "releases_0.2.3.post2.json"
H200 = REPO / "sglang_overlap" / "profiles" / "producer-H200.json"


def row(rows: int, served: float, expert: float, served_us: float) -> dict:
    return {"E": 8, "C": max(64, rows), "rows": rows, "base": "dg", "bytes": 3.0e6 * 30,
            "dg_us": 30.0, "dg_ratio": 1.0, "tiles_us": 29.0, "tiles_ratio": 0.97,
            "served_us": served_us, "served_ratio": served, "served_expert_us": served_us,
            "served_expert_ratio": expert, "served_config": "64x112x9+store",
            "tiles_best": "64x112x9", "checks": {"dg": True, "served": True}}


@pytest.mark.parametrize(("r", "want"), [
    (row(64, 1.000, 0.999, 30.0), "met"),  # 3 TB/s = 100 % of copy
    (row(32, 1.004, 0.999, 30.0), "missed: block 1.004"),
    (row(64, 0.99, 1.0, 40.0), "missed: copy 75 %"),
    (row(128, 1.02, 1.021, 30.0), "missed: expert 1.021"),
    (row(256, 1.0204, 1.0196, 50.0), "met"),  # no copy target past 64 rows
])
def test_targets_per_shape(r: dict, want: str) -> None:
    assert bench.targets(r, copy=3.0) == want


def test_targets_need_deepgemms_own_launch_as_the_base() -> None:
    assert bench.targets({**row(64, 1.0, 1.0, 30.0), "base": "tiles"}, copy=3.0) == "-"


def test_the_table_has_the_best_tile_beside_the_served_producer() -> None:
    text = bench.table([{**row(64, 1.0, 0.999, 30.0), "dg_diff": 2e-7},
                        {"E": 8, "C": 64, "rows": 32, "error": "boom"}], 3.0, "header")
    lines = text.splitlines()
    assert lines[0] == "header" and "3.00 TB/s" in lines[2]
    head, rule, first, failed = lines[4:8]
    assert "| base | base us | best tile us | / base | served us | / base |" in head
    assert head.count("|") == rule.count("|") == first.count("|")
    assert "| 8 | 64 | 64 | dg | 30.0 | 29.0 | 0.970 | 30.0 | 1.000 |" in first
    assert first.endswith("| 100 / 100 | met | ok (DG calc_diff 2e-07) |")
    assert "error: boom" in failed


def test_an_earlier_run_renders_from_its_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--table-from", str(RAW)]) == 0
    out = capsys.readouterr().out
    assert out.count("| 8 | 64 | 32 | tiles |") == 1 and "| - | ok |" in out


def test_dry_run_and_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--dry-run", "--skip", "sliced", "--shapes", "8x64x32,32x256x256"]) == 0
    out = capsys.readouterr().out
    assert "2 shapes" in out and "'sliced'" not in out and "'tiles'" in out
    with pytest.raises(SystemExit):
        bench.main(["--dry-run", "--skip", "slicd"])
    assert bench.parse_shapes("none") == [] and len(bench.parse_shapes(None)) == 12


def result(e: int, rows: int, block_n: int) -> dict:
    cell = {"block_m": 64, "block_n": block_n, "signal": "deferred", "multicast": 2,
            "multicast_on_a": False}
    return {"E": e, "rows": rows, "winner": f"64x{block_n}", "winner_us": 40.0 + e,
            "finalists_us": {f"64x{block_n}": 40.0 + e}, "cell": cell}


ENV = {"device": "NVIDIA H800", "sms": 132, "driver": "580", "torch": "2.11.0+cu130",
       "cuda": "13.0", "nvcc": "13.0.88", "deep_gemm": "0.2.3.post2"}


def test_the_tuner_writes_a_table_that_parses(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    base = json.loads(H200.read_text())
    results = [result(e, m, 112 if e == 8 else 128) for e in (8, 32) for m in (32, 256)]
    data = tune.table_file(results, ENV, "H800", base)
    tables = parse_producer_tables(data, "producer-H800.json")
    assert tables.gpu == "H800" and tables.dg_tiles.experts == (8, 32)
    assert tables.dg_tiles.rows == (32, 256)
    assert tables.dg_tile(9, 33).block_n == 128 and tables.dg_tile(8, 1).signal == "deferred"
    prov = tables.dg_tiles.provenance
    assert prov["status"] == "measured" and "NVIDIA H800 (132 SMs)" in prov["gpu"]
    assert "0.2.3.post2" in prov["release"] and "13.0.88" in prov["where"]
    for key in ("fused", "fallback"):  # kept from the H200, and said so
        assert getattr(tables, key).provenance["status"] == (
            "provisional: copied from H200, not measured on H800")
        assert getattr(tables, key).cells == getattr(
            parse_producer_tables(base, "h200"), key).cells
    path = tmp_path / "producer-H800.json"
    path.write_text(json.dumps(data))
    assert tune.main(["--show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "| <= 8 | <= 32 | 64x112+mcB | deferred | 48.0 | 64x112 48.0 |" in out
    assert "| > 8 | > 32 | 64x128+mcB |" in out
    with pytest.raises(RuntimeError, match=r"no winner for \[\(32, 256\)\]"):
        tune.table_file(results[:-1], ENV, "H800", base)


def test_the_tuners_plan(capsys: pytest.CaptureFixture[str]) -> None:
    assert tune.main(["--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "E 8 x 32 rows (C 64): 24 candidates" in out and "E 32 x 256 rows (C 256): 48" in out
    assert "147 patched-kernel instantiations at 132 SMs" in out
    assert {c.store_warp for c in tune.candidates(64)} == {True, False}
    assert not any(c.eager for c in tune.candidates(256))
