"""Tests for upstream/ep_moe_layer.py: `DeepEPMoE.run_moe_core` runs the local experts in torch only
under `--moe-a2a-backend torch_a2a` and only on a dispatch the torch all-to-all produced;
everything else goes to upstream unchanged. SBO signals are counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import require_module

layer = require_module("sglang.srt.layers.moe.ep_moe.layer")

from sglang_overlap import stats  # noqa: E402
from sglang_overlap.settings import OverlapSettings  # noqa: E402
from sglang_overlap.sglang import state, torch_a2a  # noqa: E402
from sglang_overlap.sglang.upstream import ep_moe_layer as ep_moe  # noqa: E402


@pytest.fixture
def backend() -> Iterator[Any]:
    yield lambda name: state.configure(OverlapSettings(requested_a2a_backend=name))
    state.configure(None)


class _Moe:
    dispatcher = None  # no torch_a2a dispatcher inside: find_impl finds nothing


def _orig(calls: list[tuple[Any, Any]]) -> Any:
    def orig(self: Any, dispatch_output: Any) -> str:
        calls.append((self, dispatch_output))
        return "upstream"
    return orig


def test_target_is_upstreams_deepep_moe_core() -> None:
    spec, = ep_moe.HOOKS
    assert spec.target == ep_moe.RUN_MOE_CORE and spec.fn is ep_moe.run_moe_core
    assert spec.kind == "around" and spec.feature == "torch_a2a" and not spec.cpu_only
    assert callable(layer.DeepEPMoE.run_moe_core)


@pytest.mark.parametrize("name", ["deepep", "none"])
def test_other_backends_run_upstream(backend: Any, monkeypatch: pytest.MonkeyPatch,
                                     name: str) -> None:
    backend(name)
    monkeypatch.setattr(torch_a2a, "find_impl", lambda *a: pytest.fail("torch path taken"))
    calls: list[tuple[Any, Any]] = []
    moe, out = _Moe(), object()
    assert ep_moe.run_moe_core(_orig(calls), moe, out) == "upstream"
    assert calls == [(moe, out)]


def test_torch_a2a_without_its_dispatch_runs_upstream(backend: Any) -> None:
    backend("torch_a2a")
    calls: list[tuple[Any, Any]] = []
    moe, out = _Moe(), object()
    assert torch_a2a.find_impl(moe, out) is None  # the real lookup
    assert ep_moe.run_moe_core(_orig(calls), moe, out) == "upstream"
    assert calls == [(moe, out)]


@pytest.mark.parametrize("signalled", [False, True])
def test_torch_a2a_dispatch_runs_local_experts(backend: Any, monkeypatch: pytest.MonkeyPatch,
                                               signalled: bool) -> None:
    backend("torch_a2a")
    moe, out, impl, combine = _Moe(), object(), object(), object()
    monkeypatch.setattr(torch_a2a, "find_impl",
                        lambda m, d: impl if (m, d) == (moe, out) else None)
    ran: list[Any] = []

    def run_local_experts(m: Any, i: Any, d: Any) -> tuple[Any, bool]:
        ran.append((m, i, d))
        return combine, signalled

    monkeypatch.setattr(torch_a2a, "run_local_experts", run_local_experts)
    before = stats._counts["sbo_down_gemm_signal"]
    got = ep_moe.run_moe_core(lambda *a: pytest.fail("upstream ran"), moe, out)
    assert got is combine and ran == [(moe, impl, out)]
    assert stats._counts["sbo_down_gemm_signal"] - before == int(signalled)
