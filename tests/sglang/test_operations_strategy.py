"""Tests for sglang/operations_strategy.py: on a CPU the DeepSeek prefill TBO strategy is
upstream's, operation for operation, with no DeepGEMM SM budget; with CUDA, upstream runs as is."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from tests.conftest import require_module

strategy = require_module("sglang.srt.batch_overlap.operations_strategy")
operations = require_module("sglang.srt.batch_overlap.operations")

from sglang_overlap.sglang.upstream import operations_strategy as glue  # noqa: E402

_NAMES = ("op_comm_prepare_attn", "op_comm_prepare_mlp", "op_comm_postprocess_layer")
_ATTN = ("op_prepare", "op_core")
_MLP = ("op_gate", "op_select_experts", "op_dispatch_a", "op_dispatch_b", "op_experts",
        "op_combine_a", "op_shared_experts", "op_combine_b", "op_output")


def _layer() -> Any:
    def ops(names: tuple[str, ...]) -> dict[str, Any]:
        return {n: (lambda n=n, **kw: n) for n in names}
    return SimpleNamespace(**ops(_NAMES), self_attn=SimpleNamespace(**ops(_ATTN)),
                           mlp=SimpleNamespace(**ops(_MLP)))


def _shape(ops: list[Any]) -> list[Any]:
    return ["yield" if isinstance(op, operations.YieldOperation) else op for op in ops]


def test_target_is_upstreams_prefill_strategy() -> None:
    spec, = glue.HOOKS
    module, name = glue.PREFILL_STRATEGY.rsplit(".", 1)
    assert module == strategy.__name__ and callable(getattr(strategy, name))
    assert spec.fn is glue.prefill_strategy and spec.kind == "around"
    assert spec.feature == "tbo" and spec.cpu_only


def test_cpu_strategy_is_upstreams_operations_without_an_sm_budget(
        monkeypatch: pytest.MonkeyPatch) -> None:
    layer = _layer()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    got = glue.prefill_strategy(lambda _: pytest.fail("upstream asked CUDA"), layer)
    assert isinstance(got, strategy.OperationsStrategy)
    assert got.deep_gemm_num_sms is None and got.tbo_delta_stages == 0
    # upstream's own function, given an SM count, lists the same operations in the same order
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=None: SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(strategy.DeepEPConfig, "get_instance",
                        staticmethod(lambda: SimpleNamespace(num_sms=24)))
    monkeypatch.setattr(strategy, "_is_hip", False)
    # with CUDA "available" a hooked upstream (an earlier test may have installed the plugin's
    # hooks in this process) hands back to upstream's own function
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    upstream = strategy._compute_moe_deepseek_blog_prefill(layer)
    assert upstream.deep_gemm_num_sms == 108
    assert _shape(got.operations) == _shape(upstream.operations)
    assert _shape(got.operations).count("yield") == 2


def test_with_cuda_upstream_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    layer, sentinel = _layer(), object()
    calls: list[Any] = []

    def orig(arg: Any) -> Any:
        calls.append(arg)
        return sentinel

    assert glue.prefill_strategy(orig, layer) is sentinel and calls == [layer]
