"""Which triton releases build the plugin's Triton kernels, as a table (no torch, no triton).

The kernels: `fused` (`signal_fused.py`, the fused SBO producer), `sliced` (`signal_sliced.py`,
the signal store after each DeepGEMM slice: the sliced producer) and `silu_quant` (`fp8.py`, the
DeepGEMM expert runner's SiLU-and-mul + fp8 quant). Each row is one release on which every
specialisation the plugin launches was compiled ahead of time for sm_90a with that release's own
compiler and ptxas, on a machine without a GPU (the source repository's AOT compile test, which
also asserts, for the installed triton, that each kernel compiles exactly when `kernel_problem`
says it builds; its results file records each run).

A release between rows is judged by the nearest row below it (a kernel that builds on a release
is taken to build on the next ones: CI compiles every kernel on the triton SGLang installs); a
release older than every row is refused. The installed version is read from the package's
metadata: nothing is imported.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Sequence

from sglang_overlap.compat import SGLANG_TRITON, SUPPORTED_SGLANG
from sglang_overlap.planning.triton_releases import (
    CHECKED,
    KERNELS,
    Kernel,
    TritonCheck,
    oldest_building,
    release,
)

WHAT: dict[Kernel, str] = {
    "fused": "the fused Triton SBO producer (kernels/signal_fused.py)",
    "sliced": "the sliced SBO producer's signal store (kernels/signal_sliced.py)",
    "silu_quant": "the SiLU-and-mul + fp8 quant kernel (kernels/fp8.py)",
}
RECOMMENDED = SGLANG_TRITON
"""What to install: the triton the supported SGLang installs."""


def installed_triton(search_path: Sequence[str] | None = None) -> str | None:
    """The installed triton's version (None: not installed), from its metadata."""
    dists = (importlib.metadata.distributions(name="triton") if search_path is None else
             importlib.metadata.distributions(name="triton", path=list(search_path)))
    for dist in dists:
        return str(dist.version)
    return None


def _row(version: str) -> TritonCheck | None:
    """The row that judges `version`: its own, else the nearest one below it."""
    below = [r for r in CHECKED if release(r.version) <= release(version)]
    return max(below, key=lambda r: release(r.version)) if below else None


def kernel_problem(kernel: Kernel, version: str | None) -> str | None:
    """None when triton `version` builds `kernel`, else one line naming the kernel, the version
    and what to install."""
    fix = f"pip install triton=={RECOMMENDED} (what sglang {SUPPORTED_SGLANG} installs)"
    if version is None:
        return f"{WHAT[kernel]} needs triton, which is not installed: {fix}"
    row = _row(version)
    if row is None:
        return (f"{WHAT[kernel]} is not checked on triton {version}, older than every checked "
                f"release ({', '.join(r.version for r in CHECKED)}): {fix}")
    if kernel in row.builds:
        return None
    judged = "" if row.version == version else f", as {row.version} (the nearest checked below)"
    return f"{WHAT[kernel]} does not build on triton {version} ({row.error}{judged}): {fix}"


__all__ = ["CHECKED", "KERNELS", "RECOMMENDED", "WHAT", "Kernel", "TritonCheck",
           "installed_triton", "kernel_problem", "oldest_building", "release"]
