"""`sglang/deepseek_v2.py` on SGLang 0.5.23's real `DeepseekV2MoE.forward_deepep` (CPU): with the
mode selector, a step whose mode is not SBO runs upstream's non-SBO branch (no dispatch hook, no
overlap-args hook, shared experts called directly) and SGLang's `is_sbo_enabled()` reads False
inside it; an SBO step runs the SBO branch. Asserted on what ran, not on the step's label."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sglang.srt.models.deepseek_v2", reason="sglang 0.5.23 is not installed")

import torch  # noqa: E402
from sglang.srt.batch_overlap.two_batch_overlap import MaybeTboDeepEPDispatcher  # noqa: E402
from sglang.srt.layers.moe.utils import is_sbo_enabled  # noqa: E402
from sglang.srt.models.deepseek_v2 import DeepseekV2MoE  # noqa: E402
from sglang.srt.runtime_context import get_flags  # noqa: E402

from sglang_overlap.modes import Mode, Phase, StepDecision  # noqa: E402
from sglang_overlap.settings import OverlapSettings  # noqa: E402
from sglang_overlap.sglang import state  # noqa: E402

AUTO = OverlapSettings(enable_single_batch_overlap=True, requested_a2a_backend="torch_a2a",
                       overlap_gating="auto")
FIXED = OverlapSettings(enable_single_batch_overlap=True, requested_a2a_backend="torch_a2a")


@pytest.fixture(scope="module", autouse=True)
def _plugins_loaded() -> None:
    from sglang.srt.plugins import load_plugins

    load_plugins()


class _Dispatcher(MaybeTboDeepEPDispatcher):
    """Records which of upstream's SBO hooks `forward_deepep` registers."""

    def __init__(self) -> None:  # no DeepEP buffers: only the registrations are looked at
        self.registered: list[str] = []

    def _register(self, name: str) -> Any:
        self.registered.append(name)
        return _Handle()

    def register_deepep_dispatch_hook(self, hook: Any) -> Any:
        return [self._register("dispatch")]

    def register_post_dispatch_hook(self, hook: Any) -> Any:
        return self._register("post_dispatch")

    def register_pre_combine_hook(self, hook: Any) -> Any:
        return self._register("pre_combine")

    def register_post_combine_hook(self, hook: Any) -> Any:
        return self._register("post_combine")


class _Handle:
    def remove(self) -> None:
        pass


class _Layer:
    """The attributes `forward_deepep` reads; records the calls it makes."""

    def __init__(self) -> None:
        self._fuse_shared_experts_inside_sbo = True  # what SBO on builds on a Hopper-like host
        self.is_nextn = False
        self.num_fused_shared_experts = 0
        self.alt_stream = None
        self.routed_scaling_factor = 1.0
        self.routed_scaling_factor_fused_in_topk = True
        self.calls: list[str] = []
        self.sbo_flag_in_experts: bool | None = None
        dispatcher = _Dispatcher()
        layer = self

        class _Experts:
            def __init__(self) -> None:
                self.dispatcher = dispatcher

            def __call__(self, hidden_states: torch.Tensor, topk_output: Any) -> torch.Tensor:
                layer.calls.append("experts")
                layer.sbo_flag_in_experts = is_sbo_enabled()
                return hidden_states * 2

        self.experts = _Experts()

    def gate(self, hidden_states: torch.Tensor, forward_batch: Any = None) -> torch.Tensor:
        return hidden_states

    def topk(self, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> str:
        return "topk"

    def _forward_shared_experts(self, hidden_states: torch.Tensor) -> torch.Tensor:
        self.calls.append("shared")
        return hidden_states.clone()


def _decision(mode: str | None) -> StepDecision | None:
    return None if mode is None else StepDecision(Mode(mode), Phase.DECODE)


def _run(settings: OverlapSettings, mode: str | None) -> _Layer:
    layer = _Layer()
    state.configure(settings)
    moe = get_flags().moe
    saved = moe.sbo_enabled
    moe.sbo_enabled = True  # as `initialize_moe_config` sets it for --enable-single-batch-overlap
    try:
        with state.step(_decision(mode)):
            out = DeepseekV2MoE.forward_deepep(layer, torch.ones(2, 4), forward_batch=None)
        assert moe.sbo_enabled is True, "the process-wide SBO flag must be restored"
    finally:
        moe.sbo_enabled = saved
        state.configure(None)
    assert layer._fuse_shared_experts_inside_sbo is True, "the layer's cached choice is restored"
    expected = 3.0 if "shared" in layer.calls else 2.0  # routed x2 (+ shared x1 when it ran)
    assert torch.equal(out, torch.full((2, 4), expected)), f"{mode=} {out=}"
    return layer


def test_a_none_step_runs_upstreams_non_sbo_branch() -> None:
    layer = _run(AUTO, "none")
    assert layer.experts.dispatcher.registered == []
    assert layer.calls == ["shared", "experts"]  # shared experts directly, before the MoE
    assert layer.sbo_flag_in_experts is False  # SboFlags (compute_overlap_args, GEMM) see off


def test_a_tbo_labelled_call_outside_tbo_runs_no_sbo_either() -> None:
    layer = _run(AUTO, "tbo")
    assert layer.experts.dispatcher.registered == [] and layer.sbo_flag_in_experts is False


def test_an_sbo_step_runs_the_sbo_branch() -> None:
    layer = _run(AUTO, "sbo")
    assert layer.experts.dispatcher.registered == ["dispatch", "post_dispatch", "post_combine"]
    assert layer.calls == ["experts"]  # the shared experts ride the dispatch hook
    assert layer.sbo_flag_in_experts is True


def test_fixed_sbo_is_upstreams_path_whatever_the_label() -> None:
    layer = _run(FIXED, "none")
    assert layer.experts.dispatcher.registered == ["dispatch", "post_dispatch", "post_combine"]
    assert layer.sbo_flag_in_experts is True


def test_the_layer_value_is_restored_when_the_forward_raises() -> None:
    layer = _Layer()

    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    layer.experts.__class__.__call__ = boom  # type: ignore[method-assign]
    state.configure(AUTO)
    try:
        with state.step(_decision("none")), pytest.raises(RuntimeError, match="boom"):
            DeepseekV2MoE.forward_deepep(layer, torch.ones(1, 4), forward_batch=None)
    finally:
        state.configure(None)
    assert layer._fuse_shared_experts_inside_sbo is True


def _moe_like(cls: type) -> Any:
    layer = cls.__new__(cls)  # no weights: only the class and the cached SBO choice matter
    layer.__dict__["_fuse_shared_experts_inside_sbo"] = True
    return layer


class _OtherMoE(torch.nn.Module):
    pass


def test_a_model_whose_sbo_cannot_be_switched_is_refused_naming_the_flags() -> None:
    from types import SimpleNamespace

    from sglang_overlap.settings import SettingsError
    from sglang_overlap.sglang.upstream import deepseek_v2

    ok = SimpleNamespace(modules=lambda: [_moe_like(DeepseekV2MoE), torch.nn.Linear(1, 1)])
    bad = SimpleNamespace(modules=lambda: [_moe_like(DeepseekV2MoE), _moe_like(_OtherMoE)])
    state.configure(AUTO)
    try:
        deepseek_v2.check_model(ok)
        with pytest.raises(SettingsError, match="_OtherMoE.*--overlap-gating auto or "
                                                "--enable-single-batch-overlap"):
            deepseek_v2.check_model(bad)
        state.configure(FIXED)
        deepseek_v2.check_model(bad)  # fixed SBO: upstream's path in every step, as asked
    finally:
        state.configure(None)
