"""kernels/signal_deepgemm/versions.py: the release table and the serving rule (pure)."""

from __future__ import annotations

import re

import pytest

from sglang_overlap.kernels.signal_deepgemm.headers import PATCH_DIR
from sglang_overlap.kernels.signal_deepgemm.versions import (
    KERNEL_HEADER,
    RELEASES,
    producer_for,
)

SHA = {v: r.header_sha256 for v, r in RELEASES.items()}


def test_the_releases_sglang_installs_are_covered() -> None:
    assert set(RELEASES) == {"0.1.4.post1", "0.2.3.post2", "0.2.5"}


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_an_exact_row_serves_the_patched_kernel(version: str) -> None:
    producer, why = producer_for(version, SHA[version])
    assert producer == "deepgemm" and f"deep_gemm {version}" in why


@pytest.mark.parametrize(("version", "sha", "match"), [
    (None, None, "deep_gemm is not installed"),
    ("0.2.4", SHA["0.2.5"], r"deep_gemm 0.2.4: the SBO signal patch covers 0.1.4.post1, "
                            r"0.2.3.post2, 0.2.5"),
    ("0.2.5", None, f"deep_gemm 0.2.5 ships no {KERNEL_HEADER}"),
    ("0.2.5", SHA["0.2.3.post2"], r"not the one the signal patch was made for \(sha256 "
                                  r"f07c18a72de0 != 265f2f263534\)"),
    ("0.2.3.post2", "0" * 64, "not the one the signal patch was made for"),
])
def test_anything_else_serves_triton_saying_why(version: str | None, sha: str | None,
                                                match: str) -> None:
    producer, why = producer_for(version, sha)
    assert producer == "triton" and re.search(match, why), f"{version=} {why=}"


@pytest.mark.parametrize("version", sorted(RELEASES))
def test_each_patch_file_names_its_release_and_header(version: str) -> None:
    release = RELEASES[version]
    path = PATCH_DIR / version / release.patch
    head = path.read_text().split("--- a/", 1)[0]
    assert f"sgl-deep-gemm {version} exactly" in head
    assert f"sha256 {release.header_sha256}" in head
    assert release.template_tail and all(arg.strip() for arg in release.template_tail)
