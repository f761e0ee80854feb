"""Hooks on `sglang.srt.model_executor.model_runner`: build the gate at start-up, time each step.

`ModelRunner.initialize` (AFTER): with --overlap-gating auto, build this process's gate
(`gate.start`) from the model just loaded and the real server layout, so that a model the cost
model cannot describe, or an unusable --overlap-hardware-profile, stops the server at start-up
instead of at the first gated step.

`ModelRunner.forward` (AROUND): a step is one forward of the model. When the gate decided this
step, time it into the gate's (phase, token bucket, mode) cell: wall time on CPU (where the
forward is synchronous), two CUDA events on GPU, read later only once completed (no device sync
on the hot path). Draft-model forwards and steps the gate did not decide are not timed.
"""

from __future__ import annotations

import time
from typing import Any

from sglang_overlap.sglang import gate, state
from sglang_overlap.sglang.hooks import HookSpec

INITIALIZE = "sglang.srt.model_executor.model_runner.ModelRunner.initialize"
FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"


def start_gate(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER `initialize`: the gate of this server, built (and its inputs checked) now."""
    if state.settings().overlap_gating == "auto" and not self.is_draft_worker:
        gate.start(self)


def timed_forward(orig: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = gate.runtime()
    if rt is None or self.is_draft_worker:
        return orig(self, forward_batch, *args, **kwargs)
    cell = rt.take_pending()
    if cell is None:
        return orig(self, forward_batch, *args, **kwargs)
    if rt.cuda:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = orig(self, forward_batch, *args, **kwargs)
        end.record()
        rt.push_events(cell, start, end)
        return out
    t0 = time.perf_counter()
    out = orig(self, forward_batch, *args, **kwargs)
    rt.record(cell, (time.perf_counter() - t0) * 1e6)
    return out


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(INITIALIZE, start_gate, "after",
             "--overlap-gating auto: build the gate when the server starts (refusals then)",
             "src:c5e95ff467d8", feature="gate"),
    HookSpec(FORWARD, timed_forward, "around",
             "--overlap-gating auto: time each gated step (the gate learns from it)",
             "src:8cd4e4df5a61", feature="gate"),
)
