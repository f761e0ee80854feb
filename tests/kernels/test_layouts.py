"""kernels/layouts.py (what torch_a2a serves) against the oracle's own placement
(tests/oracle/packing.py, written apart): both layouts, unrouted rows, empty experts, signals,
and a capacity overflow that must fail rather than spill into the next expert."""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.kernels import layouts
from sglang_overlap.kernels.contracts import LowLatencyDispatchOutput, NormalDispatchOutput
from tests.oracle import packing


def _rows(seed: int, r: int, e_local: int, h: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn((r, h), generator=gen)
    expert = torch.randint(0, e_local + 1, (r,), generator=gen)  # e_local = unrouted
    return rows, expert


@pytest.mark.parametrize("layout", ["low_latency", "normal"])
@pytest.mark.parametrize("seed", range(6))
def test_pack_and_unpack_match_the_oracle(layout: str, seed: int) -> None:
    e_local, r = 1 + seed % 4, 3 + 5 * seed
    rows, expert = _rows(seed, r, e_local)
    kw = dict(num_local_experts=e_local, capacity=r, layout=layout, expected_m=7)
    got = layouts.pack(rows, expert, **kw)  # type: ignore[arg-type]
    want = packing.place(rows, expert, **kw)  # type: ignore[arg-type]
    assert type(got) is type(want), f"{seed=}"
    assert torch.equal(got.hidden, want.hidden), f"{layout=} {seed=}"
    if isinstance(got, LowLatencyDispatchOutput):
        assert torch.equal(got.masked_m, want.masked_m) and got.expected_m == 7
    else:
        assert isinstance(got, NormalDispatchOutput)
        assert torch.equal(got.row_expert, want.row_expert)
        assert torch.equal(got.num_tokens_per_expert, want.num_tokens_per_expert)
    out = got.hidden * 2 + 1  # any expert function of the row alone
    back = layouts.unpack(out, got.handle[0])
    assert torch.equal(back, packing.gather_back(out, want.handle[0])), f"{layout=} {seed=}"
    routed = expert < e_local
    assert torch.equal(back[routed], rows[routed] * 2 + 1)
    if layout == "low_latency":
        assert not back[~routed].any()  # unrouted rows come back as zeros


def test_weighted_sum_skips_unrouted_slots_even_nan() -> None:
    pair = torch.tensor([[1.0], [float("nan")], [3.0], [4.0]])  # T=2, K=2
    ids = torch.tensor([[0, -1], [1, 2]])
    w = torch.tensor([[0.5, 9.0], [1.0, 0.25]])
    got = layouts.weighted_sum(pair, ids, w)
    assert got.tolist() == [[0.5], [4.0]]
    assert torch.equal(got, packing.weighted_sum(pair, ids, w))


def test_low_latency_overflow_fails_loudly() -> None:
    rows, expert = torch.ones((3, 4)), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="capacity=2"):
        layouts.pack(rows, expert, num_local_experts=2, capacity=2, layout="low_latency",
                     expected_m=1)
