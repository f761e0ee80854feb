"""GPU: single-batch overlap with the DeepGEMM fp8 expert runner and the all-to-all dispatcher.

The SBO executor (shared expert in the dispatch window, down GEMM signalling units to the
combine) must give the serial executor's output within fp8 tolerance, for both signal forms;
the dispatcher is torch.distributed all-to-all on a one-rank NCCL group (the multi-GPU run is
issue 10). DeepGEMM needs K % 128 == 0 and per-expert capacity % 64 == 0.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import replace

import pytest
import torch

from sglang_overlap.planning.sbo_layout import Granularity

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

E, H, INTER, T = 8, 1024, 512, 96
FP8_REL_L2 = 3e-2  # fp8 activations and weights, two GEMMs: a few e-2 relative at most


@pytest.fixture(scope="module")
def nccl_group():
    pytest.importorskip("deep_gemm")
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    if dist.is_initialized():  # the DeepEP fixture (conftest.py) keeps one for the session
        yield
        return
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=120),
                            device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


def _layers():
    from benchmarks.harness.deepgemm_experts import DeepGemmExpertRunner
    from sglang_overlap.kernels.a2a import AllToAllDispatcher
    from sglang_overlap.kernels.streams import StreamPair
    from tests.fixtures import toy
    from tests.oracle.experts import ReferenceExperts
    from tests.oracle.router import RouterConfig

    router = RouterConfig(E, top_k=4, n_group=4, topk_group=2, routed_scaling_factor=2.5)
    weights = toy.toy_weights(1, num_experts=E, hidden=H, inter=INTER, seed=0,
                              dtype=torch.bfloat16, device="cuda")
    disp = AllToAllDispatcher(E, max_tokens_per_rank=128, streams=StreamPair("cuda:0"))
    layers = []
    for layer in toy.toy_layers(weights, router, disp):
        assert isinstance(layer.experts, ReferenceExperts), type(layer.experts)
        runner = DeepGemmExpertRunner(layer.experts.w13.float(), layer.experts.w2.float())
        layers.append(replace(layer, experts=runner))
    return layers


@pytest.mark.parametrize("granularity", ["expert", "block"])
def test_sbo_with_deepgemm_runner_equals_serial(nccl_group, granularity: Granularity) -> None:
    from tests.oracle import executors
    from tests.oracle.stages import SboConfig

    layers = _layers()
    x = torch.randn(T, H, generator=torch.Generator().manual_seed(5)).to("cuda", torch.bfloat16)
    serial = executors.execute_serial(layers, x, layout="low_latency")
    sbo = executors.execute_sbo(layers, x, SboConfig(granularity=granularity, block_m=64,
                                                     block_n=128, num_sms=132, comm_num_sms=3))
    torch.cuda.synchronize()
    assert torch.isfinite(sbo).all()
    rel = float((sbo.double() - serial.double()).norm() / serial.double().norm())
    assert rel <= FP8_REL_L2, f"{granularity=} {rel=}"
