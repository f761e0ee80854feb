"""kernels/signal_sliced.py on the CPU: slice planning and the signal range each slice marks."""

from __future__ import annotations

import pytest

from sglang_overlap.kernels.signal_sliced import plan_expert_slices, slice_signal_range
from sglang_overlap.planning.sbo_layout import plan_sbo_layout


def _layout(granularity: str, e: int, cap: int, bm: int):
    return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=bm, block_n=128,
                           hidden=7168, num_sms=132, comm_num_sms=3,
                           granularity=granularity)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("experts", "size", "want"),
    [
        (8, 1, tuple((i, i + 1) for i in range(8))),
        (8, 2, ((0, 2), (2, 4), (4, 6), (6, 8))),
        (32, 8, ((0, 8), (8, 16), (16, 24), (24, 32))),
        (5, 2, ((0, 2), (2, 4), (4, 5))),
        (3, 3, ((0, 3),)),
    ],
)
def test_plan_expert_slices_table(experts: int, size: int, want: tuple) -> None:
    assert plan_expert_slices(experts, size) == want


@pytest.mark.parametrize("experts", range(1, 40))
def test_plan_expert_slices_cover_every_expert_once_in_order(experts: int) -> None:
    for size in range(1, experts + 1):
        slices = plan_expert_slices(experts, size)
        flat = [x for s, e in slices for x in range(s, e)]
        assert flat == list(range(experts)), f"{experts=} {size=} {slices=}"
        assert all(e - s == size for s, e in slices[:-1]), f"{experts=} {size=}"


@pytest.mark.parametrize(("experts", "size"), [(0, 1), (4, 0), (4, 5), (-1, 1)])
def test_plan_expert_slices_rejects_bad_values(experts: int, size: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        plan_expert_slices(experts, size)


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_slice_signal_range_matches_layout_indices(granularity: str) -> None:
    lay = _layout(granularity, e=6, cap=200, bm=64)
    for start, end in plan_expert_slices(6, 4) + plan_expert_slices(6, 1):
        lo, hi = slice_signal_range(lay, start, end)
        want = sorted({lay.signal_index(x, b) for x in range(start, end)
                       for b in range(lay.blocks_per_expert)})
        assert list(range(lo, hi)) == want, f"{granularity=} {start=} {end=}"


def test_a_cpu_signal_is_stored_in_host_order_for_the_slice_only() -> None:
    from sglang_overlap.kernels.signal_sliced import write_slice_signal
    from sglang_overlap.kernels.signals import new_signal

    lay = _layout("block", e=6, cap=200, bm=64)
    signal = new_signal(lay, "cpu")
    write_slice_signal(signal, lay, 2, 4)
    lo, hi = slice_signal_range(lay, 2, 4)
    assert (signal[lo:hi] == lay.expect_value).all()
    assert signal[:lo].eq(0).all() and signal[hi:].eq(0).all()
