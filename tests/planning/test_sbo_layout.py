"""Tests for planning/sbo_layout.py: the SBO signal buffer and the compute/comm SM split."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_overlap.planning.sbo_layout import SboLayout, plan_sbo_layout

# H200: 132 SMs. DeepSeek-V3 on EP 8: 32 local experts, hidden 7168, LL buffer of 128 tokens per
# rank from 8 ranks = 1024 rows per expert.
H200 = dict(num_local_experts=32, capacity=1024, hidden=7168, num_sms=132)

# (granularity, block_m, block_n, comm_num_sms) ->
#   (blocks_per_expert, n_tiles, signal_shape, dtype, expect_value, compute_num_sms)
TABLE: list[tuple[Any, ...]] = [
    ("block", 64, 128, 3, (16, 56, (512,), "int32", 56, 129)),  # 1024/64, 7168/128, 32*16
    ("block", 128, 256, 3, (8, 28, (256,), "int32", 28, 129)),
    ("block", 96, 160, 20, (11, 45, (352,), "int32", 45, 112)),  # ceil(1024/96), ceil(7168/160)
    ("expert", 64, 128, 32, (16, 56, (32,), "uint32", 16 * 56, 100)),
    ("expert", 2048, 7168, 1, (1, 1, (32,), "uint32", 1, 131)),  # one tile per expert
]


@pytest.mark.parametrize(("gran", "block_m", "block_n", "comm", "expected"), TABLE)
def test_table(gran: Any, block_m: int, block_n: int, comm: int, expected: tuple[Any, ...]) -> None:
    layout = plan_sbo_layout(**H200, block_m=block_m, block_n=block_n, comm_num_sms=comm,
                             granularity=gran)
    got = (layout.blocks_per_expert, layout.n_tiles, layout.signal_shape, layout.signal_dtype,
           layout.expect_value, layout.compute_num_sms)
    assert got == expected, f"{gran=} {block_m=} {block_n=} {comm=} {got=}"
    assert layout.comm_num_sms == comm and layout.granularity == gran


def test_signal_index_block_and_expert() -> None:
    block = plan_sbo_layout(**H200, block_m=64, block_n=128, comm_num_sms=3, granularity="block")
    assert [block.signal_index(0, 0), block.signal_index(0, 15), block.signal_index(1, 0),
            block.signal_index(31, 15)] == [0, 15, 16, 511]
    expert = plan_sbo_layout(**H200, block_m=64, block_n=128, comm_num_sms=3,
                             granularity="expert")
    assert [expert.signal_index(5, 0), expert.signal_index(5, 15)] == [5, 5]
    for layout in (block, expert):
        for bad in ((32, 0), (-1, 0), (0, 16), (0, -1)):
            with pytest.raises(IndexError, match="out of range"):
                layout.signal_index(*bad)


BAD: list[tuple[dict[str, Any], str]] = [
    (dict(comm_num_sms=132), "comm_num_sms=132 leaves no SM"),
    (dict(comm_num_sms=200), "comm_num_sms=200 leaves no SM"),
    (dict(comm_num_sms=0), "comm_num_sms must be a positive integer; got comm_num_sms=0"),
    (dict(num_sms=0), "num_sms must be a positive"),
    (dict(num_local_experts=0), "num_local_experts=0"),
    (dict(capacity=-1), "capacity=-1"),
    (dict(block_m=0), "block_m=0"),
    (dict(block_n=0), "block_n=0"),
    (dict(hidden=0), "hidden=0"),
    (dict(block_m=64.0), "block_m=64.0"),
    (dict(block_m=True), "block_m=True"),
    (dict(granularity="tile"), "granularity='tile'"),
    (dict(capacity=2**40, block_m=1, granularity="expert"), "overflow 32 bits"),
]


@pytest.mark.parametrize(("override", "match"), BAD)
def test_impossible_requests_are_refused_by_name(override: dict[str, Any], match: str) -> None:
    kwargs: dict[str, Any] = dict(**H200, block_m=64, block_n=128, comm_num_sms=3,
                                  granularity="block")
    kwargs.update(override)
    with pytest.raises(ValueError, match=match.replace("(", r"\(")):
        plan_sbo_layout(**kwargs)


def test_layout_is_a_frozen_value() -> None:
    layout = plan_sbo_layout(**H200, block_m=64, block_n=128, comm_num_sms=3, granularity="block")
    with pytest.raises(AttributeError):
        layout.expect_value = 0  # type: ignore[misc]
    assert layout == plan_sbo_layout(**H200, block_m=64, block_n=128, comm_num_sms=3,
                                     granularity="block")


def tiles_per_counter(layout: SboLayout) -> list[int]:
    """Walk the down GEMM's static tile grid and count the bumps each counter receives."""
    bumps = [0] * layout.num_signals
    for expert in range(layout.num_local_experts):
        for block in range(-(-layout.capacity // layout.block_m)):
            for _n in range(0, layout.hidden, layout.block_n):
                bumps[layout.signal_index(expert, block)] += 1
    return bumps


@settings(max_examples=400, deadline=None)
@given(experts=st.integers(1, 8), capacity=st.integers(1, 600), block_m=st.integers(8, 256),
       block_n=st.integers(16, 512), hidden=st.integers(1, 2048), num_sms=st.integers(2, 200),
       gran=st.sampled_from(["expert", "block"]), data=st.data())
def test_every_counter_reaches_expect_value(experts: int, capacity: int, block_m: int,
                                            block_n: int, hidden: int, num_sms: int, gran: Any,
                                            data: st.DataObject) -> None:
    comm = data.draw(st.integers(1, num_sms - 1))
    layout = plan_sbo_layout(num_local_experts=experts, capacity=capacity, block_m=block_m,
                             block_n=block_n, hidden=hidden, num_sms=num_sms, comm_num_sms=comm,
                             granularity=gran)
    ctx = f"{layout=}"
    assert layout.compute_num_sms + layout.comm_num_sms == num_sms and layout.compute_num_sms >= 1
    assert (layout.blocks_per_expert - 1) * block_m < capacity <= layout.blocks_per_expert * block_m
    assert (layout.n_tiles - 1) * block_n < hidden <= layout.n_tiles * block_n, ctx
    bumps = tiles_per_counter(layout)
    assert bumps == [layout.expect_value] * layout.num_signals, ctx
    assert layout.signal_dtype == ("uint32" if gran == "expert" else "int32"), ctx


@pytest.mark.parametrize("tokens_per_rank,ranks", [(128, 8), (128, 16), (256, 4), (1024, 2)])
def test_shapes_match_upstream_compute_overlap_args(tokens_per_rank: int, ranks: int) -> None:
    # SGLang 0.5.23 single_batch_overlap.compute_overlap_args allocates, for the LL receive buffer
    # of num_tokens_static = tokens_per_rank * ranks rows per expert: Hopper
    # zeros(E * ceil(num_tokens_static / 64), int32); Blackwell zeros(E, uint32); and gives the
    # GEMM total_SMs - communicate_num_sms (3 on Hopper, 32 on Blackwell).
    static = tokens_per_rank * ranks
    hopper = plan_sbo_layout(num_local_experts=16, capacity=static, block_m=64, block_n=128,
                             hidden=7168, num_sms=132, comm_num_sms=3, granularity="block")
    assert (hopper.signal_shape, hopper.signal_dtype) == ((16 * -(-static // 64),), "int32")
    assert hopper.compute_num_sms == 129
    blackwell = plan_sbo_layout(num_local_experts=16, capacity=static, block_m=128, block_n=128,
                                hidden=7168, num_sms=148, comm_num_sms=32, granularity="expert")
    assert (blackwell.signal_shape, blackwell.signal_dtype) == ((16,), "uint32")
    assert blackwell.compute_num_sms == 116
