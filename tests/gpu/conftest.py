"""GPU fixtures: one DeepEP low-latency buffer per process, on one rank or under torchrun; each
test's GPU memory checked against its `gpu_mem` marker (tests/gpu/memory.py).

The DeepEP tests run once per installed tree (benchmarks/run_gpu.sh puts each tree on PYTHONPATH
in its own pytest process). Without CUDA or without a loadable deep_ep they are skipped; with
SGLANG_OVERLAP_REQUIRE_DEEPEP=1 (set by run_gpu.sh) a deep_ep that does not load fails instead.
"""

from __future__ import annotations

import datetime
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from sglang_overlap.planning.sbo_path import CombineForm
from tests.gpu import memory


@pytest.fixture(autouse=True)
def _gpu_memory(request: pytest.FixtureRequest) -> Any:
    """Fail a test at once when its declared GPU memory is not there, and after it when it held
    more than it declares (tests/gpu/memory.py)."""
    if not torch.cuda.is_available():
        yield
        return
    need, nodeid = memory.declared(request.node), request.node.nodeid
    torch.cuda.empty_cache()  # what earlier tests left cached is not this test's
    free, total = torch.cuda.mem_get_info()
    problem = memory.check_available(nodeid, need, free / memory.GIB,
                                     torch.cuda.memory_reserved() / memory.GIB,
                                     total / memory.GIB)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    torch.cuda.reset_peak_memory_stats()
    yield
    peak = torch.cuda.max_memory_reserved() / memory.GIB
    memory.log_peak(nodeid, need, peak)
    problem = memory.check_peak(nodeid, need, peak)
    if problem is not None:
        pytest.fail(problem, pytrace=False)


N_MAX = 256  # num_max_dispatch_tokens_per_rank of the shared buffer: T <= 256 per rank
HIDDEN = 7168
E_LOCAL_MAX = 32


@dataclass
class EpEnv:
    deep_ep: Any
    group: Any
    rank: int
    world: int
    buffer: Any
    form: CombineForm | None  # the combine overlap form this tree takes
    _layout: tuple[int, int, int] | None = field(default=None)

    def use(self, num_experts: int, n: int = N_MAX, hidden: int = HIDDEN) -> Any:
        """The buffer, cleaned when the LL layout (N, H, E) changes: its signalling words are
        laid out per (N, H, E) and must be zero for the next layout."""
        if self._layout != (n, hidden, num_experts):
            self.buffer.clean_low_latency_buffer(n, hidden, num_experts)
            torch.cuda.synchronize()
            self._layout = (n, hidden, num_experts)
        return self.buffer

    def gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """`t` of every rank, in rank order."""
        if self.world == 1:
            return [t]
        import torch.distributed as dist

        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t.contiguous(), group=self.group)
        return out


def _missing(reason: str) -> None:
    if os.environ.get("SGLANG_OVERLAP_REQUIRE_DEEPEP") == "1":
        pytest.fail(f"SGLANG_OVERLAP_REQUIRE_DEEPEP=1: {reason}")
    pytest.skip(reason)


def _init_dist() -> tuple[int, int]:
    import torch.distributed as dist

    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if not dist.is_initialized():
        if "MASTER_ADDR" in os.environ and world > 1:
            init = "env://"
        else:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                init = f"tcp://127.0.0.1:{s.getsockname()[1]}"
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=120),
                                device_id=torch.device("cuda", local))
    return rank, world


@pytest.fixture(scope="session")
def ep() -> EpEnv:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from benchmarks.harness.deepep import load_deep_ep
    from sglang_overlap.kernels.capabilities import combine_forms
    from sglang_overlap.kernels.package_source import read_params

    try:
        deep_ep = load_deep_ep()
    except RuntimeError as exc:
        _missing(str(exc))
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                       ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(key, value)
    rank, world = _init_dist()
    if world < 8:  # antgroup-opt's layered LL dispatch device-asserts num_ranks % 8 == 0
        os.environ.setdefault("DEEPEP_DISABLE_LL_DISPATCH_OPT", "1")
    import torch.distributed as dist

    group = dist.new_group(list(range(world)))
    e_max = E_LOCAL_MAX * world
    nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(N_MAX, HIDDEN, world, e_max)
    buffer = deep_ep.Buffer(group, num_rdma_bytes=nbytes, low_latency_mode=True,
                            num_qps_per_rank=E_LOCAL_MAX)
    forms = combine_forms(read_params("deep_ep", "Buffer.low_latency_combine"))
    return EpEnv(deep_ep, group, rank, world, buffer, forms[0] if forms else None)
