"""Which SBO signal producer a deep_gemm release gets (no torch, no deep_gemm).

The releases the signal patch is made for are a table of data, `planning/deepgemm_releases.py`
(re-exported here); `producer_for` is the whole serving rule.
"""

from __future__ import annotations

from typing import Literal

from sglang_overlap.planning.deepgemm_releases import KERNEL_HEADER, PATCH_FILE, RELEASES, Release

Producer = Literal["deepgemm", "triton"]
"""deepgemm: DeepGEMM's own kernel with the signal patch; triton: the plugin's producers (fused
Triton kernel, or unmodified DeepGEMM slices where its own launch works)."""


class DgSignalError(RuntimeError):
    """The patched DeepGEMM producer cannot run here (says why)."""


def producer_for(version: str | None, header_sha256: str | None) -> tuple[Producer, str]:
    """(the SBO signal producer served with this deep_gemm, one line saying why).

    `version` None: deep_gemm is not installed; `header_sha256` None: the release ships no
    `KERNEL_HEADER`. Only an exact (version, header) row of `RELEASES` serves the patched kernel
    (nvcc and a CUDA driver are checked separately, at build time)."""
    covered = ", ".join(RELEASES)
    if version is None:
        return "triton", "deep_gemm is not installed"
    release = RELEASES.get(version)
    if release is None:
        return "triton", (f"deep_gemm {version}: the SBO signal patch covers {covered} "
                          "(kernels/signal_deepgemm/patches/)")
    if header_sha256 is None:
        return "triton", f"deep_gemm {version} ships no {KERNEL_HEADER}"
    if header_sha256 != release.header_sha256:
        return "triton", (f"deep_gemm {version}'s {KERNEL_HEADER} is not the one the signal "
                          f"patch was made for (sha256 {header_sha256[:12]} != "
                          f"{release.header_sha256[:12]})")
    return "deepgemm", f"deep_gemm {version}: DeepGEMM's kernel with the signal patch"


__all__ = ["KERNEL_HEADER", "PATCH_FILE", "RELEASES", "DgSignalError", "Producer", "Release",
           "producer_for"]
