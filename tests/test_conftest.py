"""`require_module`: a missing prerequisite skips a test file, or fails it under
SGLANG_OVERLAP_REQUIRE_E2E=1 (what CI sets), instead of skipping its tests silently."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PROBE = ("from tests.conftest import require_module\n"
         "require_module('no_such_module_for_the_probe')\n"
         "def test_never_runs():\n    raise AssertionError\n")


# rc 5: pytest found no test to run (the file skipped whole); 2: a collection error
@pytest.mark.parametrize(("require", "rc", "word"), [("0", 5, "skipped"), ("1", 2, "error")])
def test_a_missing_module_skips_or_fails(tmp_path: Path, require: str, rc: int,
                                         word: str) -> None:
    probe = REPO / "tests" / f"test_probe_require_{os.getpid()}_{require}.py"
    probe.write_text(PROBE)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "SGLANG_OVERLAP_REQUIRE_E2E": require})
    finally:
        probe.unlink()
    assert done.returncode == rc and word in done.stdout, done.stdout[-2000:]
    if require == "1":
        assert "no_such_module_for_the_probe" in done.stdout
