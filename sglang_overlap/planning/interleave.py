"""The order in which two micro-batches' stages run under two-batch overlap.

Micro-batch A runs `delta` stages ahead; then A and B alternate stage by stage; then B finishes.
This is SGLang's `execute_overlapped_operations` order (decode: delta 2, prefill: delta 0; a test
checks it against upstream's loop), used by the reference executor and the cost model's schedule.
Because A's stage k always runs before B's stage k (delta >= 0), A's attention of a layer runs
before B's: the property two-chunk overlap relies on (B reads the KV cache that A wrote).
"""

from __future__ import annotations

import functools


@functools.lru_cache(maxsize=256)
def interleaved_order(num_stages: int, delta: int) -> tuple[tuple[int, int], ...]:
    """((micro_batch, stage), ...) with micro_batch 0 = A, 1 = B; every stage of both once."""
    if num_stages < 0:
        raise ValueError(f"num_stages must be >= 0; got {num_stages=}")
    if not 0 <= delta <= num_stages:
        raise ValueError(f"TBO delta_stages={delta} must be in [0, {num_stages}] "
                         "(the number of stages)")
    order: list[tuple[int, int]] = [(0, i) for i in range(delta)]
    for i in range(delta, num_stages):
        order += [(0, i), (1, i - delta)]
    order += [(1, i) for i in range(num_stages - delta, num_stages)]
    return tuple(order)
