"""The deep_gemm releases the plugin's DeepGEMM signal patch covers: the table as data.

One row per release: the exact sha256 of its `sm90_fp8_gemm_1d2d.cuh`, the patch file (package
data of `kernels/signal_deepgemm`, one folder per version), and the template arguments the
release's kernel takes between `cd_dtype_t` and the patch's signal parameters. Supporting another
release is one row here and one patch file. Pure data, below both its readers:
`kernels/signal_deepgemm/` (which builds and serves the patched kernel) and `compat.py` (the
compatibility table, which must not import the kernels).
"""

from __future__ import annotations

from dataclasses import dataclass

KERNEL_HEADER = "deep_gemm/impls/sm90_fp8_gemm_1d2d.cuh"
PATCH_FILE = "sm90_fp8_gemm_1d2d.signal.patch"

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


__all__ = ["KERNEL_HEADER", "PATCH_FILE", "RELEASES", "Release"]
