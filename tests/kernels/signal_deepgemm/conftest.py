"""The unpacked sgl-deep-gemm wheels the signal patches are made for (headers only).

Each release of `versions.RELEASES`: from $SGLANG_OVERLAP_DEEPGEMM_WHEELS/<version>/deep_gemm
(.ci/run unpacks them there), else downloaded once with pip into ~/.cache/sglang-overlap.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from sglang_overlap.kernels.signal_deepgemm.versions import KERNEL_HEADER, RELEASES
from tests.conftest import prerequisite_missing

WHEELS_ENV = "SGLANG_OVERLAP_DEEPGEMM_WHEELS"


def _fetch(version: str, target: Path) -> str | None:
    """Download sgl-deep-gemm==`version` (headers + an extension we never load) and unpack its
    deep_gemm/ folder, .so files left out, into `target`; None or why not."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", "--platform",
             "manylinux2014_x86_64", "--platform", "manylinux_2_28_x86_64", "-d", tmp,
             f"sgl-deep-gemm=={version}"],
            capture_output=True, text=True, timeout=300)
        wheels = list(Path(tmp).glob(f"sgl_deep_gemm-{version}-*.whl"))
        if proc.returncode or not wheels:
            return f"pip download sgl-deep-gemm=={version} failed: {proc.stderr.strip()[-300:]}"
        staging = Path(tmp) / "unpacked"
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(staging, [n for n in zf.namelist() if n.startswith("deep_gemm/")
                                    and not n.endswith(".so")])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(target))
    return None


def release_root(version: str) -> Path:
    """A folder holding the release's deep_gemm/ (a search path for `headers.locate`)."""
    base = os.environ.get(WHEELS_ENV)
    if base:
        path = Path(base) / version
    else:
        path = Path(os.path.expanduser(f"~/.cache/sglang-overlap/sgl-deep-gemm-{version}"))
        if not (path / "deep_gemm" / "include" / KERNEL_HEADER).is_file():
            why = _fetch(version, path)
            if why is not None:
                prerequisite_missing(f"{why} (or set {WHEELS_ENV} to unpacked wheels)")
    if not (path / "deep_gemm" / "include" / KERNEL_HEADER).is_file():
        prerequisite_missing(f"{path} holds no sgl-deep-gemm {version} headers ({WHEELS_ENV})")
    return path


@pytest.fixture(scope="module", params=sorted(RELEASES))
def release(request: pytest.FixtureRequest) -> tuple[str, Path]:
    """(version, folder holding its unpacked deep_gemm/), once per release in the table."""
    return request.param, release_root(request.param)
