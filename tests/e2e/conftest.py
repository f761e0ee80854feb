"""Fixtures for tests that start real SGLang 0.5.23 servers on this CPU machine.

They use the CPU kit in ../shared/sglang-cpu (a libcuda stub, a test-only CPU shim plugin, Mooncake
over TCP and the smg router), prepared by `.ci/run` (or by hand: see the README). The kit's
directory is $SGLANG_CPU_KIT (default /tmp/sglang-cpu). Without it the e2e tests are skipped,
unless SGLANG_OVERLAP_REQUIRE_E2E=1 (set by .ci/run), where a missing kit is a failure.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("SGLANG_OVERLAP_SHARED", REPO.parent / "shared"))
KIT = Path(os.environ.get("SGLANG_CPU_KIT", "/tmp/sglang-cpu"))


def _missing(reason: str) -> None:
    if os.environ.get("SGLANG_OVERLAP_REQUIRE_E2E") == "1":
        pytest.fail(f"e2e prerequisites missing (SGLANG_OVERLAP_REQUIRE_E2E=1): {reason}")
    pytest.skip(reason)


def _read_env_sh(path: Path) -> dict[str, str]:
    """The kit's env.sh is a list of `export A=B [C=D ...]` lines; evaluate it with bash."""
    out = subprocess.run(
        ["bash", "-c", f"set -a; source {path}; env -0"], capture_output=True, check=True
    ).stdout.decode()
    base = dict(os.environ)
    return {k: v for k, v in (e.split("=", 1) for e in out.split("\0") if "=" in e)
            if base.get(k) != v}


@pytest.fixture(scope="session")
def sglang_cpu_env() -> dict[str, str]:
    """Environment variables (to add to os.environ) for SGLang servers on this CPU."""
    env_sh = KIT / "env.sh"
    if not env_sh.is_file():
        _missing(f"CPU kit not prepared: {env_sh} missing (run ../shared/sglang-cpu/setup.sh)")
    env = _read_env_sh(env_sh)
    env.setdefault("SGLANG_CPU_OMP_THREADS_BIND", "0|1")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


@pytest.fixture(scope="session")
def gsm8k_path() -> Path:
    path = SHARED / "data" / "gsm8k" / "test.jsonl"
    if not path.is_file():
        _missing(f"{path} not found")
    return path
