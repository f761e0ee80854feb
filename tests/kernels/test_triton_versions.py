"""kernels/triton_versions.py: the triton table's verdict per kernel and release, and the
installed version read from metadata. (That the table matches what the installed triton
compiles: test_triton_aot.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_overlap.compat import SGLANG_TRITON
from sglang_overlap.kernels import triton_versions
from sglang_overlap.kernels.triton_versions import (
    CHECKED,
    KERNELS,
    installed_triton,
    kernel_problem,
    oldest_building,
    release,
)


@pytest.mark.parametrize(("version", "builds"), [
    ("3.8.0", True), ("3.6.0", True), ("3.4.0", True), ("3.5.1", True),
    ("3.9.2", True),  # newer than every row: judged by 3.8.0
    ("3.7.0+gitabc123", True), ("3.4", True),
    ("3.3.1", False), ("3.3.9", False),  # judged by 3.3.1
    ("3.2.0", False), ("2.3.1", False),  # older than every row
])
@pytest.mark.parametrize("kernel", KERNELS)
def test_kernel_problem_table(kernel: str, version: str, builds: bool) -> None:
    problem = kernel_problem(kernel, version)  # type: ignore[arg-type]
    assert (problem is None) == builds, f"{kernel=} {version=} {problem=}"
    if problem is not None:  # names the kernel, the version and what to install
        assert f"triton {version}" in problem and triton_versions.WHAT[kernel] in problem
        assert f"pip install triton=={SGLANG_TRITON}" in problem, problem


def test_the_refusals_say_why() -> None:
    assert "NameError" in (kernel_problem("fused", "3.3.1") or "")
    assert "as 3.3.1" in (kernel_problem("fused", "3.3.9") or "")
    assert "older than every checked release" in (kernel_problem("sliced", "3.2.0") or "")
    assert "not installed" in (kernel_problem("silu_quant", None) or "")


def test_oldest_building_and_the_table() -> None:
    assert [oldest_building(k) for k in KERNELS] == ["3.4.0"] * 3
    versions = [release(r.version) for r in CHECKED]
    assert versions == sorted(set(versions)), "rows ascending, one per release"
    assert SGLANG_TRITON in {r.version for r in CHECKED}, "the installed release is a row"
    assert all(r.error for r in CHECKED if r.builds != frozenset(KERNELS)), "a refusal says why"


@pytest.mark.parametrize(("text", "want"), [
    ("3.6.0", (3, 6, 0)), ("3.6", (3, 6, 0)), ("3.6.0rc1", (3, 6, 0)), ("3.10.1", (3, 10, 1)),
    (" 3.8.0+git1", (3, 8, 0))])
def test_release(text: str, want: tuple[int, ...]) -> None:
    assert release(text) == want


def test_release_refuses_a_non_version() -> None:
    with pytest.raises(ValueError, match="not a triton version"):
        release("nightly")


def test_installed_triton_reads_the_metadata(tmp_path: Path) -> None:
    assert installed_triton([str(tmp_path)]) is None
    info = tmp_path / "triton-3.3.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triton\nVersion: 3.3.1\n")
    assert installed_triton([str(tmp_path)]) == "3.3.1"
    import importlib.metadata

    assert installed_triton() == importlib.metadata.version("triton")
