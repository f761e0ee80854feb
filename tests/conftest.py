"""Fixtures shared by every test folder."""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType

import pytest

from tests.kit import KitMissing, build_tiny_dsv3

REPO = Path(__file__).resolve().parents[1]
# The first 50 problems of the GSM8K test set (MIT, OpenAI: tests/data/gsm8k/LICENSE).
GSM8K_SAMPLE = REPO / "tests" / "data" / "gsm8k" / "test-first50.jsonl"


def prerequisite_missing(reason: str) -> None:
    """Skip, or fail under SGLANG_OVERLAP_REQUIRE_E2E=1 (set by .ci/run)."""
    if os.environ.get("SGLANG_OVERLAP_REQUIRE_E2E") == "1":
        pytest.fail(f"test prerequisites missing (SGLANG_OVERLAP_REQUIRE_E2E=1): {reason}")
    pytest.skip(reason)


def require_module(name: str, reason: str = "sglang 0.5.23 is not installed") -> ModuleType:
    """`pytest.importorskip` at module level, except that under SGLANG_OVERLAP_REQUIRE_E2E=1 a
    missing module fails the file instead of skipping every test in it."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        missing = f"{reason} ({name}: {exc})"
    if os.environ.get("SGLANG_OVERLAP_REQUIRE_E2E") == "1":
        pytest.fail(f"test prerequisites missing (SGLANG_OVERLAP_REQUIRE_E2E=1): {missing}",
                    pytrace=False)
    pytest.skip(missing, allow_module_level=True)


@pytest.fixture(scope="session")
def tiny_dsv3() -> Path:
    """A tiny random DeepSeek-V3 checkpoint (3 layers, 8 routed + 1 shared expert, top-2), built
    once by tests/kit/make_tiny_dsv3.py into the kit's cache."""
    try:
        return build_tiny_dsv3()
    except KitMissing as exc:
        reason = f"tiny DeepSeek-V3: {exc}"
    prerequisite_missing(reason)  # outside the except: the failure shows this line alone
    raise AssertionError("not reached")


@pytest.fixture(scope="session")
def gsm8k_sample() -> Path:
    return GSM8K_SAMPLE
