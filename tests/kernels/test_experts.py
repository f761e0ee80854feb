"""The served torch expert runner (`kernels.experts.TorchExperts`, what torch_a2a serves) against
the oracle (`reference.experts.ReferenceExperts`, a separate batch-independent implementation),
on both DeepEP layouts, with and without SBO signals."""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.kernels.contracts import LowLatencyDispatchOutput, NormalDispatchOutput
from sglang_overlap.kernels.experts import TorchExperts
from sglang_overlap.kernels.signals import SignalContract
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from tests.oracle.experts import ReferenceExperts

E, C, H, INTER = 4, 9, 16, 8


def _weights(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(E, 2 * INTER, H, generator=g, dtype=torch.float64) * H**-0.5
    w2 = torch.randn(E, H, INTER, generator=g, dtype=torch.float64) * INTER**-0.5
    return w13, w2


@pytest.mark.parametrize("counts", [[9, 0, 3, 1], [0, 0, 0, 0], [9, 9, 9, 9], [0, 0, 9, 0]])
@pytest.mark.parametrize("granularity", [None, "expert", "block"])
def test_low_latency_matches_the_oracle(counts: list[int], granularity: str | None) -> None:
    w13, w2 = _weights(sum(counts))
    hidden = torch.randn(E, C, H, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    d = LowLatencyDispatchOutput(hidden, torch.tensor(counts, dtype=torch.int32), 4, None)
    signal = None
    if granularity is not None:
        signal = SignalContract(plan_sbo_layout(
            num_local_experts=E, capacity=C, block_m=4, block_n=8, hidden=H, num_sms=8,
            comm_num_sms=1, granularity=granularity), "cpu")  # type: ignore[arg-type]
    got = TorchExperts(w13, w2).run_low_latency(d, signal=signal)
    if signal is not None:
        signal.finish()  # runs the producer to the end, checking every unit was marked once
        assert (signal.signal.to(torch.int64) == signal.layout.expect_value).all()
    want = ReferenceExperts(w13, w2).run_low_latency(d)
    valid = torch.arange(C)[None, :] < torch.tensor(counts)[:, None]  # [E, C]
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-12, atol=1e-12)
    assert not got[~valid].any(), f"{counts=}: rows past masked_m must stay 0"


def test_normal_layout_matches_the_oracle() -> None:
    w13, w2 = _weights(3)
    counts = torch.tensor([2, 0, 5, 1], dtype=torch.int32)
    rows = int(counts.sum()) + 3  # 3 padding rows at the end
    row_expert = torch.cat([torch.arange(E).repeat_interleave(counts.long()),
                            torch.full((3,), -1)]).int()
    x = torch.randn(rows, H, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    d = NormalDispatchOutput(x, row_expert, counts, None)
    got = TorchExperts(w13, w2).run_normal(d)
    want = ReferenceExperts(w13, w2).run_normal(d)
    valid = row_expert >= 0
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-12, atol=1e-12)
    assert not got[~valid].any()


def test_mismatched_weights_are_refused_with_shapes() -> None:
    w13, w2 = _weights(0)
    with pytest.raises(ValueError, match=r"w13 \[E, 2I, H\] and w2 \[E, H, I\]"):
        TorchExperts(w13[:, :-1], w2)
