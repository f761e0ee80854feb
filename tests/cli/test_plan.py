"""Tests for `sglang-overlap plan` (cli/plan.py) and its timeline picture (cli/timeline.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_overlap.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_default_plan_recommends_sbo(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan"]) == 0
    out = capsys.readouterr().out
    assert "deepseek-v3 decode on H20: EP16 over 2 node(s) x 8 GPUs" in out
    assert "recommended: sbo" in out
    row = next(line for line in out.splitlines() if line.startswith("sbo "))
    assert "<- recommended" in row and "+6." in row, row


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["recommended"] == "sbo"
    for mode in ("none", "tbo", "sbo"):
        entry = data["modes"][mode]
        assert entry["throughput_per_gpu"] > 0 and isinstance(entry["gain_vs_none"], float)
    assert 0.037 <= data["modes"]["sbo"]["gain_vs_none"] <= 0.097
    assert data["modes"]["tbo"]["gain_vs_none"] < 0
    assert data["modes"]["none"]["gain_vs_none"] == 0.0


def test_flags_change_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--json", "--gpu", "H200", "--phase", "prefill", "--ep", "32",
                 "--tokens-per-gpu", "4096", "--context-len", "4096"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["gpu"] == "H200" and data["deployment"]["phase"] == "prefill"
    assert not data["modes"]["sbo"]["applicable"]
    assert data["modes"]["two_chunk"]["gain_vs_none"] > data["modes"]["tbo"]["gain_vs_none"]


def test_bad_gpu_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--gpu", "A100"]) == 2
    assert "unknown hardware profile 'A100'" in capsys.readouterr().out


def test_plot_writes_a_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "timeline.png"
    assert main(["plan", "--plot", str(png)]) == 0
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, len(data)
    assert str(png) in capsys.readouterr().out


def test_plan_imports_neither_torch_nor_sglang() -> None:
    """What keeps `plan` fast (0.25 s on an idle machine): no heavy import. Its speed itself is
    not asserted (a timed test fails on a loaded machine)."""
    code = ("import sys; from sglang_overlap.cli.main import main; rc = main(['plan']); "
            "heavy = [m for m in ('torch', 'sglang', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
