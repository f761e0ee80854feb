"""GPU: the mode selector's step timer (sglang/selector_runtime.py SelectorRuntime) with real
CUDA events: recording never waits for the device, completed events are read later, and what
they read is the step's time.
Skipped without CUDA. (The glue module imports sglang only inside functions, so this runs where
sglang is not installed.)"""

from __future__ import annotations

import time

import pytest
import torch

from sglang_overlap.modes import Mode, Phase
from sglang_overlap.planning.cost.prior import FlatPrior
from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
from sglang_overlap.planning.step_table import cell_index, measure_bucket
from sglang_overlap.sglang.selector_runtime import SelectorRuntime

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
MAX_WORKERS = 1  # it times CUDA work: other workers' kernels would be in its steps


def _step(x: torch.Tensor, n: int) -> None:
    for _ in range(n):
        x = x @ x
        x = x / x.norm()


def test_events_are_read_lazily_and_measure_the_step() -> None:
    rt = SelectorRuntime(ModeSelector(FlatPrior(frozenset({Mode.TBO})), SelectorConfig()),
                         sync_steps=10**6, cuda=True, setup="gpu test")
    cell = cell_index(Phase.DECODE, measure_bucket(64), Mode.NONE)
    x = torch.randn(4096, 4096, device="cuda")
    _step(x, 3)
    torch.cuda.synchronize()
    n_steps, work = 6, 40
    t0 = time.perf_counter()
    for _ in range(n_steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        _step(x, work)
        end.record()
        rt.push_events(cell, start, end)  # must not wait for the GPU
    issued = time.perf_counter() - t0
    assert len(rt._events) >= n_steps - 1, "recording waited for the device"
    torch.cuda.synchronize()
    device = time.perf_counter() - t0
    assert issued < 0.5 * device, f"{issued=} {device=}: the host waited on the device"
    rt.poll()
    assert not rt._events and rt.local.count(cell) == n_steps - 1  # the first is dropped
    mean = rt.local.mean(cell)
    assert mean is not None
    per_step_us = device / n_steps * 1e6
    assert 0.7 * per_step_us < mean < 1.3 * per_step_us, f"{mean=} {per_step_us=}"
