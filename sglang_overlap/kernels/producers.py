"""Which SBO down-GEMM producer serves here, in one line, for `sglang-overlap check` and the
server's start-up log (files and package metadata only: no torch, no triton, no GPU).

The rule per shape is `down_gemm.choose_signal_path`; this says which of its producers are in
play: the patched DeepGEMM kernel (`signal_deepgemm.probe` says why not), the fused Triton
kernel and the DeepGEMM slices (their Triton kernels: `triton_versions`).
"""

from __future__ import annotations

from dataclasses import dataclass

from sglang_overlap.kernels.triton_versions import kernel_problem


@dataclass(frozen=True)
class Producers:
    """What can produce the SBO signals here, and the one line saying which serves."""

    serves: str
    patched_deepgemm: str | None
    """Why the patched DeepGEMM kernel cannot serve (None: it serves)."""
    fused: str | None
    """Why the fused Triton kernel cannot build (None: it can)."""
    sliced: str | None
    """Why the DeepGEMM slices' signal store cannot build (None: it can)."""

    def to_dict(self) -> dict[str, str | None]:
        return {"serves": self.serves, "patched_deepgemm": self.patched_deepgemm,
                "fused_triton": self.fused, "sliced": self.sliced}


def sbo_producers(patched_why_not: str | None, *, triton_installed: bool,
                  triton_version: str | None) -> Producers:
    """The producers for a patched-DeepGEMM verdict (`signal_deepgemm.probe`, None: it serves)
    and the installed triton (`triton_version` None with `triton_installed`: a version that
    cannot be read, taken to build)."""
    fused = sliced = None
    if not triton_installed or triton_version is not None:
        fused = kernel_problem("fused", triton_version)
        sliced = kernel_problem("sliced", triton_version)
    capacity = "capacities that are not a multiple of 64"
    if sliced is not None:  # every path falls back to the slices: no signal GEMM without them
        return Producers(f"none: {sliced}", patched_why_not, fused, sliced)
    if patched_why_not is None:
        rest = (f"the fused Triton kernel at {capacity}" if fused is None else
                f"none at {capacity} ({fused})")
        return Producers(f"the patched DeepGEMM kernel; {rest}", None, fused, sliced)
    why = f"the patched DeepGEMM kernel cannot: {patched_why_not}"
    if fused is None:
        line = f"the fused Triton kernel or DeepGEMM slices, by shape (producer table); {why}"
    else:
        line = f"DeepGEMM slices (none at {capacity}), not the fused Triton kernel ({fused}); {why}"
    return Producers(line, patched_why_not, fused, sliced)
