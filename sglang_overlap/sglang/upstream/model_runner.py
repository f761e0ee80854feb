"""Hooks on `sglang.srt.model_executor.model_runner`: build the mode selector at start-up,
time and count each step.

`ModelRunner.initialize` (AFTER): with --overlap-gating auto, build this process's mode selector
(`selector_setup.start`) from the model just loaded and the real server layout, so that a model
the cost model cannot describe, or an unusable --overlap-hardware-profile, stops the server at
start-up instead of at the first selected step.

`ModelRunner.forward` (AROUND): a step is one forward of the model. When the selector decided
this step, time it into the selector's (phase, token bucket, mode) cell: wall time on CPU (where the
forward is synchronous), two CUDA events on GPU, read later only once completed (no device sync
on the hot path). Draft-model forwards and steps the selector did not decide are not timed. Every
non-idle forward of the served model is counted (`stats.add("steps", phase, mode, runner)`): the
mode SGLang runs for the batch (`decode_cuda_graph_runner.step_graph_mode`), and whether it
replayed a graph or ran eager.
"""

from __future__ import annotations

import time
from typing import Any

from sglang_overlap import stats
from sglang_overlap.sglang import selector_setup, state
from sglang_overlap.sglang.upstream.decode_cuda_graph_runner import step_graph_mode
from sglang_overlap.sglang.hooks import HookSpec

INITIALIZE = "sglang.srt.model_executor.model_runner.ModelRunner.initialize"
FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"


def start_selector(result: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """AFTER `initialize`: the mode selector of this server, built (and its inputs checked) now."""
    if state.settings().overlap_gating == "auto" and not self.is_draft_worker:
        selector_setup.start(self)


def timed_forward(orig: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    if self.is_draft_worker:
        return orig(self, forward_batch, *args, **kwargs)
    phase_mode = _phase_mode(forward_batch)
    out = _timed(orig, self, forward_batch, *args, **kwargs)
    if phase_mode is not None:
        runner = "graph" if getattr(out, "can_run_graph", False) else "eager"
        stats.add("steps", *phase_mode, runner)
    return out


def _phase_mode(forward_batch: Any) -> tuple[str, str] | None:
    """(phase, mode) of the step about to run, from what SGLang will run (None: idle)."""
    fm = forward_batch.forward_mode
    if fm.is_idle():
        return None
    phase = "prefill" if fm.is_extend() and not fm.is_target_verify() else "decode"
    return phase, step_graph_mode(forward_batch)


def _timed(orig: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    rt = selector_setup.runtime()
    cell = rt.take_pending() if rt is not None else None
    if rt is None or cell is None:
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
    HookSpec(INITIALIZE, start_selector, "after",
             "--overlap-gating auto: build the mode selector at start-up (refusals then)",
             "src:4bbf5629ab71", feature="gate"),
    HookSpec(FORWARD, timed_forward, "around",
             "--overlap-gating auto: time each selected step (the selector learns from it)",
             "src:a3842a28ccc0", feature="gate"),
)
