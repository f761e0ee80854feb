"""The per-step overlap gate of this server (--overlap-gating auto), built once per process."""

from __future__ import annotations

import functools
from typing import Any

from sglang_overlap.sglang import state


def build_gate() -> Any:
    """The cost-model gate for this server: DeepSeek-V3's profile on --overlap-hardware-profile,
    EP over the tensor-parallel ranks."""
    import torch
    from sglang.srt.runtime_context import get_server_args

    from sglang_overlap.planning.cost.profiles import Deployment, load_model, resolve_hardware
    from sglang_overlap.planning.gating import Gate

    s = state.settings()
    server_args = get_server_args()
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    hw = resolve_hardware(s.overlap_hardware_profile, device)
    tp = max(1, int(getattr(server_args, "tp_size", 1) or 1))
    deploy = Deployment(
        phase="decode", ep_size=tp, gpus_per_node=min(tp, 8),
        dp_attention=int(getattr(server_args, "attn_dp_size", 1) or 1) > 1,
        two_chunk_threshold=s.tbo_token_distribution_threshold)
    enabled = set()
    if s.enable_two_batch_overlap:
        enabled |= {"tbo", "two_chunk"} if s.two_chunk_enabled else {"tbo"}
    if s.enable_single_batch_overlap:
        enabled.add("sbo")
    return Gate(load_model("deepseek-v3"), hw, deploy, frozenset(enabled),
                s.overlap_gating_hysteresis)


@functools.cache
def gate() -> Any:
    """This process's gate, built on first use (its hysteresis state lives for the process)."""
    return build_gate()
