"""The kit's local experts of a DeepEP normal dispatch (cpu_shim/sglang_cpu_shim/
normal_experts.py): ep_scatter's contiguous layout on a hand-worked case, and the experts'
output (the stand-in deep_gemm's contiguous GEMMs, then ep_gather) equal to each row's
weighted sum of its local experts computed directly, unquantized and in fp8."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

KIT = Path(__file__).resolve().parent
E_LOCAL, H, INTER, K = 3, 128, 128, 2


@pytest.fixture
def shim(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The shim and the stand-in deep_gemm importable for one test, restored after."""
    for path in (KIT / "cpu_shim", KIT / "standins" / "deep_gemm"):
        monkeypatch.syspath_prepend(str(path))
    for name in [m for m in sys.modules if m.split(".")[0] == "deep_gemm"]:
        monkeypatch.delitem(sys.modules, name)
    yield
    for name in [m for m in sys.modules if m.split(".")[0] == "deep_gemm"]:
        del sys.modules[name]


def test_contiguous_layout_groups_rows_per_expert_aligned(shim: None) -> None:
    from sglang_cpu_shim.normal_experts import contiguous_layout

    ids = torch.tensor([[0, -1], [1, 0], [-1, -1], [1, -1]])
    src, m_indices, out_idx = contiguous_layout(ids, 2, 4)
    assert src.tolist() == [0, 1, -1, -1, 1, 3, -1, -1]
    assert m_indices.tolist() == [0, 0, -1, -1, 1, 1, -1, -1]
    assert out_idx.tolist() == [[0, -1], [4, 1], [-1, -1], [5, -1]]
    src, m_indices, out_idx = contiguous_layout(torch.full((2, K), -1), 2, 4)
    assert src.numel() == m_indices.numel() == 0 and (out_idx == -1).all()


def _case(seed: int) -> tuple[SimpleNamespace, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    layer = SimpleNamespace(w13_weight=torch.randn(E_LOCAL, 2 * INTER, H, generator=g) / 8,
                            w2_weight=torch.randn(E_LOCAL, H, INTER, generator=g) / 8)
    rows = 7
    x = torch.randn(rows, H, generator=g)
    ids = torch.randint(-1, E_LOCAL, (rows, K), generator=g)
    ids[:, 1] = torch.where(ids[:, 1] == ids[:, 0], -1, ids[:, 1])  # distinct experts
    ids[2] = torch.tensor([-1, 1])
    w = torch.where(ids >= 0, torch.rand(rows, K, generator=g), 0.0)
    return layer, x, ids, w


def _reference(x: torch.Tensor, ids: torch.Tensor, w: torch.Tensor, w13: torch.Tensor,
               w2: torch.Tensor, act_quant: bool) -> torch.Tensor:
    from sglang_cpu_shim.deep_ep_gloo import quantize_fp8

    out = torch.zeros_like(x)
    for r in range(x.shape[0]):
        for k in range(K):
            e = int(ids[r, k])
            if e < 0:
                continue
            gate, up = (x[r] @ w13[e].T).chunk(2)
            act = F.silu(gate) * up
            if act_quant:
                q, s = quantize_fp8(act)
                act = q.float() * s.repeat_interleave(128, -1)
            out[r] += w[r, k] * (act @ w2[e].T)
    return out


def _counts(ids: torch.Tensor) -> list[int]:
    return [int((ids == e).any(-1).sum()) for e in range(E_LOCAL)]


def test_unquantized_experts_are_each_rows_weighted_sum(shim: None) -> None:
    from sglang_cpu_shim.normal_experts import experts_output

    layer, x, ids, w = _case(3)
    have = experts_output(layer, x, None, ids, w, _counts(ids), fp8=False)
    want = _reference(x, ids, w, layer.w13_weight, layer.w2_weight, act_quant=False)
    torch.testing.assert_close(have, want, rtol=1e-5, atol=1e-5)
    assert not have[(ids < 0).all(-1)].any()


def test_fp8_experts_are_the_dequantized_products(shim: None) -> None:
    from sglang_cpu_shim.deep_ep_gloo import COUNTERS, quantize_fp8
    from sglang_cpu_shim.normal_experts import experts_output

    from sglang_overlap.kernels.fp8 import quant_per_block

    layer, x, ids, w = _case(4)
    q, s = quantize_fp8(x)
    before = COUNTERS["fp8_experts"]
    have = experts_output(layer, q, s, ids, w, _counts(ids), fp8=True)
    assert COUNTERS["fp8_experts"] == before + 1

    def deq(weight: torch.Tensor) -> torch.Tensor:
        wq, ws = quant_per_block(weight)
        return wq.float() * ws.repeat_interleave(128, 1).repeat_interleave(128, 2)

    x_deq = q.float() * s.repeat_interleave(128, -1)
    want = _reference(x_deq, ids, w, deq(layer.w13_weight), deq(layer.w2_weight),
                      act_quant=True)
    torch.testing.assert_close(have, want, rtol=1e-4, atol=1e-4)
    # a dispatch in the model's dtype is quantized here: the same values
    again = experts_output(layer, x, None, ids, w, _counts(ids), fp8=True)
    assert torch.equal(again, have)


def test_counts_not_of_the_rows_are_an_error(shim: None) -> None:
    from sglang_cpu_shim.normal_experts import experts_output

    layer, x, ids, w = _case(5)
    wrong = [c + 1 for c in _counts(ids)]
    with pytest.raises(ValueError, match="num_recv_tokens_per_expert"):
        experts_output(layer, x, None, ids, w, wrong, fp8=False)
