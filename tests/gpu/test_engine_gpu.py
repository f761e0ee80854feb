"""GPU: the oracle's executors in bf16 against a float64 reference, and stream placement.

- every executor (serial in both layouts, TBO decode and prefill, SBO per block and per expert)
  in bf16 on CUDA matches the float64 serial executor on CPU within bf16 tolerance;
- communication (dispatch/combine send) and computation (experts, SBO down-GEMM units) were
  issued on different CUDA streams;
- with 2 GPUs, the same over NCCL with the all-to-all dispatcher (world size 2).
Skipped without CUDA. Runs on one GPU; the NCCL case needs two.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_overlap.kernels.a2a import AllToAllDispatcher
from sglang_overlap.kernels.contracts import (
    Dispatcher,
    Layout,
    LowLatencyDispatchOutput,
    SignalContract,
)
from sglang_overlap.kernels.streams import StreamPair
from sglang_overlap.planning.sbo_layout import Granularity
from sglang_overlap.planning.two_batch import ForwardKind, plan_two_batch
from tests.fixtures import toy
from tests.oracle import executors
from tests.oracle.experts import LocalDispatcher, ReferenceExperts
from tests.oracle.router import RouterConfig, gate_logits, select_experts
from tests.oracle.stages import MoeLayer, SboConfig

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

E, H, INTER, T = 16, 256, 128, 96
ROUTER = RouterConfig(E, top_k=4, n_group=4, topk_group=2, routed_scaling_factor=2.5)
BF16_REL_L2 = 2e-2  # ||got - ref|| / ||ref|| per token row set; bf16 eps is 7.8e-3
MIN_SAME_ROUTING = 0.97  # tokens whose fp32 and fp64 routing agree (others are near-ties)
EXTEND_LENS = (40, 30, 26)
EXECUTORS = ("serial_ll", "serial_normal", "tbo_decode", "tbo_prefill", "sbo_block",
             "sbo_expert")


class TracedExperts(ReferenceExperts):
    """Notes the stream of every expert computation, SBO down-GEMM units included."""

    def __init__(self, w13: torch.Tensor, w2: torch.Tensor, trace: list[tuple[str, int]]):
        super().__init__(w13, w2)
        self.trace = trace

    def _note(self, op: str) -> None:
        self.trace.append((op, torch.cuda.current_stream().stream_id))

    def run_low_latency(self, dispatched: LowLatencyDispatchOutput, *,
                        signal: SignalContract | None = None) -> torch.Tensor:
        self._note("experts")
        return super().run_low_latency(dispatched, signal=signal)

    def _down_units(self, act, out, signal):  # type: ignore[no-untyped-def]
        for step in super()._down_units(act, out, signal):
            self._note("down_unit")
            yield step

    def run_normal(self, dispatched):  # type: ignore[no-untyped-def]
        self._note("experts")
        return super().run_normal(dispatched)


def _weights(device: str | torch.device, dtype: torch.dtype) -> list[toy.ToyWeights]:
    """One layer; bf16-rounded values in every dtype so the reference sees the same numbers."""
    (w,) = toy.toy_weights(1, num_experts=E, hidden=H, inter=INTER, seed=0, dtype=torch.bfloat16)
    cast = lambda t: t.to(device=device, dtype=dtype)  # noqa: E731
    return [toy.ToyWeights(cast(w.gate_w), w.bias.to(device), cast(w.w13), cast(w.w2),
                           cast(w.shared_w13), cast(w.shared_w2))]


def _layers(weights: list[toy.ToyWeights], dispatcher: Dispatcher, trace: list | None,
            rank: int = 0, world: int = 1) -> list[MoeLayer]:
    layers = toy.toy_layers(weights, ROUTER, dispatcher, rank=rank, world_size=world)
    if trace is None:
        return layers
    traced = []
    for layer in layers:
        assert isinstance(layer.experts, ReferenceExperts), type(layer.experts)
        traced.append(replace(layer, experts=TracedExperts(layer.experts.w13, layer.experts.w2,
                                                           trace)))
    return traced


def _run(executor: str, layers: list[MoeLayer], x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    if executor.startswith("serial"):
        layout: Layout = "normal" if executor == "serial_normal" else "low_latency"
        return executors.execute_serial(layers, x, layout=layout)
    if executor == "tbo_decode":
        plan = plan_two_batch(ForwardKind.DECODE, n) if n else plan_two_batch(ForwardKind.IDLE, 0)
        return executors.execute_tbo(layers, x, plan, schedule="decode")
    if executor == "tbo_prefill":
        lens = EXTEND_LENS if n == sum(EXTEND_LENS) else ((n,) if n else ())
        plan = plan_two_batch(ForwardKind.EXTEND, n, extend_lens=lens, two_chunk_threshold=0.48) \
            if n else plan_two_batch(ForwardKind.IDLE, 0)
        return executors.execute_tbo(layers, x, plan, schedule="prefill")
    gran: Granularity = "block" if executor == "sbo_block" else "expert"
    return executors.execute_sbo(layers, x, SboConfig(granularity=gran, block_m=64,
                                                      block_n=128))


def _reference(x: torch.Tensor) -> torch.Tensor:
    """float64 serial executor on CPU, all experts local."""
    layers = _layers(_weights("cpu", torch.float64), LocalDispatcher(E, max(x.shape[0], 1)), None)
    return executors.execute_serial(layers, x.cpu().double())


def _check_close(got: torch.Tensor, x: torch.Tensor, what: str) -> None:
    want = _reference(x)
    w = _weights("cpu", torch.float64)[0]
    ids_32, _ = select_experts(gate_logits(x.cpu().float(), w.gate_w.float()), w.bias, ROUTER)
    ids_64, _ = select_experts(gate_logits(x.cpu().double(), w.gate_w), w.bias, ROUTER)
    same = (ids_32.sort(-1).values == ids_64.sort(-1).values).all(-1)  # [T]
    assert same.float().mean() >= MIN_SAME_ROUTING, f"{what}: routing differs on {~same}"
    g, r = got.cpu().double()[same], want[same]
    rel = ((g - r).norm() / r.norm()).item()
    assert got.dtype == torch.bfloat16 and torch.isfinite(got).all(), what
    assert rel <= BF16_REL_L2, f"{what}: {rel=} > {BF16_REL_L2} (tokens={int(same.sum())})"


def _input(n: int, seed: int, device: str | torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, H, generator=g).to(device=device, dtype=torch.bfloat16)


@pytest.mark.parametrize("executor", EXECUTORS)
def test_bf16_matches_fp64_reference_one_gpu(executor: str) -> None:
    trace: list[tuple[str, int]] = []
    disp = LocalDispatcher(E, capacity=T, streams=StreamPair("cuda", trace))
    x = _input(T, 1, "cuda")
    got = _run(executor, _layers(_weights("cuda", torch.bfloat16), disp, trace), x)
    torch.cuda.synchronize()
    _check_close(got, x, f"{executor=}")


@pytest.mark.parametrize("executor", ["tbo_decode", "tbo_prefill", "sbo_block"])
def test_communication_and_computation_use_different_streams(executor: str) -> None:
    trace: list[tuple[str, int]] = []
    disp = LocalDispatcher(E, capacity=T, streams=StreamPair("cuda", trace))
    _run(executor, _layers(_weights("cuda", torch.bfloat16), disp, trace), _input(T, 2, "cuda"))
    torch.cuda.synchronize()
    comm = {sid for op, sid in trace if op in ("dispatch_send", "combine_send")}
    compute = {sid for op, sid in trace if op in ("experts", "down_unit")}
    assert comm and compute, f"{trace=}"
    assert not comm & compute, f"{executor=}: shared streams {comm & compute} in {trace=}"
    assert compute == {torch.cuda.current_stream().stream_id}, f"{trace=}"
    if executor.startswith("sbo"):
        assert any(op == "down_unit" for op, _ in trace), "SBO produced no signalled units"


def _nccl_worker(rank: int, world: int, port: int) -> None:
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda", rank))
    try:
        n = (T, 7)[rank]  # uneven ranks
        x = _input(n, 10 + rank, f"cuda:{rank}")
        for executor in EXECUTORS:
            trace: list[tuple[str, int]] = []
            disp = AllToAllDispatcher(E, max_tokens_per_rank=T,
                                      streams=StreamPair(f"cuda:{rank}", trace))
            layers = _layers(_weights(f"cuda:{rank}", torch.bfloat16), disp, trace, rank, world)
            got = _run(executor, layers, x)
            torch.cuda.synchronize()
            _check_close(got, x, f"{world=} {rank=} {executor=}")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_bf16_matches_fp64_reference_two_gpus_nccl() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # NVLink multicast off
    mp.spawn(_nccl_worker, args=(2, port), nprocs=2, join=True)
