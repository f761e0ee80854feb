"""Tests for kernels/contracts.py: the dispatcher and expert-runner contracts, checked on the
torch backends a server runs (`a2a.AllToAllDispatcher` on a one-rank gloo group,
`experts.TorchExperts`). The layouts' shapes and dtypes, the expected_m hint, rows grouped by
local expert, and combine = sum over routed k of topk_weights x UNWEIGHTED expert output."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from sglang_overlap.kernels.a2a import AllToAllDispatcher
from sglang_overlap.kernels.contracts import (
    Dispatcher,
    ExpertRunner,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
)
from sglang_overlap.kernels.experts import TorchExperts

E, H, K, T = 4, 8, 2, 5


@pytest.fixture(scope="module")
def disp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AllToAllDispatcher]:
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        yield AllToAllDispatcher(E, max_tokens_per_rank=T)
    finally:
        dist.destroy_process_group()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    hidden = torch.randn(T, H)
    ids = torch.tensor([[0, 2], [2, -1], [3, 0], [-1, -1], [1, 3]])
    weights = torch.rand(T, K)
    return hidden, ids, weights


def _combined(hidden: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
              scale: torch.Tensor) -> torch.Tensor:
    """sum_k w[t, k] * (scale[e] * x_t) over routed k, in k order (unweighted out = scale * x)."""
    out = torch.zeros_like(hidden)
    for t in range(T):
        for k in range(K):
            e = int(ids[t, k])
            if e >= 0:
                out[t] += weights[t, k] * (scale[e] * hidden[t])
    return out


def test_torch_backends_satisfy_the_protocols(disp: AllToAllDispatcher) -> None:
    assert isinstance(disp, Dispatcher)
    assert disp.world_size == 1 and disp.num_experts == E
    runner = TorchExperts(torch.zeros(E, 2 * 128, H), torch.zeros(E, H, 128))
    assert isinstance(runner, ExpertRunner)
    assert not isinstance(object(), Dispatcher) and not isinstance(object(), ExpertRunner)


def test_outputs_are_frozen() -> None:
    z = torch.zeros(1)
    out = LowLatencyDispatchOutput(hidden=z, masked_m=z, expected_m=1, handle=None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.expected_m = 2  # type: ignore[misc]


def test_low_latency_layout_and_weighted_combine(disp: AllToAllDispatcher) -> None:
    hidden, ids, weights = _batch()
    d = disp.dispatch_recv(disp.dispatch_send(hidden, ids, weights, layout="low_latency",
                                              slot=0))
    assert isinstance(d, LowLatencyDispatchOutput)
    assert d.hidden.shape == (E, disp.capacity, H) and d.hidden.dtype == hidden.dtype
    assert d.masked_m.dtype == torch.int32
    assert d.masked_m.tolist() == [int((ids == e).sum()) for e in range(E)]  # [2, 1, 2, 2]
    # expected_m, a tiling hint: (T x world x K + E) // E when every slot is routed (this
    # backend counts the rows it received, so unrouted slots lower it: 7 rows -> 2, not 3)
    assert isinstance(d.expected_m, int) and d.expected_m == (7 + E) // E
    every = torch.tensor([[0, 1], [2, 3], [0, 2], [1, 3], [0, 3]])
    full = disp.dispatch_recv(disp.dispatch_send(hidden, every, weights,
                                                 layout="low_latency", slot=0))
    assert full.expected_m == (T * 1 * K + E) // E
    for e in range(E):  # each valid row is a token routed to e
        rows = d.hidden[e, : int(d.masked_m[e])]
        want = hidden[(ids == e).any(dim=1)]
        assert sorted(map(tuple, rows.tolist())) == sorted(map(tuple, want.tolist()))
    scale = torch.arange(1.0, E + 1)
    got = disp.combine_recv(disp.combine_send(d.hidden * scale[:, None, None], d))
    assert torch.allclose(got, _combined(hidden, ids, weights, scale), atol=1e-6)
    assert torch.all(got[3] == 0)  # a token with no routed k gets zeros


def test_normal_layout_groups_rows_by_expert_and_combines(disp: AllToAllDispatcher) -> None:
    hidden, ids, weights = _batch()
    d = disp.dispatch_recv(disp.dispatch_send(hidden, ids, weights, layout="normal", slot=1))
    assert isinstance(d, NormalDispatchOutput)
    assert d.row_expert.dtype == torch.int32 and d.num_tokens_per_expert.dtype == torch.int32
    assert d.num_tokens_per_expert.tolist() == [2, 1, 2, 2]
    real = d.row_expert[d.row_expert >= 0].tolist()
    assert real == sorted(real) and len(real) == 7  # grouped, increasing expert order
    assert d.hidden.shape == (d.row_expert.shape[0], H)
    expert = d.row_expert.clamp(min=0).long()
    scale = torch.arange(1.0, E + 1)
    out = d.hidden * scale[expert][:, None]
    got = disp.combine_recv(disp.combine_send(out, d))
    assert torch.allclose(got, _combined(hidden, ids, weights, scale), atol=1e-6)
