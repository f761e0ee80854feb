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
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from sglang_overlap.compat import SGLANG_TRITON, SUPPORTED_SGLANG

Kernel = Literal["fused", "sliced", "silu_quant"]
KERNELS: tuple[Kernel, ...] = ("fused", "sliced", "silu_quant")
WHAT: dict[Kernel, str] = {
    "fused": "the fused Triton SBO producer (kernels/signal_fused.py)",
    "sliced": "the sliced SBO producer's signal store (kernels/signal_sliced.py)",
    "silu_quant": "the SiLU-and-mul + fp8 quant kernel (kernels/fp8.py)",
}
RECOMMENDED = SGLANG_TRITON
"""What to install: the triton the supported SGLang installs."""


@dataclass(frozen=True)
class TritonCheck:
    """One triton release, compiled against."""

    version: str
    builds: frozenset[Kernel]
    error: str = ""
    """Where a kernel does not build: the error, in a few words (what users are told)."""


_ALL = frozenset(KERNELS)
_NONE: frozenset[Kernel] = frozenset()

CHECKED: tuple[TritonCheck, ...] = (
    # the kernels are defined inside the function that imports triton.language (a lazy
    # import); triton before 3.4 resolves a kernel's names in its module globals only
    TritonCheck("3.3.1", _NONE, "NameError: triton before 3.4 does not see the kernel's lazily "
                "imported triton.language"),
    TritonCheck("3.4.0", _ALL),
    TritonCheck("3.5.1", _ALL),
    TritonCheck("3.6.0", _ALL),
    TritonCheck("3.8.0", _ALL),
)


def oldest_building(kernel: Kernel) -> str:
    """The oldest checked release that builds `kernel`."""
    return min((r.version for r in CHECKED if kernel in r.builds), key=release)


def release(version: str) -> tuple[int, ...]:
    """(3, 6, 0) of "3.6.0", "3.6.0+git1234" or "3.6.0rc1" (the numeric release only)."""
    match = re.match(r"\d+(?:\.\d+)*", version.strip())
    if match is None:
        raise ValueError(f"not a triton version: {version!r}")
    parts = tuple(int(p) for p in match.group(0).split("."))
    return parts + (0,) * (3 - len(parts))


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
