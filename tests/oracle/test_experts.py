"""The reference backend against a dense float64 MoE formula: both layouts, unrouted (-1) slots,
empty experts, an empty batch, capacity overflow; and the layouts' documented shapes."""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.kernels.contracts import (
    Dispatcher,
    ExpertRunner,
    LowLatencyDispatchOutput,
    NormalDispatchOutput,
)
from tests.oracle.experts import LocalDispatcher, ReferenceExperts, swiglu

E, H, INTER, K = 8, 64, 32, 3


def dense_moe(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, w13: torch.Tensor,
              w2: torch.Tensor) -> torch.Tensor:
    """float64, token by token: sum_k w[t,k] * down(silu(gate) * up) of expert ids[t,k]."""
    x, w, w13, w2 = x.double(), w.double(), w13.double(), w2.double()
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e = int(ids[t, k])
            if e < 0:
                continue
            gate, up = (w13[e] @ x[t]).chunk(2)
            out[t] += w[t, k] * (w2[e] @ (torch.nn.functional.silu(gate) * up))
    return out


def _inputs(t: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, H, generator=g)
    experts = torch.tensor([e for e in range(E) if e != 5])  # expert 5 never gets a token
    ids = torch.stack([experts[torch.randperm(E - 1, generator=g)[:K]] for _ in range(t)]) if t \
        else torch.zeros(0, K, dtype=torch.int64)
    ids[torch.rand(ids.shape, generator=g) < 0.2] = -1  # some unrouted slots
    w = torch.rand(t, K, generator=g)
    w13 = torch.randn(E, 2 * INTER, H, generator=g) * H**-0.5
    w2 = torch.randn(E, H, INTER, generator=g) * INTER**-0.5
    return x, ids, w, w13, w2


@pytest.mark.parametrize("layout", ["low_latency", "normal"])
@pytest.mark.parametrize("t", [0, 1, 5, 23])
def test_local_dispatch_and_experts_match_dense_formula(layout: str, t: int) -> None:
    x, ids, w, w13, w2 = _inputs(t, seed=t)
    disp = LocalDispatcher(E, capacity=max(t, 1))
    runner = ReferenceExperts(w13, w2)
    assert isinstance(disp, Dispatcher) and isinstance(runner, ExpertRunner)
    d = disp.dispatch_recv(disp.dispatch_send(x, ids, w, layout=layout, slot=0))  # type: ignore[arg-type]
    routed = int((ids >= 0).sum())
    if layout == "low_latency":
        assert isinstance(d, LowLatencyDispatchOutput)
        assert d.hidden.shape == (E, max(t, 1), H) and d.masked_m.dtype == torch.int32
        out = runner.run_low_latency(d)
    else:
        assert isinstance(d, NormalDispatchOutput)
        assert d.row_expert.dtype == torch.int32 and d.hidden.shape[1] == H
        real = d.row_expert >= 0
        assert torch.equal(d.row_expert[real], d.row_expert[real].sort().values)
        assert int(d.num_tokens_per_expert.sum()) == int(real.sum())
        out = runner.run_normal(d)
    assert int(d.num_tokens_per_expert.sum() if layout == "normal" else d.masked_m.sum()) == routed
    counts = d.num_tokens_per_expert if layout == "normal" else d.masked_m
    if t:
        assert int(counts[5]) == 0, "expert 5 should be empty"
    got = disp.combine_recv(disp.combine_send(out, d))
    torch.testing.assert_close(got.double(), dense_moe(x, ids, w, w13, w2), rtol=1e-5, atol=1e-5)


def test_low_latency_rows_are_in_received_order() -> None:
    x = torch.arange(4, dtype=torch.float32)[:, None].expand(4, H).contiguous()
    ids = torch.tensor([[2, 0], [2, -1], [0, 1], [2, 1]])
    disp = LocalDispatcher(4, capacity=3)
    d = disp.dispatch_recv(disp.dispatch_send(x, ids, torch.ones(4, 2), layout="low_latency",
                                              slot=0))
    assert d.masked_m.tolist() == [2, 2, 3, 0]
    assert d.hidden[2, :3, 0].tolist() == [0.0, 1.0, 3.0]  # tokens 0, 1, 3 in token order
    assert d.hidden[0, :2, 0].tolist() == [0.0, 2.0]


def test_low_latency_capacity_overflow_fails_loudly() -> None:
    x = torch.randn(5, H)
    ids = torch.zeros(5, 1, dtype=torch.int64)  # five tokens to expert 0
    disp = LocalDispatcher(E, capacity=4)
    with pytest.raises(RuntimeError, match="capacity=4"):
        disp.dispatch_send(x, ids, torch.ones(5, 1), layout="low_latency", slot=0)


def test_expert_weight_shapes_are_checked() -> None:
    with pytest.raises(ValueError, match="w13"):
        ReferenceExperts(torch.zeros(2, 10, H), torch.zeros(2, H, 4))


def test_swiglu_matches_formula() -> None:
    g = torch.Generator().manual_seed(0)
    x, w13, w2 = (torch.randn(6, H, generator=g), torch.randn(2 * INTER, H, generator=g),
                  torch.randn(H, INTER, generator=g))
    gate, up = (x @ w13.T).chunk(2, -1)
    torch.testing.assert_close(swiglu(x, w13, w2),
                               (torch.nn.functional.silu(gate) * up) @ w2.T, rtol=1e-5,
                               atol=1e-4)
