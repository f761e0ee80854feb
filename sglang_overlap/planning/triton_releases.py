"""Which triton releases build the plugin's Triton kernels: the table as data (pure Python).

`kernels/triton_versions.py` judges the installed triton by it (and says why); `compat.py`'s
compatibility table names the oldest release that builds the sliced producer. Kept here, below
both, so that the compatibility table never imports the kernels.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Kernel = Literal["fused", "sliced", "silu_quant"]
KERNELS: tuple[Kernel, ...] = ("fused", "sliced", "silu_quant")


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


__all__ = ["CHECKED", "KERNELS", "Kernel", "TritonCheck", "oldest_building", "release"]
