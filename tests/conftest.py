"""Fixtures shared by every test folder."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared beside the checkout (CI copies it there too); SGLANG_OVERLAP_SHARED overrides.
SHARED = Path(os.environ.get("SGLANG_OVERLAP_SHARED", REPO.parent / "shared"))


def prerequisite_missing(reason: str) -> None:
    """Skip, or fail under SGLANG_OVERLAP_REQUIRE_E2E=1 (set by .ci/run)."""
    if os.environ.get("SGLANG_OVERLAP_REQUIRE_E2E") == "1":
        pytest.fail(f"test prerequisites missing (SGLANG_OVERLAP_REQUIRE_E2E=1): {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_dsv3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random DeepSeek-V3 checkpoint (3 layers, 8 routed + 1 shared expert, top-2)."""
    maker = SHARED / "sglang-cpu" / "make_tiny_dsv3.py"
    if not maker.is_file():
        prerequisite_missing(f"{maker} not found")
    out = tmp_path_factory.mktemp("tiny-dsv3")
    subprocess.run([sys.executable, str(maker), str(out)], check=True, capture_output=True,
                   timeout=300)
    return out
