"""Hooks on `sglang.srt.model_executor.model_runner`: build the mode selector at start-up,
time and count each step.

`ModelRunner.initialize` (AFTER): with --overlap-gating auto, build this process's mode selector
(`selector_setup.start`) from the model just loaded and the real server layout, so that a model
the cost model cannot describe, or an unusable --overlap-hardware-profile, stops the server at
start-up instead of at the first selected step.

`ModelRunner.forward` (AROUND): a forward of the served model is one step. It takes the step's
decision (`state.take_handed_over`: the mode selector's, or, for a step the selector did not
decide, `state.sglang_rule` from the batch SGLang built), checks that SGLang's batch agrees with
it (split for TBO, unsplit otherwise) and runs the forward inside `state.step(decision)`, where the
graph runner and the MoE layers read it. A selector decision is timed into its cell: wall time on
CPU (where the forward is synchronous), two CUDA events on GPU, read later only once completed (no
device sync on the hot path). Every non-idle step is counted from the same decision
(`stats.add("steps", phase, mode, runner)`, runner: whether it replayed a graph or ran eager).
Draft-model forwards are left to SGLang.
"""

from __future__ import annotations

import time
from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import Feature, Mode, StepDecision
from sglang_overlap.sglang import selector_setup, state
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
    decision = step_decision(forward_batch, state.take_handed_over())
    with state.step(decision):
        out = _timed(orig, self, decision, forward_batch, *args, **kwargs)
    if not forward_batch.forward_mode.is_idle():
        runner = "graph" if getattr(out, "can_run_graph", False) else "eager"
        stats.add("steps", decision.phase, decision.mode, runner)
    return out


def step_decision(forward_batch: Any, handed: StepDecision | None) -> StepDecision:
    """The decision this forward runs: `handed` (the selector's), checked against the batch SGLang
    built, or SGLang's own rule where no selector decided the step. Raises RuntimeError when the
    batch's split disagrees with the decision (SGLang changed how it carries the TBO split): the
    graph set, the SBO switch and the counters would then disagree with what runs."""
    if handed is None:
        return state.sglang_rule(forward_batch)
    split = bool(forward_batch.can_run_tbo)
    if split != (handed.mode == Mode.TBO) and not forward_batch.forward_mode.is_idle():
        raise RuntimeError(
            f"sglang-overlap: step {handed.step} was decided {handed.mode} but SGLang "
            f"{'split' if split else 'did not split'} its batch; the selector's decision "
            f"no longer reaches SGLang's TBO split (is this SGLang version supported?)")
    return handed


def _timed(orig: Any, self: Any, decision: StepDecision, forward_batch: Any, *args: Any,
           **kwargs: Any) -> Any:
    rt = selector_setup.runtime()
    cell = rt.timed_cell(decision) if rt is not None else None
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
             "src:4bbf5629ab71", feature=Feature.GATE),
    HookSpec(FORWARD, timed_forward, "around",
             "run each step inside its decision, checked against the batch; time and count it",
             "src:a3842a28ccc0", feature=Feature.GATE),
)
