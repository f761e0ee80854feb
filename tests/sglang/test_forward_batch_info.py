"""Tests for sglang/forward_batch_info.py: `ForwardBatch._pad_inputs_to_size` on a CPU asks the
attention backend for `get_cpu_graph_seq_len_fill_value`, which torch_native lacks; the hook hands
upstream a view of the model runner whose backend answers 1 and is otherwise the real one."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

from tests.conftest import require_module

fbi = require_module("sglang.srt.model_executor.forward_batch_info")
torch_native = require_module("sglang.srt.layers.attention.torch_native_backend")

from sglang_overlap.sglang.upstream import forward_batch_info as glue  # noqa: E402


def _call(runner: Any) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    seen: list[Any] = []

    def orig(self: Any, model_runner: Any, *args: Any, **kwargs: Any) -> str:
        seen.append((self, model_runner, args, kwargs))
        return "padded"

    batch = object()
    assert glue.pad_inputs_to_size(orig, batch, runner, 16, bs=4) == "padded"
    (self, passed, args, kwargs), = seen
    assert self is batch
    return passed, args, kwargs


def test_upstream_asks_for_the_fill_value_torch_native_lacks() -> None:
    assert "get_cpu_graph_seq_len_fill_value" in inspect.getsource(
        fbi.ForwardBatch._pad_inputs_to_size)
    assert not hasattr(torch_native.TorchNativeAttnBackend, "get_cpu_graph_seq_len_fill_value")
    spec, = glue.HOOKS
    assert spec.target == glue.PAD_INPUTS and spec.fn is glue.pad_inputs_to_size
    assert spec.feature == "torch_a2a" and spec.cpu_only and spec.kind == "around"


def test_a_backend_without_the_fill_value_is_seen_through_a_view() -> None:
    backend = SimpleNamespace(name="torch_native", forward=lambda: "fwd")
    runner = SimpleNamespace(attn_backend=backend, device="cpu", model=object())
    passed, args, kwargs = _call(runner)
    assert passed is not runner and (args, kwargs) == ((16,), {"bs": 4})
    assert passed.attn_backend.get_cpu_graph_seq_len_fill_value() == 1
    # everything else is the real runner's and the real backend's
    assert passed.device == "cpu" and passed.model is runner.model
    assert passed.attn_backend.name == "torch_native" and passed.attn_backend.forward() == "fwd"
    assert not hasattr(backend, "get_cpu_graph_seq_len_fill_value")  # the backend is untouched


def test_a_backend_with_the_fill_value_is_passed_unchanged() -> None:
    backend = SimpleNamespace(get_cpu_graph_seq_len_fill_value=lambda: 7)
    runner = SimpleNamespace(attn_backend=backend)
    passed, _, _ = _call(runner)
    assert passed is runner
    assert passed.attn_backend.get_cpu_graph_seq_len_fill_value() == 7
