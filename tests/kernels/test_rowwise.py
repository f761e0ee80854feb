"""Batch-independent CPU math: a row's result is the same bits whatever rows share its batch,
and agrees with the library calls within float32 tolerance."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_overlap.kernels import rowwise

SLICES = [(s, n) for s in (0, 1, 13) for n in (1, 2, 3, 5, 17, 64)]


@pytest.fixture(scope="module")
def data() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {"x": torch.randn(101, 64, generator=g), "w": torch.randn(48, 64, generator=g),
            "ws": torch.randn(5, 40, 64, generator=g), "idx": torch.randint(0, 5, (101,),
                                                                             generator=g),
            "z": torch.randn(101, 64, generator=g) * 4}


@pytest.mark.parametrize(("start", "n"), SLICES)
def test_rows_do_not_depend_on_the_batch(data: dict[str, torch.Tensor], start: int,
                                         n: int) -> None:
    x, w, z, ws, idx = data["x"], data["w"], data["z"], data["ws"], data["idx"]
    sl = slice(start, start + n)
    assert torch.equal(rowwise.linear(x[sl], w), rowwise.linear(x, w)[sl])
    assert torch.equal(rowwise.sigmoid(z[sl]), rowwise.sigmoid(z)[sl])
    assert torch.equal(rowwise.sigmoid(z[sl].reshape(-1)[3:]),
                       rowwise.sigmoid(z[sl]).reshape(-1)[3:])
    assert torch.equal(rowwise.silu_and_mul(z[sl]), rowwise.silu_and_mul(z)[sl])
    assert torch.equal(rowwise.gathered_linear(x[sl], ws, idx[sl]),
                       rowwise.gathered_linear(x, ws, idx)[sl])


def test_agrees_with_library_calls(data: dict[str, torch.Tensor]) -> None:
    x, w, z, ws, idx = data["x"], data["w"], data["z"], data["ws"], data["idx"]
    tol = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(rowwise.linear(x, w), F.linear(x, w), **tol)
    torch.testing.assert_close(rowwise.sigmoid(z), torch.sigmoid(z), **tol)
    gate, up = z.chunk(2, -1)
    torch.testing.assert_close(rowwise.silu_and_mul(z), F.silu(gate) * up, **tol)
    want = torch.stack([ws[idx[r]] @ x[r] for r in range(x.shape[0])])
    torch.testing.assert_close(rowwise.gathered_linear(x, ws, idx), want, **tol)
    xb = x[:40].view(5, 8, 64)
    torch.testing.assert_close(rowwise.batched_linear(xb, ws), torch.bmm(xb, ws.transpose(1, 2)),
                               **tol)


def test_empty_and_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    w = torch.randn(8, 4)
    assert rowwise.linear(torch.zeros(0, 4), w).shape == (0, 8)
    assert rowwise.linear(torch.zeros(2, 0, 4), w).shape == (2, 0, 8)
    assert rowwise.batched_linear(torch.zeros(0, 3, 4), torch.zeros(0, 8, 4)).shape == (0, 3, 8)
    x = torch.randn(10, 4)
    whole = rowwise.linear(x, w)
    monkeypatch.setattr(rowwise, "_CPU_CHUNK_ELEMS", 64)  # two rows per chunk
    assert torch.equal(rowwise.linear(x, w), whole)
