"""Test-only SGLang plugin (entry point `cpu_shim`): lets SGLang 0.5.23 serve a tiny DeepSeek-V3
(MLA + MoE) on a CPU without AMX and without a CPU build of sgl-kernel. It does nothing unless
SGLANG_USE_CPU_ENGINE=1. With SGLANG_PLUGINS set, name `cpu_shim` in it.

1. torch_native has no handler in the DeepSeek attention dispatcher, so it falls back to the
   triton handler, which picks the MHA path for fresh prefills; torch_native then reads K from
   the MLA latent cache and fails ("Expected size for first two dimensions of batch2 tensor to
   be: [4, 64] but got: [4, 96]"). Route torch_native to the absorbed-MLA path always.
2. MooncakeKVSender advertises host-tensor indices, so the prefill scheduler builds a pinned
   tensor + torch.cuda.Event ("Error 34: CUDA driver is a stub library"). Turn that off so the
   plain CPU index path is used.
3. The in-tree CPU platform does not opt out of PyNccl, so --tp 2 dies with "Expected a cuda
   device, but got: cpu". Force use_pynccl=False.
4. With SGLANG_CPU_SHIM_GRAPHS=1: decode runs SGLang's own DecodeCudaGraphRunner with a
   stand-in CUDA-graph backend (graphs.py), as a GPU server does with CUDA graphs on.
5. With SGLANG_CPU_SHIM_DEEPEP=1: an emulated SM90 for DeepEP's sizing and the local experts of
   an unquantized low-latency dispatch (deepep.py) or normal dispatch (normal_experts.py, with
   the normal combine_a SGLang runs only with JIT DeepGEMM), for --moe-a2a-backend deepep on the
   kit's deep_ep / deep_gemm stand-ins.
"""

from __future__ import annotations

import logging
import os
from typing import Any

logger = logging.getLogger(__name__)


def _route_torch_native_to_absorbed_mla() -> None:
    from sglang.srt.models.deepseek_common import attention_backend_handler as h

    def handle_attention_torch_native(attn: Any, forward_batch: Any) -> Any:
        return h._dispatch_mla_subtype(attn, forward_batch)

    h.AttentionBackendRegistry.register("torch_native", handle_attention_torch_native)


def _mooncake_sender_without_cuda_events() -> None:
    try:
        from sglang.srt.disaggregation.mooncake import conn
    except ImportError:  # mooncake not installed: no PD, nothing to change
        return
    conn.MooncakeKVSender.supports_host_tensor_indices = False


def _no_pynccl() -> None:
    from sglang.srt.distributed import parallel_state as ps

    orig = ps.init_model_parallel_group
    if getattr(orig, "_cpu_shim", False):  # register() runs in every process, maybe twice
        return

    def init_model_parallel_group(*args: Any, **kwargs: Any) -> Any:
        kwargs["use_pynccl"] = False
        return orig(*args, **kwargs)

    init_model_parallel_group._cpu_shim = True  # type: ignore[attr-defined]
    ps.init_model_parallel_group = init_model_parallel_group


_done: dict[str, bool] = {}


def register() -> None:
    if os.environ.get("SGLANG_USE_CPU_ENGINE", "0") != "1":
        return
    _route_torch_native_to_absorbed_mla()
    _mooncake_sender_without_cuda_events()
    _no_pynccl()
    from sglang_cpu_shim import deepep, graphs

    if graphs.enabled():
        graphs.install()
    if deepep.enabled() and not _done.get("deepep"):
        _done["deepep"] = True
        deepep.install()
    logger.info("sglang_cpu_shim applied")
