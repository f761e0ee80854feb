"""Single-batch overlap (SBO): the signal buffer between the down GEMM and the combine send.

The down GEMM of the low-latency MoE path is a masked grouped GEMM over the receive buffer
[E_local, capacity, H]. Its output is cut into tiles of block_m rows by block_n columns; each
tile, once written, bumps a counter. The combine-send kernel waits on each counter until it reads
`expect_value`, then sends the rows the counter covers. Two granularities:

- "expert": one uint32 counter per local expert (the `src_signals` layout of sgl-deep-ep's
  `low_latency_combine(overlap=True, src_signals=..., src_signal_expect_value=...)`). Every tile
  of the expert's static grid (blocks_per_expert x n_tiles) bumps once, empty tiles included, so
  the final value does not depend on how many tokens the expert received.
- "block": one int32 counter per (expert, block_m row-block), final after n_tiles bumps: the
  combine can send each row-block as soon as its own tiles are done.

The SMs are shared: the GEMM runs on compute_num_sms, the combine send on comm_num_sms.

Plain Python on ints; no torch, no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Granularity = Literal["expert", "block"]

_INT32_MAX = 2**31 - 1
_GRANULARITIES = ("expert", "block")

HOPPER_NUM_SMS = 132
"""SMs of an H100 / H200 SXM; also the nominal count where no GPU is present (CPU)."""
BLACKWELL_NUM_SMS = 148
"""SMs of a B200."""


def default_comm_num_sms(blackwell: bool) -> int:
    """SMs upstream SGLang gives the combine send beside the down GEMM: 32 on Blackwell, 3 on
    Hopper (--sbo-combine-num-sms 0 means this)."""
    return 32 if blackwell else 3


@dataclass(frozen=True)
class SboLayout:
    """The signal buffer and SM split for one SBO down-GEMM / combine pair."""

    granularity: Granularity
    num_local_experts: int
    capacity: int  # static tokens per local expert (the LL buffer's per-expert rows)
    block_m: int
    block_n: int
    hidden: int  # N of the down GEMM
    blocks_per_expert: int  # ceil(capacity / block_m)
    n_tiles: int  # ceil(hidden / block_n)
    signal_shape: tuple[int, ...]  # (E,) for expert, (E * blocks_per_expert,) for block
    signal_dtype: Literal["int32", "uint32"]  # uint32 per expert, int32 per block
    expect_value: int  # a counter's value once its unit is final (see the module docstring)
    compute_num_sms: int
    comm_num_sms: int

    @property
    def num_signals(self) -> int:
        return self.signal_shape[0]

    def signal_index(self, expert: int, block: int) -> int:
        """The counter covering row-block `block` of local expert `expert`.

        block granularity: expert * blocks_per_expert + block; expert granularity: expert.
        """
        if not 0 <= expert < self.num_local_experts:
            raise IndexError(f"expert={expert} out of range [0, {self.num_local_experts})")
        if not 0 <= block < self.blocks_per_expert:
            raise IndexError(f"block={block} out of range [0, {self.blocks_per_expert}) "
                             f"(capacity={self.capacity}, block_m={self.block_m})")
        if self.granularity == "expert":
            return expert
        return expert * self.blocks_per_expert + block


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"SBO layout: {name} must be a positive integer; got {name}={value!r}")


def plan_sbo_layout(
    *,
    num_local_experts: int,
    capacity: int,
    block_m: int,
    block_n: int,
    hidden: int,
    num_sms: int,
    comm_num_sms: int,
    granularity: Granularity,
) -> SboLayout:
    """Lay out the SBO signal buffer and split the SMs; ValueError names any impossible value.

    `capacity` is the static per-expert row count of the low-latency receive buffer
    (num_max_dispatch_tokens_per_rank * num_ranks); `num_sms` is the device's SM count and
    `comm_num_sms` the SMs asked for the combine send (at least 1 must be left for the GEMM).
    """
    _check_positive(num_local_experts=num_local_experts, capacity=capacity, block_m=block_m,
                    block_n=block_n, hidden=hidden, num_sms=num_sms, comm_num_sms=comm_num_sms)
    if granularity not in _GRANULARITIES:
        raise ValueError(f"SBO layout: granularity must be one of {_GRANULARITIES}; "
                         f"got granularity={granularity!r}")
    if comm_num_sms >= num_sms:
        raise ValueError(f"SBO layout: comm_num_sms={comm_num_sms} leaves no SM for the down "
                         f"GEMM on a device with num_sms={num_sms}; ask for fewer combine SMs")
    blocks_per_expert = -(-capacity // block_m)
    n_tiles = -(-hidden // block_n)
    if granularity == "expert":
        shape: tuple[int, ...] = (num_local_experts,)
        dtype: Literal["int32", "uint32"] = "uint32"
        expect = blocks_per_expert * n_tiles
    else:
        shape = (num_local_experts * blocks_per_expert,)
        dtype = "int32"
        expect = n_tiles
    if expect > _INT32_MAX or shape[0] > _INT32_MAX:
        raise ValueError(f"SBO layout: counters overflow 32 bits ({expect=}, signals={shape[0]}) "
                         f"for {capacity=}, {block_m=}, {hidden=}, {block_n=}")
    return SboLayout(
        granularity=granularity,
        num_local_experts=num_local_experts,
        capacity=capacity,
        block_m=block_m,
        block_n=block_n,
        hidden=hidden,
        blocks_per_expert=blocks_per_expert,
        n_tiles=n_tiles,
        signal_shape=shape,
        signal_dtype=dtype,
        expect_value=expect,
        compute_num_sms=num_sms - comm_num_sms,
        comm_num_sms=comm_num_sms,
    )


__all__ = ["BLACKWELL_NUM_SMS", "HOPPER_NUM_SMS", "Granularity", "SboLayout",
           "default_comm_num_sms", "plan_sbo_layout"]
