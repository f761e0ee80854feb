"""Expert parallelism over gloo with 2 and 4 processes: every executor, on every rank, equals the
single-process serial reference bit for bit (float32), and the hot path syncs only in
`_exchange_counts`.

Covered per world size: decode with an idle rank and a batch-1 rank; extend with a two-chunk cut
inside a long request, batch 1 and an idle rank; routing where each token's top-k reaches every
rank while most experts receive zero tokens.
"""

from __future__ import annotations

import datetime
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_overlap.kernels.a2a import AllToAllDispatcher
from sglang_overlap.planning.two_batch import ForwardKind
from tests.fixtures.oracle_cases import (
    EXECUTORS,
    ROUTER,
    Case,
    assert_bitwise,
    local_layers,
    no_host_sync,
    run,
)
from tests.fixtures.toy import toy_layers
from tests.oracle.router import RouterConfig, gate_logits, select_experts

DECODE, EXTEND = ForwardKind.DECODE, ForwardKind.EXTEND
DECODE_TOKENS = (7, 1, 0, 4)  # rank 2 of 4 is idle, rank 1 has batch 1
EXTEND_LENS = ((5, 9, 3), (37,), (), (1,))
EXTEND_PREFIX = ((0, 2, 0), (5,), (), (3,))
SPREAD_TOKENS = (3, 2, 5, 1)


def _spread_router(world: int) -> tuple[RouterConfig, tuple[float, ...]]:
    """A bias that makes expert r*E_local a top choice of every token, for each rank r."""
    e_local = ROUTER.num_experts // world
    bias = tuple(10.0 if e % e_local == 0 else 0.0 for e in range(ROUTER.num_experts))
    return RouterConfig(ROUTER.num_experts, top_k=4, routed_scaling_factor=2.5), bias


def scenarios(world: int, rank: int) -> dict[str, tuple[Case, int]]:
    """name -> (this rank's case, max tokens on any rank)."""
    dec = DECODE_TOKENS[:world]
    ext = EXTEND_LENS[:world]
    router, bias = _spread_router(world)
    spread = SPREAD_TOKENS[:world]
    return {
        "decode": (Case(DECODE, (1,) * dec[rank], tuple(range(dec[rank])), seed=10 + rank),
                   max(dec)),
        "extend": (Case(EXTEND, ext[rank], EXTEND_PREFIX[rank], seed=20 + rank),
                   max(sum(x) for x in ext)),
        "spread": (Case(DECODE, (1,) * spread[rank], (2,) * spread[rank], seed=30 + rank,
                        router=router, bias=bias), max(spread)),
    }


def _ep_factory(rank: int, world: int, max_tokens: int):  # noqa: ANN202
    def make(case: Case):  # noqa: ANN202
        disp = AllToAllDispatcher(case.router.num_experts, max_tokens_per_rank=max(max_tokens, 1))
        return toy_layers(case.layer_weights(), case.router, disp, rank=rank, world_size=world)
    return make


def _check_spread_routing(case: Case, world: int) -> None:
    """Every token reaches every rank; some experts get no token at all (checked globally)."""
    w = case.layer_weights()[0]
    ids, _ = select_experts(gate_logits(case.hidden(), w.gate_w), w.bias, case.router)
    e_local = case.router.num_experts // world
    for t in range(ids.shape[0]):
        ranks = {int(e) // e_local for e in ids[t]}
        assert ranks == set(range(world)), f"token {t} reaches ranks {ranks} of {world}"
    counts = torch.zeros(case.router.num_experts, dtype=torch.int64)
    counts.scatter_add_(0, ids.reshape(-1), torch.ones(ids.numel(), dtype=torch.int64))
    dist.all_reduce(counts)
    assert int((counts == 0).sum()) >= 1, f"no expert without tokens: {counts=}"


def _worker(rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        disp = AllToAllDispatcher(16, max_tokens_per_rank=4)
        assert (disp.num_local_experts, disp.capacity) == (16 // world, 4 * world)
        with pytest.raises(ValueError, match="num_experts=15"):
            AllToAllDispatcher(15, max_tokens_per_rank=4)
        for name, (case, max_tokens) in scenarios(world, rank).items():
            if name == "spread":
                _check_spread_routing(case, world)
            want = run(case, "serial_ll", lambda c: local_layers(c, max(c.num_tokens, 1)))
            make = _ep_factory(rank, world, max_tokens)
            for executor in EXECUTORS:
                got = run(case, executor, make)
                assert_bitwise(got, want, f"{world=} {rank=} {name=} {executor=}")
        case, max_tokens = scenarios(world, rank)["decode"]
        make = _ep_factory(rank, world, max_tokens)
        with no_host_sync(allowed=("_exchange_counts",)):
            for executor in ("tbo", "sbo_block"):
                run(case, executor, make)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("world", [2, 4])
def test_expert_parallel_executors_match_single_process_reference(world: int) -> None:
    # the spawned workers import this module by name: give them its directory
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [here, *[p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]])
    mp.spawn(_worker, args=(world, _free_port()), nprocs=world, join=True)

