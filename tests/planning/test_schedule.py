"""planning/schedule.py: the stream simulator by hand, then each mode's schedule against what
its stage order implies (serial = the sum of every stage; overlap never slower than serial nor
faster than its compute stream; every stage issued once per layer)."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter

import pytest

from sglang_overlap.planning.cost.stage_costs import StageCosts
from sglang_overlap.planning.schedule import (
    Task,
    build_tasks,
    makespan,
    simulate,
    steady_layer,
)

STAGES = ("attn_prep", "attn_core", "gate", "shared", "dispatch_send", "dispatch_xfer",
          "dispatch_recv", "gate_up", "act", "down", "combine_send", "combine_xfer",
          "combine_recv", "output")
COMPUTE = [s for s in STAGES if not s.endswith("_xfer")]


def _costs(seed: int, **over: float) -> StageCosts:
    rng = random.Random(seed)
    values = {s: float(rng.randint(1, 40)) for s in STAGES}
    values["down_sbo"] = values["down"] * 1.3
    return StageCosts(**(values | over), sbo_units=rng.randint(1, 16))  # type: ignore[arg-type]


def test_simulate_by_hand() -> None:
    tasks = [
        Task("a", "compute", 0, 0, 10.0),
        Task("x", "comm", 0, 0, 5.0, after=(0,)),  # waits for a: 10..15
        Task("b", "compute", 0, 0, 2.0),  # compute stream free at 10: 10..12
        Task("y", "comm", 0, 0, 4.0, after_start=((0, 0.5),)),  # comm free at 15: 15..19
        Task("c", "compute", 0, 0, 1.0, after=(1, 2)),  # 15..16
        Task("z", "comm", 1, 0, 3.0, after_start=((4, 1.0),)),  # 19..22
    ]
    got = [(s.start_us, s.end_us) for s in simulate(tasks)]
    assert got == [(0, 10), (10, 15), (10, 12), (15, 19), (15, 16), (19, 22)]
    assert makespan(simulate(tasks)) == 22 and makespan([]) == 0.0


@pytest.mark.parametrize("seed", range(8))
def test_serial_is_the_sum_of_every_stage(seed: int) -> None:
    c = _costs(seed)
    period, window = steady_layer("none", (c,), decode=True)
    assert period == pytest.approx(sum(getattr(c, s) for s in STAGES)), f"{seed=}"
    assert {s.name for s in window} >= {"attn_prep", "dispatch", "combine", "output"}


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("decode", [True, False])
def test_overlap_is_bounded_by_serial_and_by_its_compute_stream(seed: int, decode: bool) -> None:
    c = _costs(seed)
    serial, _ = steady_layer("none", (c,), decode)
    sbo, _ = steady_layer("sbo", (c,), decode)
    compute = sum(getattr(c, s) for s in COMPUTE)
    sbo_compute = compute - c.down - c.combine_send + c.down_sbo
    assert sbo_compute - 1e-6 <= sbo <= serial + c.down_sbo - c.down + 1e-6, f"{seed=}"
    half = dataclasses.replace(c, **{s: getattr(c, s) / 2 for s in STAGES})
    tbo, _ = steady_layer("tbo", (half, half), decode)
    assert compute - 1e-6 <= tbo <= serial + 1e-6, f"{seed=} {decode=}"


def test_sbo_with_no_transfers_only_pays_the_slower_down_gemm() -> None:
    c = _costs(3, dispatch_xfer=0.0, combine_xfer=0.0)
    serial, _ = steady_layer("none", (c,), decode=True)
    sbo, _ = steady_layer("sbo", (c,), decode=True)
    assert sbo == pytest.approx(serial - c.down - c.combine_send + c.down_sbo)


@pytest.mark.parametrize(("mode", "costs"), [("none", 1), ("sbo", 1), ("tbo", 2)])
@pytest.mark.parametrize("decode", [True, False])
def test_every_stage_is_issued_once_per_layer(mode: str, costs: int, decode: bool) -> None:
    tasks = build_tasks(mode, (_costs(1),) * costs, layers=3, decode=decode)
    for i, t in enumerate(tasks):
        assert all(d < i for d in t.after) and all(d < i for d, _ in t.after_start), t
    for mb in range(costs):
        names = Counter(t.name for t in tasks if t.micro_batch == mb)
        want = Counter({s.replace("_xfer", ""): 3 for s in STAGES})
        if mode == "sbo":  # the send runs on its own SMs beside the down GEMM (down_sbo)
            want["combine"] = 6  # each unit but the last streams under the GEMM, then the last
            del want["combine_send"]
        assert names == want, f"{mode=} {mb=}"


def test_bad_modes_are_named() -> None:
    with pytest.raises(ValueError, match="unknown overlap mode 'fast'"):
        build_tasks("fast", (_costs(0),), 1, True)
    with pytest.raises(ValueError, match="tbo needs two micro-batches' costs"):
        build_tasks("tbo", (_costs(0),), 1, True)
