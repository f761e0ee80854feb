"""`sglang-overlap --version` and `python -m sglang_overlap --version`: one line, no heavy import,
the same version as the package metadata."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import sglang_overlap
from sglang_overlap.cli.main import main
from sglang_overlap.compat import SUPPORTED_SGLANG

ROOT = Path(__file__).resolve().parents[2]


def test_version_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out == f"sglang-overlap {sglang_overlap.__version__} (for sglang {SUPPORTED_SGLANG})\n"


def test_module_version_imports_nothing_heavy() -> None:
    code = ("import sys, runpy; sys.argv = ['sglang_overlap', '--version']\n"
            "try:\n    runpy.run_module('sglang_overlap', run_name='__main__')\n"
            "except SystemExit as e:\n"
            "    heavy = [m for m in ('torch', 'sglang', 'sglang_overlap.cli.check',\n"
            "                         'sglang_overlap.cli.bench') if m in sys.modules]\n"
            "    assert not heavy, heavy\n    raise")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"sglang-overlap {sglang_overlap.__version__} "), proc.stdout


def test_the_package_metadata_reads_the_one_version() -> None:
    """pyproject's version is `sglang_overlap.__version__` (dynamic), not a second copy."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "sglang_overlap.__version__"
    assert sglang_overlap.__version__ == "0.1.0"
