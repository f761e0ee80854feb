"""Per-process state the hooks share: the settings, whether a TBO step is running, SM counts.

Settings come from the ServerArgs the scheduler published (the plugin's flags ride on it, see
`args.py`); they never change within a process, so the first successful read is kept.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

from sglang_overlap.settings import OverlapSettings

_settings: OverlapSettings | None = None
_tbo_depth = 0
_step_mode: str | None = None  # --overlap-gating auto: the gate's mode for the current step

# Nominal SM count where there is no GPU: SBO layouts still need one for their bookkeeping.
CPU_NOMINAL_SMS = 132


def settings() -> OverlapSettings:
    """This process's plugin settings; defaults (every mode off) outside an SGLang server."""
    global _settings
    if _settings is not None:
        return _settings
    try:
        from sglang.srt.runtime_context import get_server_args

        from sglang_overlap.sglang.args import settings_of

        server_args = get_server_args()
    except Exception:  # noqa: BLE001 - not inside a server process (yet): nothing published
        return OverlapSettings()
    _settings = settings_of(server_args)
    return _settings


def configure(value: OverlapSettings | None) -> None:
    """Set (or, with None, forget) this process's settings; for tests and embedders."""
    global _settings
    _settings = value


@contextlib.contextmanager
def tbo_running() -> Iterator[None]:
    """Marks the plugin's TBO executor as running (SBO does not apply inside TBO, as upstream)."""
    global _tbo_depth
    _tbo_depth += 1
    try:
        yield
    finally:
        _tbo_depth -= 1


def in_tbo() -> bool:
    return _tbo_depth > 0


def set_step_mode(mode: str | None) -> None:
    global _step_mode
    _step_mode = mode


def sbo_active() -> bool:
    """SBO applies to this MoE call: enabled, not inside TBO, and (with automatic gating) the
    gate chose it for this step."""
    s = settings()
    if not s.enable_single_batch_overlap or in_tbo():
        return False
    return s.overlap_gating != "auto" or _step_mode in (None, "sbo")


def build_gate() -> Any:
    """The cost-model gate for this server (--overlap-gating auto): DeepSeek-V3's profile on
    --overlap-hardware-profile, EP over the tensor-parallel ranks."""
    import torch
    from sglang.srt.runtime_context import get_server_args

    from sglang_overlap.planning.cost.profiles import Deployment, load_model, resolve_hardware
    from sglang_overlap.planning.gating import Gate

    s = settings()
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


@functools.lru_cache(maxsize=1)
def _device_sms() -> tuple[int, bool]:
    import torch

    if not torch.cuda.is_available():
        return CPU_NOMINAL_SMS, False
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(props.multi_processor_count), props.major >= 10


def num_sms() -> int:
    return _device_sms()[0]


def combine_num_sms() -> int:
    """--sbo-combine-num-sms, or upstream's default: 32 on Blackwell, 3 on Hopper."""
    chosen = settings().sbo_combine_num_sms
    if chosen:
        return chosen
    return 32 if _device_sms()[1] else 3
