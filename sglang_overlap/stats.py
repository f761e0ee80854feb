"""Per-mode counters: evidence, in the server's own log, of which overlap path ran.

The glue counts every forward step by the path it took ("tbo", "two_chunk", "sbo", "none", plus
gate decisions). The first time a path runs in a process, and then every `LOG_EVERY` steps, one
INFO line goes to the `sglang_overlap` logger:

    sglang-overlap stats [pid 1234]: tbo=12 two_chunk=1 sbo=0 none=3 (first two_chunk)

Plain Python; no torch, no sglang.
"""

from __future__ import annotations

import logging
import os
from collections import Counter

logger = logging.getLogger("sglang_overlap")

LOG_EVERY = 256

_counts: Counter[str] = Counter()
_steps = 0


def count(path: str) -> None:
    """Record one step (or layer call) that took `path`."""
    global _steps
    first = path not in _counts
    _counts[path] += 1
    _steps += 1
    if first or _steps % LOG_EVERY == 0:
        logger.info("%s%s", summary(), f" (first {path})" if first else "")


def summary() -> str:
    body = " ".join(f"{k}={v}" for k, v in sorted(_counts.items()))
    return f"sglang-overlap stats [pid {os.getpid()}]: {body}"

