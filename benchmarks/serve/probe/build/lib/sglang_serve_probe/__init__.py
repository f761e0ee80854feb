"""Benchmark-only SGLang plugin (installed only by `benchmarks/run_gpu.sh serve`, never with
sglang-overlap): counts every CUDA-graph capture and replay of SGLang's FullCudaGraphBackend by
the ShapeKey SGLang passes it, so a run can compare what replayed with what the mode selector
decided - an account kept outside the plugin under test.

With SGLANG_SERVE_PROBE_DIR set, each process rewrites `<dir>/graphs-<pid>.json` after every
capture and replay: {"pid", "captures": {label: n}, "replays": {label: n}} where label is the
key's `variant_label` (the overlap mode of sglang-overlap's graph sets, e.g. "overlap:sbo"; "" for
SGLang's own single set)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

BACKEND = ("sglang.srt.model_executor.runner_backend.full_cuda_graph_backend."
           "FullCudaGraphBackend")
_counts: dict[str, Counter[str]] = {"captures": Counter(), "replays": Counter()}


def _label(shape_key: Any) -> str:
    return str(getattr(shape_key, "variant_label", None) or "")


def _save() -> None:
    d = os.environ.get("SGLANG_SERVE_PROBE_DIR")
    if not d:
        return
    path = os.path.join(d, f"graphs-{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), **{k: dict(v) for k, v in _counts.items()}}, f)
    os.replace(path + ".tmp", path)


def _capture_one(orig: Any, self: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    out = orig(self, shape_key, *args, **kwargs)
    _counts["captures"][_label(shape_key)] += 1
    _save()
    return out


def _replay(orig: Any, self: Any, shape_key: Any, *args: Any, **kwargs: Any) -> Any:
    out = orig(self, shape_key, *args, **kwargs)
    _counts["replays"][_label(shape_key)] += 1
    _save()
    return out


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for name, fn in (("capture_one", _capture_one), ("replay", _replay)):
        target = f"{BACKEND}.{name}"
        if target not in _registered:
            _registered.add(target)
            HookRegistry.register(target, fn, HookType("around"))


_registered: set[str] = set()
