"""The SBO down-GEMM entry: which producer runs per shape, and the layout it is given."""

from __future__ import annotations

import pytest

from sglang_overlap.kernels.down_gemm import (
    DEEPGEMM_CAPACITY_ALIGN,
    choose_signal_path,
    fused_config,
    signal_layout,
)
from sglang_overlap.kernels.signal_gemm import default_config


@pytest.mark.parametrize(
    ("experts", "m", "want"),
    [
        (8, 16, ("sliced", 2, 2)),  # capacity 256 is padded: the fused kernel pays for it
        (8, 64, ("sliced", 2, 2)),
        (8, 128, ("sliced", 2, 2)),
        (8, 256, ("sliced", 4, 1)),
        (16, 16, ("sliced", 4, 2)),
        (16, 256, ("sliced", 8, 1)),
        (32, 64, ("sliced", 8, 2)),
        (32, 256, ("sliced", 8, 1)),
        (2, 512, ("sliced", 1, 1)),
        (1, 128, ("sliced", 1, 2)),
    ],
)
def test_choose_signal_path_table(experts: int, m: int, want: tuple[str, int, int]) -> None:
    # the H200 measurements behind each row are in choose_signal_path's docstring
    plan = choose_signal_path(experts, m, capacity=256)
    assert (plan.path, plan.slice_experts, plan.streams) == want, f"{experts=} {m=} {plan=}"
    assert plan.why


@pytest.mark.parametrize("capacity", [16, 32, 96, 200])
def test_capacities_deepgemm_miscomputes_take_the_fused_kernel(capacity: int) -> None:
    for experts, m in ((32, 64), (16, 256)):
        plan = choose_signal_path(experts, m, capacity)
        assert plan.path == "fused" and str(capacity) in plan.why, f"{capacity=} {plan=}"
    assert choose_signal_path(32, 64, DEEPGEMM_CAPACITY_ALIGN * 3).path == "sliced"


@pytest.mark.parametrize("experts", [1, 8, 15])
@pytest.mark.parametrize("m", [1, 16, 64])
def test_fused_serves_few_experts_in_an_unpadded_buffer(experts: int, m: int) -> None:
    assert choose_signal_path(experts, m, capacity=64).path == "fused"
    padded = choose_signal_path(experts, m, capacity=128)
    assert padded.path == "sliced" and "padded" in padded.why, padded
    assert choose_signal_path(16, m, capacity=64).path == "sliced"


@pytest.mark.parametrize(("experts", "expected_m", "capacity", "m_inner"), [
    (32, 256, 256, True), (32, 192, 256, True),  # every m block has rows, many experts
    (32, 128, 256, False), (32, 64, 256, False),  # empty blocks: n tiles innermost
    (16, 256, 256, False), (8, 256, 256, False), (8, 16, 64, False)])
def test_fused_tile_order(experts: int, expected_m: int, capacity: int, m_inner: bool) -> None:
    layout = signal_layout(num_local_experts=experts, capacity=capacity, hidden=7168,
                           expected_m=expected_m, granularity="expert", num_sms=132,
                           comm_num_sms=3)
    assert fused_config(layout, expected_m).m_inner is m_inner


@pytest.mark.parametrize("expected_m", [1, 64, 65, 256])
@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_signal_layout_follows_the_fused_tiles(expected_m: int, granularity: str) -> None:
    layout = signal_layout(num_local_experts=8, capacity=256, hidden=7168, expected_m=expected_m,
                           granularity=granularity, num_sms=132, comm_num_sms=3)
    tiles = default_config(expected_m)
    assert (layout.block_m, layout.block_n) == (tiles.block_m, tiles.block_n)
    assert layout.granularity == granularity and layout.comm_num_sms == 3
    assert layout.compute_num_sms == 129
    cfg = fused_config(layout, expected_m)
    assert (cfg.block_m, cfg.block_n, cfg.num_warps) == (
        layout.block_m, layout.block_n, tiles.num_warps)
    assert cfg.programs(layout.compute_num_sms) == layout.compute_num_sms * max(
        1, tiles.ctas_per_sm)
