"""kernels/signal_deepgemm/{headers,patching}.py on the CPU: each release's patch against that
release's own wheel (strict applier == GNU patch; the wheel untouched), a changed header refused,
the installed deep_gemm named."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from sglang_overlap.kernels.signal_deepgemm import headers
from sglang_overlap.kernels.signal_deepgemm.patching import apply_patch
from sglang_overlap.kernels.signal_deepgemm.versions import (
    KERNEL_HEADER,
    RELEASES,
    DgSignalError,
    producer_for,
)


def test_patch_applies_to_the_release_it_names(release: tuple[str, Path], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    version, root = release
    source = headers.locate([str(root)])
    assert source.version == version and source.spec is RELEASES[version]
    header = source.include / KERNEL_HEADER
    before = hashlib.sha256(header.read_bytes()).hexdigest()
    patched = apply_patch(header.read_text(), headers.patch_text(source.spec))
    assert "int* signal" in patched and "kSignalStoreWarp" in patched
    assert "red_add_rel" in patched
    assert ("SF_GRAN" in patched) == (version != "0.1.4.post1"), version
    if shutil.which("patch"):  # the strict applier agrees with GNU patch
        work = tmp_path / "gnu"
        shutil.copytree(root / "deep_gemm" / "include", work / "deep_gemm" / "include")
        path = headers.PATCH_DIR / version / source.spec.patch
        subprocess.run(["patch", "-s", "-p1", "-d", str(work), "-i", str(path)], check=True)
        assert (work / "deep_gemm" / "include" / KERNEL_HEADER).read_text() == patched
    monkeypatch.setenv(headers.CACHE_ENV, str(tmp_path / "cache"))
    include = headers.prepared_include(source)
    assert (include / KERNEL_HEADER).read_text() == patched
    assert (include / "cute").is_dir() and (include / "cutlass").is_dir()
    assert hashlib.sha256(header.read_bytes()).hexdigest() == before, "the wheel was modified"
    assert headers.prepared_include(source) == include  # built once
    assert include.parent.name.startswith(f"{version}-")


def test_served_producer_reads_the_release(release: tuple[str, Path]) -> None:
    version, root = release
    assert headers.served_producer([str(root)]) == (version, *producer_for(
        version, RELEASES[version].header_sha256))


def test_a_changed_header_is_refused(release: tuple[str, Path], tmp_path: Path) -> None:
    version, root = release
    site = tmp_path / "site"
    shutil.copytree(root / "deep_gemm", site / "deep_gemm",
                    ignore=shutil.ignore_patterns("*.so", "cutlass", "cute"))
    for info in root.glob("*.dist-info"):
        shutil.copytree(info, site / info.name)
    header = site / "deep_gemm" / "include" / KERNEL_HEADER
    text = header.read_text().replace("Scheduler<kGemmType", "Scheduler< kGemmType", 1)
    header.write_text(text)
    with pytest.raises(DgSignalError, match="not the one the signal patch was made for"):
        headers.locate([str(site)])
    edited = text.replace("namespace deep_gemm {", "namespace deep_gemm  {", 1)  # hunk 1's context
    with pytest.raises(ValueError, match="patch hunk 1 does not match"):
        apply_patch(edited, headers.patch_text(RELEASES[version]))


def test_the_installed_deep_gemm_is_named() -> None:
    """Against whatever deep_gemm this environment has (sglang 0.5.23 installs 0.2.3.post2)."""
    version, producer, why = headers.served_producer()
    if version is None:
        assert headers.probe() == "deep_gemm is not installed"
        return
    assert f"deep_gemm {version}" in why
    if producer == "triton":
        assert headers.probe() == why


def test_apply_patch_is_strict() -> None:
    original = "a\nb\nc\nd\n"
    patch = "--- a/f\n+++ b/f\n@@ -1,3 +1,3 @@\n a\n-b\n+B\n c\n@@ -4 +4,2 @@\n d\n+e\n"
    assert apply_patch(original, patch) == "a\nB\nc\nd\ne\n"
    with pytest.raises(ValueError, match="hunk 1 does not match line 2"):
        apply_patch("a\nx\nc\nd\n", patch)
    with pytest.raises(ValueError, match="no hunk"):
        apply_patch(original, "just text\n")
