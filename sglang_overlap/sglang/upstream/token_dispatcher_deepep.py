"""Hooks on `sglang.srt.layers.moe.token_dispatcher.deepep`.

* `DeepEPDispatcher.__init__` (around), with `--moe-a2a-backend torch_a2a`: the dispatcher builds
  the plugin's all-to-all impls (`torch_a2a.py`) instead of DeepEP's buffers.
* `_DeepEPDispatcherImplLowLatency._combine_core` (around), on the plugin's SBO path: upstream's
  own combine runs, on a view of its DeepEP buffer whose `low_latency_combine` receives the
  overlap kwargs of the form the installed deep_ep declares (`kernels.combine_overlap.
  combine_overlap_kwargs`) in place of the per-block Hopper kwargs upstream passes.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.planning.sbo_path import SboDecision
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.sbo_decision import active_decision
from sglang_overlap.sglang.upstream.server_args import TORCH_A2A

DEEPEP = "sglang.srt.layers.moe.token_dispatcher.deepep"
DISPATCHER_INIT = f"{DEEPEP}.DeepEPDispatcher.__init__"
LL_COMBINE_CORE = f"{DEEPEP}._DeepEPDispatcherImplLowLatency._combine_core"

# What upstream passes to low_latency_combine besides the overlap kwargs (the pinned
# `_combine_core`'s own call, checked against its source).
_BASE_KWARGS = frozenset({"x", "topk_idx", "topk_weights", "handle", "async_finish",
                          "return_recv_hook"})


def dispatcher_init(orig: Any, self: Any, *args: Any, **kwargs: Any) -> None:
    """With torch_a2a, DeepEPDispatcher builds the plugin's impls (its own code, other classes)."""
    if state.settings().requested_a2a_backend != TORCH_A2A:
        orig(self, *args, **kwargs)
        return
    from sglang.srt.layers.moe.token_dispatcher import deepep

    from sglang_overlap.sglang.torch_a2a import LL_IMPL, NORMAL_IMPL

    saved = deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal
    deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal = (
        LL_IMPL, NORMAL_IMPL)
    try:
        orig(self, *args, **kwargs)
    finally:
        deepep._DeepEPDispatcherImplLowLatency, deepep._DeepEPDispatcherImplNormal = saved


class _FormBuffer:
    """A DeepEP buffer seen through, whose `low_latency_combine` speaks the installed form."""

    def __init__(self, buffer: Any, decision: SboDecision, overlap_args: Any) -> None:
        self._buffer, self._decision, self._oa = buffer, decision, overlap_args

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)

    def low_latency_combine(self, **kwargs: Any) -> Any:
        base = {k: v for k, v in kwargs.items() if k in _BASE_KWARGS}
        given = {k: v for k, v in kwargs.items() if k not in _BASE_KWARGS}
        if not (given.get("overlap") and self._decision.down_gemm_overlap):
            return self._buffer.low_latency_combine(**base)
        from sglang_overlap.kernels.combine_overlap import combine_overlap_kwargs
        from sglang_overlap.sglang.sbo_decision import check_signal_raised

        oa = self._oa
        if self._decision.gemm_signal_source == "plugin":
            check_signal_raised(oa.signal)
        overlap = combine_overlap_kwargs(
            self._decision.combine_form, signal=oa.signal, expect_value=int(oa.threshold or 0),
            packed_recv_count=given.get("packed_recv_count"), block_m=given.get("block_m"),
            threshold=given.get("threshold"), num_sms=oa.num_sms)
        return self._buffer.low_latency_combine(**base, **overlap)


def combine_core(orig: Any, self: Any, hidden_states: Any, topk_ids: Any,
                 topk_weights: Any) -> Any:
    decision = active_decision()
    if decision is None or self.overlap_args is None:
        return orig(self, hidden_states, topk_ids, topk_weights)
    # Upstream's Hopper branch reads block_m / threshold, which the per-expert form never sets.
    meta = self.meta_overlap_args
    if meta is not None:
        meta.setdefault("block_m", None)
        meta.setdefault("threshold", None)
    get_buffer = self._get_buffer
    self._get_buffer = lambda: _FormBuffer(get_buffer(), decision, self.overlap_args)
    try:
        return orig(self, hidden_states, topk_ids, topk_weights)
    finally:
        del self._get_buffer  # the class's method again


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(DISPATCHER_INIT, dispatcher_init, "around",
             "torch_a2a: DeepEPDispatcher builds all-to-all impls instead of DeepEP buffers",
             "src:199fea8eb070", feature=Feature.TORCH_A2A),
    HookSpec(LL_COMBINE_CORE, combine_core, "around",
             "upstream's combine, with the overlap kwargs of the installed deep_ep's form",
             "src:b8a70d7bfee5", feature=Feature.SBO),
)
