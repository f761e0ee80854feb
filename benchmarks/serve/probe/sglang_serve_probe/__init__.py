"""Benchmark-only SGLang plugin (installed only by `benchmarks/run_gpu.sh serve`, never with
sglang-overlap): counts every CUDA-graph capture and replay of SGLang's FullCudaGraphBackend by
the ShapeKey SGLang passes it, so a run can compare what replayed with what the mode selector
decided - an account kept outside the plugin under test.

It also times every forward step of the served model (`ModelRunner.forward`), by kind: "prefill"
(an extend batch) or "decode bs=N". Host time: the call's wall time (seconds, perf_counter). GPU
time: CUDA events recorded before and after the call on the current stream, read once they have
completed (`Event.query`, never a sync), in ms. The same account on every server, the plugin's or
not, so a run can tell where a server's step time goes.

With SGLANG_SERVE_PROBE_DIR set, each process rewrites `<dir>/graphs-<pid>.json` after every
capture, timed step and replay outside a timed step (a replay inside one is saved when the step
returns, after its time is taken): {"pid", "captures": {label: n}, "replays": {label: n}, "steps":
{kind: {"n", "host_s", "gpu_n", "gpu_ms"}}} where label is the key's `variant_label` (the overlap
mode of sglang-overlap's graph sets, e.g. "overlap:sbo"; "" for SGLang's own single set), and
each step kind holds sums: n steps, host_s seconds over them, gpu_ms over the gpu_n whose events
have completed."""

from __future__ import annotations

import functools
import json
import os
import time
from collections import Counter
from typing import Any

BACKEND = ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend."
           "FullCudaGraphBackend")
FORWARD = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
_counts: dict[str, Counter[str]] = {"captures": Counter(), "replays": Counter()}
_steps: dict[str, dict[str, float]] = {}
_pending: list[tuple[str, Any, Any]] = []  # (kind, start, end) events not yet read
_timing = [0]  # timed forward steps running now (their replays' file write waits for them)


def _label(shape_key: Any) -> str:
    return str(getattr(shape_key, "variant_label", None) or "")


def _save() -> None:
    d = os.environ.get("SGLANG_SERVE_PROBE_DIR")
    if not d:
        return
    path = os.path.join(d, f"graphs-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), **{k: dict(v) for k, v in _counts.items()},
                   "steps": _steps}, f)
    os.replace(path + ".tmp", path)


def _capture_one(orig: Any, self: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    out = orig(self, shape_key, *args, **kwargs)
    _counts["captures"][_label(shape_key)] += 1
    _save()
    return out


def _replay(orig: Any, self: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    out = orig(self, shape_key, *args, **kwargs)
    _counts["replays"][_label(shape_key)] += 1
    if not _timing[0]:  # inside a timed step, the step saves once its time is taken
        _save()
    return out


def step_kind(forward_batch: Any) -> str | None:
    """"prefill" (extend), "decode bs=N", or None (idle and other modes: not timed)."""
    mode = forward_batch.forward_mode
    if mode.is_decode():
        return f"decode bs={forward_batch.batch_size}"
    if mode.is_extend():
        return "prefill"
    return None


@functools.cache
def _cuda() -> Any:
    """torch.cuda where a GPU is there, else None (asked once: `_event` runs every step)."""
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def _event() -> Any:
    """A recorded timing CUDA event on the current stream; None without CUDA."""
    cuda = _cuda()
    if cuda is None:
        return None
    event = cuda.Event(enable_timing=True)
    event.record()
    return event


def drain() -> None:
    """Add the GPU time of every pending step whose end event has completed, in order."""
    while _pending and _pending[0][2].query():
        kind, start, end = _pending.pop(0)
        row = _steps[kind]
        row["gpu_n"] += 1
        row["gpu_ms"] += start.elapsed_time(end)


def _forward(orig: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    kind = None if getattr(self, "is_draft_worker", False) else step_kind(forward_batch)
    if kind is None:
        return orig(self, forward_batch, *args, **kwargs)
    start, t0 = _event(), time.perf_counter()
    _timing[0] += 1
    try:
        out = orig(self, forward_batch, *args, **kwargs)
    finally:
        _timing[0] -= 1
    host = time.perf_counter() - t0
    end = _event()
    row = _steps.setdefault(kind, {"n": 0, "host_s": 0.0, "gpu_n": 0, "gpu_ms": 0.0})
    row["n"] += 1
    row["host_s"] += host
    if start is not None:
        _pending.append((kind, start, end))
    drain()
    _save()  # after the timed window: the file write is not part of the step's time
    return out


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, fn in ((f"{BACKEND}.capture_one", _capture_one),
                       (f"{BACKEND}.replay", _replay), (FORWARD, _forward)):
        if target not in _registered:
            _registered.add(target)
            HookRegistry.register(target, fn, HookType("around"))


_registered: set[str] = set()
