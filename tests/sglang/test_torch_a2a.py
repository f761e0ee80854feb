"""The torch_a2a impls with SGLang's real dispatch / combine records, on a one-rank gloo group:
dispatch, the served torch experts, combine = the weighted sum of each token's experts."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from tests.conftest import require_module

require_module("sglang.srt.layers.moe.token_dispatcher.deepep")

from sglang.srt.layers.moe.token_dispatcher import deepep  # noqa: E402
from sglang.srt.layers.moe.topk import StandardTopKOutput  # noqa: E402

from sglang_overlap.sglang.torch_a2a import LL_IMPL, NORMAL_IMPL, experts_of  # noqa: E402

E, H, INTER, T, K = 4, 16, 8, 5, 2


@pytest.fixture(scope="module")
def group() -> dist.ProcessGroup:
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29561")
        dist.init_process_group("gloo", rank=0, world_size=1)
    return dist.group.WORLD


class _Moe:  # what run_local_experts reads of DeepEPMoE: the weights and its dispatcher
    def __init__(self, impl: object) -> None:
        g = torch.Generator().manual_seed(1)
        self.w13_weight = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
        self.w2_weight = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
        self.dispatcher = type("D", (), {"_inners": [type("I", (), {"_low_latency_dispatcher":
                                                                     impl})()]})()


def _want(moe: _Moe, x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for t in range(T):
        for j in range(K):
            e = int(ids[t, j])
            if e < 0:
                continue
            gate, up = torch.nn.functional.linear(x[t], moe.w13_weight[e]).chunk(2)
            out[t] += w[t, j] * torch.nn.functional.linear(
                torch.nn.functional.silu(gate) * up, moe.w2_weight[e])
    return out


@pytest.mark.parametrize("impl_cls", [LL_IMPL, NORMAL_IMPL])
def test_dispatch_experts_combine_is_the_weighted_sum(group: dist.ProcessGroup,
                                                      impl_cls: type) -> None:
    from sglang_overlap.sglang.torch_a2a import run_local_experts

    impl = impl_cls(group=group, num_experts=E, num_local_experts=E)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(T, H, generator=g)
    ids = torch.tensor([[0, 3], [1, -1], [3, 3 - 1], [0, 1], [2, 0]])
    w = torch.rand(T, K, generator=g)
    topk = StandardTopKOutput(topk_weights=w, topk_ids=ids, router_logits=torch.zeros(T, E))
    moe = _Moe(impl)
    pending = impl.dispatch_a(x, topk)
    dispatched = impl.dispatch_b(*pending)
    want_type = (deepep.DeepEPLLDispatchOutput if impl_cls is LL_IMPL
                 else deepep.DeepEPNormalDispatchOutput)
    assert isinstance(dispatched, want_type)
    if impl_cls is LL_IMPL:
        moe.dispatcher._inners[0]._low_latency_dispatcher = impl
    else:
        moe.dispatcher._inners[0]._normal_dispatcher = impl
    combine_input, signalled = run_local_experts(moe, impl, dispatched)
    assert not signalled  # no SBO outside a server (every mode off)
    combined = impl.combine_b(*impl.combine_a(combine_input.hidden_states, ids, w))
    torch.testing.assert_close(combined, _want(moe, x, ids, w), rtol=1e-5, atol=1e-5)
    assert experts_of(moe) is experts_of(moe)  # built once per layer


def test_expert_count_mismatch_is_named(group: dist.ProcessGroup) -> None:
    with pytest.raises(ValueError, match="4 experts over 1 ranks is not SGLang's 2 local"):
        LL_IMPL(group=group, num_experts=E, num_local_experts=2)
