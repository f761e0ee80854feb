"""How long planning takes on the CPU: TBO plans per decode step and prefill batch, and the gate.

Plain script; prints a table of the median time per call, and each target met or missed:

    .venv/bin/python benchmarks/bench_planning.py [--repeat 7] [--seed 0]

Decode rows: "cached" is the steady state (every decode step of a batch size seen before reuses
one immutable plan), "cold" plans a batch size for the first time, "seq_lens" also slices the
per-sequence lengths into the children (O(bs)). Prefill rows: seeded random extend lengths
(1..4096 tokens per request, random cached prefixes) with the two-chunk threshold at 0.48.
Selector rows: one step of --overlap-gating auto's planning work: `ModeSelector.decide` on the
all-gathered token counts of 16 ranks, recording the step's time into the local table, and every
16th step taking the new measurements out of it and merging them, sparse (`StepTable.take`,
`Gate.merge_cells`: what the glue does with the share that rides SGLang's request broadcast; the
broadcast itself is SGLang's, not timed here).

Targets: a full decode plan with sequence lengths at batch 256 <= 5 us; a prefill plan of 64
requests <= 20 us; a gate decision with its measurement bookkeeping <= 10 us.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from sglang_overlap.modes import Mode, Phase
from sglang_overlap.planning import two_batch
from sglang_overlap.planning.cost.prior import CostModelPrior, FlatPrior, Prior
from sglang_overlap.planning.cost.profiles import Deployment, load_hardware, load_model
from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
from sglang_overlap.planning.step_table import StepTable, cell_index
from sglang_overlap.planning.two_batch import ForwardKind, plan_two_batch

DECODE_BATCHES = (1, 64, 256, 1024)
PREFILL_REQUESTS = (1, 2, 4, 8, 16, 32, 64)
TARGETS_US = {
    "decode bs=256 seq_lens": 5.0,
    "prefill 64 requests": 20.0,
    "gate decode, cost-model prior": 10.0,
    "gate decode, flat prior": 10.0,
}
SYNC_STEPS = 16


CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.thread_time}
_clock = CLOCKS["wall"]


def time_us(fn: Callable[[], object], repeat: int, min_seconds: float = 0.05) -> float:
    """Median over `repeat` runs of the mean time per call, each run at least min_seconds."""
    number = 1
    while True:
        start = _clock()
        for _ in range(number):
            fn()
        if _clock() - start >= min_seconds / 5:
            break
        number *= 2
    runs = []
    for _ in range(repeat):
        start = _clock()
        for _ in range(number):
            fn()
        runs.append((_clock() - start) / number)
    return statistics.median(runs) * 1e6


def decode_rows(repeat: int) -> list[tuple[str, float]]:
    rows = []
    for bs in DECODE_BATCHES:
        seq_lens = [1024 + i for i in range(bs)]

        def cached(bs: int = bs) -> object:
            return plan_two_batch(ForwardKind.DECODE, bs, attn_tp_size=8)

        def cold(bs: int = bs) -> object:
            two_batch._plan_uniform.cache_clear()
            return plan_two_batch(ForwardKind.DECODE, bs, attn_tp_size=8)

        def with_seq_lens(bs: int = bs, seq_lens: list[int] = seq_lens) -> object:
            return plan_two_batch(ForwardKind.DECODE, bs, seq_lens=seq_lens, attn_tp_size=8)

        rows.append((f"decode bs={bs} cached", time_us(cached, repeat)))
        rows.append((f"decode bs={bs} cold", time_us(cold, repeat)))
        rows.append((f"decode bs={bs} seq_lens", time_us(with_seq_lens, repeat)))
    return rows


def prefill_rows(repeat: int, seed: int) -> list[tuple[str, float]]:
    rng = random.Random(seed)
    rows = []
    for n in PREFILL_REQUESTS:
        batches = []
        for _ in range(32):
            lens = [rng.randint(1, 4096) for _ in range(n)]
            prefix = [rng.choice((0, 0, rng.randint(0, 8192))) for _ in range(n)]
            batches.append((lens, prefix))
        two_chunk = sum(
            plan_two_batch(ForwardKind.EXTEND, sum(lens), extend_lens=lens,
                           two_chunk_threshold=0.48).two_chunk
            for lens, _ in batches
        )

        def run(batches: list[tuple[list[int], list[int]]] = batches) -> None:
            for lens, prefix in batches:
                plan_two_batch(ForwardKind.EXTEND, sum(lens), extend_lens=lens,
                               extend_prefix_lens=prefix, two_chunk_threshold=0.48,
                               attn_tp_size=8)

        per_batch = time_us(run, repeat) / len(batches)
        rows.append((f"prefill {n} requests ({two_chunk}/32 two-chunk)", per_batch))
    return rows


def gate_rows(repeat: int, seed: int) -> list[tuple[str, float]]:
    """One gated step: decide, record the step's time, merge every SYNC_STEPS steps."""
    rng = random.Random(seed)
    enabled = frozenset({Mode.TBO, Mode.SBO, Mode.TWO_CHUNK})
    priors: dict[str, Prior] = {
        "cost-model prior": CostModelPrior(load_model("deepseek-v3"), load_hardware("H200"),
                                           Deployment(), enabled),
        "flat prior": FlatPrior(enabled),
    }
    loads = [[max(1, 64 + rng.randint(-6, 6)) for _ in range(16)] for _ in range(64)]
    rows = []
    for name, prior in priors.items():
        gate = ModeSelector(prior, SelectorConfig())
        local = StepTable()
        for tokens in loads:  # warm the prior's cache and the table
            d = gate.decide(Phase.DECODE, tokens)
            local.add(cell_index(Phase.DECODE, d.bucket, d.mode), 20000.0)
        state = {"i": 0}

        touched: dict[int, None] = {}

        def step(gate: ModeSelector = gate, local: StepTable = local,
                 touched: dict[int, None] = touched, state: dict[str, int] = state) -> None:
            i = state["i"] = state["i"] + 1
            d = gate.decide(Phase.DECODE, loads[i % len(loads)])
            cell = cell_index(Phase.DECODE, d.bucket, d.mode)
            local.add(cell, 20000.0 + i % 7)
            touched[cell] = None
            if i % SYNC_STEPS == 0:
                gate.merge_cells(local.take(touched))
                touched.clear()

        rows.append((f"gate decode, {name}", time_us(step, repeat)))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per row (median)")
    parser.add_argument("--seed", type=int, default=0, help="seed for the prefill batches")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall: perf_counter; cpu: this thread's CPU time (steadier on a "
                             "machine other jobs load)")
    args = parser.parse_args()
    global _clock
    _clock = CLOCKS[args.clock]
    rows = (decode_rows(args.repeat) + prefill_rows(args.repeat, args.seed)
            + gate_rows(args.repeat, args.seed))
    width = max(len(name) for name, _ in rows)
    print(f"{'case':<{width}}  us/call  target    (clock: {args.clock})")
    missed = 0
    for name, us in rows:
        target = next((t for prefix, t in TARGETS_US.items() if name.startswith(prefix)), None)
        verdict = ""
        if target is not None:
            ok = us <= target
            missed += not ok
            verdict = f"<= {target:.0f}: {'meets' if ok else 'MISSES'}"
        print(f"{name:<{width}}  {us:7.2f}  {verdict}")
    print(f"\n{len(TARGETS_US) - missed} of {len(TARGETS_US)} targets met")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
