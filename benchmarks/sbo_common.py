"""Shared set-up of the SBO scripts on a CUDA GPU: one rank (or torchrun), one DeepEP
low-latency buffer, and the shapes of the tests and the benchmark (for the JIT warm-up)."""

from __future__ import annotations

import os
import socket
from typing import Any

from sglang_overlap.planning.sbo_path import CombineForm

N_MAX, HIDDEN, E_LOCAL_MAX = 256, 7168, 32
BENCH_SHAPES = [(e, t) for e in (8, 16, 32) for t in (1, 16, 64, 128, 256)]
TEST_SHAPES = [(e, t) for e in (8, 16, 32) for t in (1, 64, 256)] + [(16, 128), (8, 32)]
FORMS: tuple[CombineForm, ...] = ("per_expert", "per_block")


def env_defaults() -> None:
    for key, value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                       ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
        os.environ.setdefault(key, value)


def init(num_experts_max: int = E_LOCAL_MAX, n: int = N_MAX) -> dict[str, Any]:
    """dist (torchrun's env, else one rank), deep_ep (checked by the plugin's start-up loader),
    and a low-latency buffer for up to `num_experts_max` local experts."""
    import torch
    import torch.distributed as dist

    from benchmarks.harness.deepep import load_deep_ep
    from sglang_overlap.kernels.capabilities import combine_forms
    from sglang_overlap.kernels.package_source import read_params

    env_defaults()
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    if world > 1:
        init_method = "env://"
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            init_method = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    dist.init_process_group("nccl", init_method=init_method, rank=rank, world_size=world,
                            device_id=torch.device("cuda", local))
    if world < 8:
        os.environ.setdefault("DEEPEP_DISABLE_LL_DISPATCH_OPT", "1")
    deep_ep = load_deep_ep()
    group = dist.new_group(list(range(world)))
    e_max = num_experts_max * world
    nbytes = deep_ep.Buffer.get_low_latency_rdma_size_hint(n, HIDDEN, world, e_max)
    buffer = deep_ep.Buffer(group, num_rdma_bytes=nbytes, low_latency_mode=True,
                            num_qps_per_rank=num_experts_max)
    forms = combine_forms(read_params("deep_ep", "Buffer.low_latency_combine"))
    return dict(deep_ep=deep_ep, rank=rank, world=world, buffer=buffer,
                form=forms[0] if forms else None, version=deep_ep.__version__, _layout=None)


def use(ctx: dict[str, Any], num_experts: int, n: int = N_MAX) -> Any:
    """The buffer, cleaned when its LL layout (N, H, E) changes."""
    import torch

    if ctx["_layout"] != (n, num_experts):
        ctx["buffer"].clean_low_latency_buffer(n, HIDDEN, num_experts)
        torch.cuda.synchronize()
        ctx["_layout"] = (n, num_experts)
    return ctx["buffer"]


def routing(t: int, e: int, k: int, seed: int) -> Any:
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand((t, e), generator=gen, device="cuda").topk(min(k, e), -1).indices.long()


def warm_experts(jobs: list[tuple[int, int]]) -> None:
    """JIT-compile and load every DeepGEMM / Triton kernel the layer runs at these (E, T), both
    forms' SM splits, without DeepEP: the expert path on random data."""
    import torch

    from benchmarks.harness.sbo_layer import MoeShape, MoeWeights
    from sglang_overlap.kernels import deepgemm, fp8
    from sglang_overlap.kernels.capabilities import device_num_sms as num_sms
    from sglang_overlap.kernels.down_gemm import combine_signal_layout, signal_down_gemm
    from sglang_overlap.kernels.signals import new_signal

    for e, t in jobs:
        shape = MoeShape(num_experts=e, num_max_dispatch_tokens_per_rank=N_MAX)
        w = MoeWeights.random(shape, seed=0).experts
        em = shape.expected_m(t)
        count = torch.full((e,), min(em, N_MAX), dtype=torch.int32, device="cuda")
        x, xs = fp8.quant_per_token_group(torch.randn((e, N_MAX, HIDDEN), device="cuda"))
        xs = fp8.empty_mn_major_scales((e,), N_MAX, HIDDEN // 128, "cuda").copy_(xs)
        up = torch.empty((e, N_MAX, w.w13.shape[1]), dtype=torch.bfloat16, device="cuda")
        deepgemm.masked_gemm(x, xs, w.w13, w.w13_scale, up, count, em)
        a, a_s = fp8.silu_and_mul_quant(up, count)
        out = torch.empty((e, N_MAX, HIDDEN), dtype=torch.bfloat16, device="cuda")
        deepgemm.masked_gemm(a, a_s, w.w2, w.w2_scale, out, count, em)
        for form in FORMS:
            lay = combine_signal_layout(form, num_local_experts=e, world_size=1,
                                        num_max_dispatch_tokens_per_rank=N_MAX, num_tokens=t,
                                        hidden=HIDDEN, expected_m=em, num_sms=num_sms(),
                                        comm_num_sms=3)
            signal_down_gemm(a, a_s, w.w2, w.w2_scale, out, count, em,
                             signal=new_signal(lay, "cuda"), layout=lay)
        torch.cuda.synchronize()
        del w
        torch.cuda.empty_cache()
