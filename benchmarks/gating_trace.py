"""The mode selector over a decode trace, on any step runner: the pure-Python half of
benchmarks/bench_graph_sets.py (no torch here; the GPU half replays CUDA graphs).

* `decode_trace`: batch sizes of a decode server whose load drifts (requests arrive at a rate
  that swings between a low and a high target, each leaves after a geometric number of steps).
* `padded_size`: the captured batch size a step replays (SGLang pads up to the next one).
* `run_policy`: one pass over the trace. A fixed policy runs its mode wherever it can run (TBO
  needs a split: at least two sequences and a TBO graph), else none. "auto" runs the plugin's
  real `ModeSelector` fed through its real `SelectorRuntime` the way the server does
  (`tick`, `decide(phase, tokens, available)`, `timed_cell(decision)`, then the step's two
  timing events handed to `push_events`, read once completed; measurements merged every
  `sync_steps` steps by the all-reduce transport, which on one rank is a no-op sum).
* `summarize`: per policy and round, the total step time, and the ratios the report prints.

Times: microseconds. A step runner is `replay(mode, padded_bs) -> (start, end)`, two events
with CUDA's `query()` and `elapsed_time(other)` (milliseconds) interface.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sglang_overlap.cli.bench_stats import paired_ratio
from sglang_overlap.modes import Mode, Phase
from sglang_overlap.planning.cost.prior import FlatPrior
from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
from sglang_overlap.planning.two_batch import ForwardKind, split_overlaps
from sglang_overlap.sglang.selector_runtime import SelectorRuntime

FIXED = ("none", "tbo", "sbo")
Replay = Callable[[str, int], tuple[Any, Any]]


class FakeEvent:
    """An event with CUDA's `query` / `elapsed_time` (ms) interface on a fake clock in us
    (`done`: what `query` answers)."""

    def __init__(self, t: float, done: bool = True) -> None:
        self.t, self.done = t, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.t - self.t) / 1e3


def decode_trace(steps: int, max_bs: int, *, seed: int = 0, mean_len: int = 96,
                 period: int = 1500, low: int = 1) -> list[int]:
    """`steps` decode batch sizes in [1, max_bs]. The arrival rate targets a load that swings
    between `low` and `max_bs` running requests over `period` steps (a raised cosine); each
    request stays a geometric number of steps with mean `mean_len`."""
    if steps < 1 or max_bs < 1 or mean_len < 1 or period < 2 or not 1 <= low <= max_bs:
        raise ValueError(f"decode_trace: steps, max_bs, mean_len >= 1, period >= 2, "
                         f"1 <= low <= max_bs (got {steps}, {max_bs}, {mean_len}, {period}, "
                         f"{low})")
    rng = random.Random(seed)
    active, out = 0, []
    for t in range(steps):
        target = low + (max_bs - low) * (1 - math.cos(2 * math.pi * t / period)) / 2
        active -= sum(rng.random() < 1 / mean_len for _ in range(active))
        active += _poisson(rng, target / mean_len)
        active = min(max(active, 1), max_bs)
        out.append(active)
    return out


def _poisson(rng: random.Random, lam: float) -> int:
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


def padded_size(bs: int, sizes: Sequence[int]) -> int:
    """The smallest captured size >= bs (ValueError above the largest: eager in SGLang)."""
    fits = [s for s in sizes if s >= bs]
    if not fits:
        raise ValueError(f"batch size {bs} is above the largest captured size {max(sizes)}")
    return min(fits)


def available(bs: int, padded: int, graphs: frozenset[tuple[str, int]]) -> frozenset[Mode]:
    """The overlap modes a step of `bs` sequences can replay (none always can)."""
    out = {Mode.SBO} if (Mode.SBO, padded) in graphs else set()
    if split_overlaps(ForwardKind.DECODE, bs) and (Mode.TBO, padded) in graphs:
        out.add(Mode.TBO)
    return frozenset(out)


def new_runtime(modes: frozenset[Mode], config: SelectorConfig | None = None,
                sync_steps: int = 16) -> SelectorRuntime:
    """The server's selector with a flat prior (measured replay times alone decide)."""
    selector = ModeSelector(FlatPrior(modes, "graph-set benchmark"), config)
    return SelectorRuntime(selector, sync_steps=sync_steps, cuda=True, setup="bench",
                           transport="all_reduce", group=lambda: None)


@dataclass
class PassResult:
    """One policy's pass over the trace: per step, the mode run and its events."""

    policy: str
    modes: list[str] = field(default_factory=list)
    explored: list[bool] = field(default_factory=list)
    padded: list[int] = field(default_factory=list)
    events: list[tuple[Any, Any]] = field(default_factory=list)
    wall_s: float = 0.0  # set by the caller: host time of the pass, to the last step's end

    def step_us(self) -> list[float]:
        return [s.elapsed_time(e) * 1e3 for s, e in self.events]

    def per_mode(self) -> dict[str, int]:
        return {m: self.modes.count(m) for m in FIXED if m in self.modes}


def run_policy(policy: str, trace: Sequence[int], sizes: Sequence[int],
               graphs: frozenset[tuple[str, int]], replay: Replay,
               runtime: SelectorRuntime | None = None) -> PassResult:
    """One pass of `policy` ("auto" needs `runtime`) over `trace`; `replay` runs each step."""
    if policy != "auto" and policy not in FIXED:
        raise ValueError(f"policy must be auto or one of {FIXED} (got {policy!r})")
    if policy == "auto" and runtime is None:
        raise ValueError("policy auto needs a SelectorRuntime (new_runtime)")
    res = PassResult(policy)
    for bs in trace:
        padded = padded_size(bs, sizes)
        can = available(bs, padded, graphs)
        explored, cell, mode = False, None, Mode.NONE
        if runtime is not None and policy == "auto":
            runtime.tick()
            decision = runtime.decide(Phase.DECODE, [bs], can)
            cell = runtime.timed_cell(decision)
            mode, explored = decision.mode, decision.explored
        else:
            mode = Mode(policy) if policy in can else Mode.NONE
        start, end = replay(mode, padded)
        if cell is not None and runtime is not None:
            runtime.push_events(cell, start, end)
        res.modes.append(mode)
        res.explored.append(explored)
        res.padded.append(padded)
        res.events.append((start, end))
    return res


def oracle_us(padded: Sequence[int], trace: Sequence[int], table: Mapping[tuple[str, int], float],
              graphs: frozenset[tuple[str, int]]) -> float:
    """Total time if every step ran the mode fastest in `table` (median replay us)."""
    return sum(min(table[m, p] for m in ("none", *available(bs, p, graphs)))
               for bs, p in zip(trace, padded, strict=True))


def explore_cost_us(res: PassResult, table: Mapping[tuple[str, int], float],
                    graphs: frozenset[tuple[str, int]], trace: Sequence[int]) -> float:
    """What auto's explored steps cost over the fastest mode at their size (median replays)."""
    return sum(table[m, p] - min(table[k, p] for k in ("none", *available(bs, p, graphs)))
               for m, p, bs, x in zip(res.modes, res.padded, trace, res.explored, strict=True)
               if x)


def summarize(totals: Mapping[str, Sequence[float]]) -> dict[str, Any]:
    """`totals[policy]`: one total per round (same rounds, any unit, lower is better) ->
    the best fixed policy (lowest sum) and each policy's throughput ratio to it (best / policy,
    per round; `paired_ratio` geometric mean with its 95% CI)."""
    fixed = [p for p in FIXED if p in totals]
    if not fixed:
        raise ValueError(f"summarize needs at least one fixed policy (got {sorted(totals)})")
    best = min(fixed, key=lambda p: sum(totals[p]))
    ratios = {}
    for p, series in totals.items():
        r = paired_ratio(totals[best], series)
        ratios[p] = {"ratio": r.ratio, "low": r.low, "high": r.high, "text": r.text()}
    return {"best_fixed": best, "ratios": ratios,
            "mean": {p: sum(s) / len(s) for p, s in totals.items()}}


__all__ = ["FIXED", "FakeEvent", "PassResult", "available", "decode_trace", "explore_cost_us",
           "new_runtime", "oracle_us", "padded_size", "run_policy", "summarize"]
