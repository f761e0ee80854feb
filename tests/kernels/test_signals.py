"""The SBO signal contract: combine-send never reads a unit before the down GEMM marks it.

A test runner poisons its whole output with NaN, then produces and marks units in a shuffled
order, one per step; the combine interleaves with it. Any read of an unmarked unit would sum
NaN into a token, so the combined output is compared with the non-SBO run bit for bit.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch

from sglang_overlap.kernels import rowwise
from sglang_overlap.kernels.contracts import LowLatencyDispatchOutput
from sglang_overlap.kernels.signals import SignalContract, SignalError
from sglang_overlap.planning.sbo_layout import SboLayout, plan_sbo_layout
from tests.oracle.experts import LocalDispatcher, ReferenceExperts

E, H, INTER, K, T = 4, 64, 32, 2, 11


def layout(granularity: str, capacity: int = T, block_m: int = 4) -> SboLayout:
    return plan_sbo_layout(num_local_experts=E, capacity=capacity, block_m=block_m, block_n=32,
                           hidden=H, num_sms=16, comm_num_sms=2,
                           granularity=granularity)  # type: ignore[arg-type]


class ShuffledPoisonRunner(ReferenceExperts):
    """Marks units in a shuffled order; unproduced rows are NaN. `early` marks before writing."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, seed: int, early: bool = False):
        super().__init__(w13, w2)
        self.rng, self.early, self.log = random.Random(seed), early, []  # type: ignore[var-annotated]

    def run_low_latency(self, dispatched: LowLatencyDispatchOutput, *,
                        signal: SignalContract | None = None) -> torch.Tensor:
        assert signal is not None
        act = rowwise.silu_and_mul(rowwise.batched_linear(dispatched.hidden, self.w13))
        out = torch.full_like(dispatched.hidden, float("nan"))
        signal.attach_producer(self._units(act, out, signal))
        return out

    def _units(self, act: torch.Tensor, out: torch.Tensor, signal: SignalContract
               ) -> Iterator[None]:
        units = list(range(signal.num_units))
        self.rng.shuffle(units)
        for unit in units:
            e, start, end = signal.unit_rows(unit)
            if self.early:
                signal.mark(unit)
                yield
            out[e, start:end] = rowwise.linear(act[e, start:end], self.w2[e])
            if not self.early:
                signal.mark(unit)
            self.log.append(("produce", unit))
            yield


def _setup(seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g)
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
    w = torch.rand(T, K, generator=g)
    w13 = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
    w2 = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
    return x, ids, w, w13, w2


def _combine(runner: ReferenceExperts, signal: SignalContract | None, seed: int
             ) -> torch.Tensor:
    x, ids, w, _, _ = _setup(seed)
    disp = LocalDispatcher(E, capacity=T)
    d = disp.dispatch_recv(disp.dispatch_send(x, ids, w, layout="low_latency", slot=0))
    out = runner.run_low_latency(d, signal=signal)  # type: ignore[arg-type]
    pending = disp.combine_send(out, d, signal=signal)
    if signal is not None:
        signal.finish()
    return disp.combine_recv(pending)


@pytest.mark.parametrize("granularity", ["block", "expert"])
@pytest.mark.parametrize("seed", range(4))
def test_combine_never_reads_an_unmarked_unit(granularity: str, seed: int) -> None:
    _, _, _, w13, w2 = _setup(seed)
    want = _combine(ReferenceExperts(w13, w2), None, seed)
    runner = ShuffledPoisonRunner(w13, w2, seed)
    signal = SignalContract(layout(granularity), "cpu")
    wait = signal.wait

    def logged_wait(unit: int) -> None:
        wait(unit)
        runner.log.append(("consume", unit))

    signal.wait = logged_wait  # type: ignore[method-assign]
    got = _combine(runner, signal, seed)
    assert not got.isnan().any(), f"{granularity=} {seed=}: read a unit before its mark"
    assert torch.equal(got, want), f"{granularity=} {seed=}"
    assert (signal.signal.to(torch.int64) == signal.layout.expect_value).all()
    log = runner.log
    for i, (what, unit) in enumerate(log):
        if what == "consume":
            assert ("produce", unit) in log[:i], f"{granularity=} {seed=} {unit=}"
    produced = [u for what, u in log if what == "produce"]
    first_consume = log.index(("consume", 0))
    if produced[-1] != 0:  # unit 0 was not the last one produced: the two interleaved
        assert first_consume < len(log) - 1 - log[::-1].index(("produce", produced[-1]))


def test_poison_is_seen_by_a_consumer_that_ignores_the_signal() -> None:
    """Negative control: the same runner, combined without waiting, leaks NaN."""
    _, _, _, w13, w2 = _setup(0)
    runner = ShuffledPoisonRunner(w13, w2, 0)
    x, ids, w, _, _ = _setup(0)
    disp = LocalDispatcher(E, capacity=T)
    d = disp.dispatch_recv(disp.dispatch_send(x, ids, w, layout="low_latency", slot=0))
    signal = SignalContract(layout("block"), "cpu")
    out = runner.run_low_latency(d, signal=signal)
    got = disp.combine_recv(disp.combine_send(out, d))  # no signal: reads everything at once
    assert got.isnan().any()


def test_a_runner_that_marks_before_writing_is_caught() -> None:
    _, _, _, w13, w2 = _setup(1)
    got = _combine(ShuffledPoisonRunner(w13, w2, 1, early=True),
                   SignalContract(layout("block"), "cpu"), 1)
    assert got.isnan().any()


def test_contract_errors_name_the_unit() -> None:
    sig = SignalContract(layout("block"), "cpu")
    with pytest.raises(SignalError, match="unit 3 read before it was marked"):
        sig.wait(3)
    sig.mark(3)
    sig.wait(3)
    with pytest.raises(SignalError, match="unit 3 marked twice"):
        sig.mark(3)
    with pytest.raises(SignalError, match="without marking units"):
        sig.finish()
    sig._counters[4] = 1  # a kernel that bumped the counter only once
    sig._marked.add(4)
    with pytest.raises(RuntimeError, match="unit 4 counter"):
        sig.wait(4)


def test_units_cover_the_expert_output() -> None:
    for gran, bm in (("block", 4), ("block", 16), ("expert", 4)):
        sig = SignalContract(layout(gran, block_m=bm), "cpu")
        covered = torch.zeros(E, T, dtype=torch.int64)
        for unit in range(sig.num_units):
            e, start, end = sig.unit_rows(unit)
            covered[e, start:end] += 1
            assert unit in sig.units_of_expert(e)
        assert (covered == 1).all(), f"{gran=} {bm=}"
    assert SignalContract(layout("expert"), "cpu").signal.dtype == torch.uint32
    assert SignalContract(layout("block"), "cpu").signal.dtype == torch.int32


def test_kernel_marked_units_need_a_kernel_consumer_or_an_event() -> None:
    sig = SignalContract(layout("expert"), "cpu")
    sig.marked_on_device()
    sig.finish()  # the host cannot check device marks
    with pytest.raises(SignalError, match="marked by a kernel"):
        sig.wait(0)
