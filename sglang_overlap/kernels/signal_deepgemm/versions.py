"""The deep_gemm releases the signal patch is made for, as a table (no torch, no deep_gemm).

One row per release: the exact sha256 of its `sm90_fp8_gemm_1d2d.cuh`, the patch file under
`patches/<version>/` next to this module (package data), and the template arguments the release's
kernel takes between `cd_dtype_t` and the patch's signal parameters. Supporting another release is
one row and one patch file; `producer_for` is the whole serving rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

KERNEL_HEADER = "deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"
PATCH_FILE = "sm90_fp8_gemm_1d2d.signal.patch"

Producer = Literal["deepgemm", "triton"]
"""deepgemm: DeepGEMM's own kernel with the signal patch; triton: the plugin's producers (fused
Triton kernel, or unmodified DeepGEMM slices where its own launch works)."""


class DgSignalError(RuntimeError):
    """The patched DeepGEMM producer cannot run here (says why)."""


@dataclass(frozen=True)
class Release:
    """One deep_gemm release the signal patch covers."""

    version: str
    header_sha256: str
    """sha256 of `KERNEL_HEADER` exactly as the release's wheel ships it."""
    template_tail: tuple[str, ...]
    """Template arguments after `cd_dtype_t` and before the signal parameters."""
    patch: str = PATCH_FILE
    """File under `headers.PATCH_DIR`/<version>/."""


_IDENTITY = "epilogue::transform::EpilogueIdentity"

RELEASES: dict[str, Release] = {r.version: r for r in (
    # kernel template ends `cd_dtype_t, epilogue_type_t`
    Release("0.1.4.post1", "8667552aeb0f56be360bf71bcaeacd1d252cfc0cd12a7c555ae747e68bb64e8d",
            (_IDENTITY,)),
    # `cd_dtype_t, epilogue_op_t, uint32_t SF_GRAN = 128` (the supported sglang's pin)
    Release("0.2.3.post2", "f07c18a72de0633d2e1844b03f8b04038ecbed70a919a5ce6a1b95111a56bd20",
            (_IDENTITY, "128")),
    # `cd_dtype_t, uint32_t SF_GRAN = 128` (no epilogue type)
    Release("0.2.5", "265f2f263534a188bf75036c70a20a34d15d4111aa30007363cb8b9778bd7a7c",
            ("128",)),
)}


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
