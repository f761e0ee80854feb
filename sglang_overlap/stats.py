"""Per-mode counters: evidence, in the server's own log, of which overlap path ran.

The glue counts every forward step by the path it took ("tbo"; "two_chunk": a TBO step that cut
one request in two chunks; "sbo", "none"; "gate_<mode>": the mode selector's decisions). The
first time a path runs in a process, and then every `LOG_EVERY` steps, one INFO line goes to the
`sglang_overlap` logger:

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



# Labelled counters, exported by the metrics glue (SGLang's /metrics) and read by tests. Each
# series has fixed label names; `add` refuses an unknown series or a wrong number of labels.
SERIES: dict[str, tuple[str, ...]] = {
    "steps": ("phase", "mode", "runner"),        # every forward step: runner "graph" | "eager"
    "eager_fallbacks": ("mode", "reason"),      # a step in the graph range that ran eager
    "decisions": ("phase", "mode"),             # --overlap-gating auto: the selector's mode
    "decision_changes": ("phase",),             # ... that differed from the previous step's
    "explored_steps": ("phase", "mode"),        # ... chosen to measure a mode
    "sbo_producer_launches": ("producer",),     # SBO down GEMMs issued on the host, by producer
}
Labels = tuple[str, ...]
_series: dict[str, Counter[Labels]] = {name: Counter() for name in SERIES}


def add(series: str, *labels: str, n: int = 1) -> None:
    """Add `n` to the counter of `series` at `labels` (one value per name in `SERIES[series]`)."""
    names = SERIES.get(series)
    if names is None:
        raise KeyError(f"unknown stats series {series!r}; known: {', '.join(SERIES)}")
    if len(labels) != len(names):
        raise ValueError(f"stats series {series!r} takes labels {names}, got {labels}")
    _series[series][labels] += n


def snapshot() -> dict[str, dict[Labels, int]]:
    """A copy of every labelled counter: {series: {labels: count}}, zero counts left out."""
    return {name: {k: v for k, v in c.items() if v} for name, c in _series.items()}
