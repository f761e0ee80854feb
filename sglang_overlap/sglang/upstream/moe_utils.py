"""Hook on `sglang.srt.layers.moe.utils`: choose the SBO path once per process, before the model
is built; refuse with the table's message, or on SM90 run upstream with the SBO flag masked so its
SM90 check passes, then set the flag (see `sbo_decision.py`)."""

from __future__ import annotations

import logging
from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.settings import SettingsError
from sglang_overlap.sglang import sbo_decision, state
from sglang_overlap.sglang.hooks import HookSpec
from sglang_overlap.sglang.upstream.server_args import TORCH_A2A

logger = logging.getLogger("sglang_overlap")

INITIALIZE_MOE_CONFIG = "sglang.srt.layers.moe.utils.initialize_moe_config"


def initialize_moe_config(orig: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.runtime_context import get_exec

    overlap, moe = get_exec().overlap, get_exec().moe
    sbo_decision.set_active_decision(None)
    if not overlap.enable_single_batch_overlap:
        return orig(*args, **kwargs)
    settings = state.settings()
    if settings.requested_a2a_backend == TORCH_A2A:
        # The plugin's all-to-all backend (resolved to deepep) computes the experts and signals
        # itself: no DeepEP/DeepGEMM kernel is involved, so no kernel table applies, and the
        # SM90 refusal (about DeepGEMM's missing signal GEMM) does not either.
        logger.info("sglang-overlap SBO: torch_a2a path (kernels' signal contract)")
        return _with_sbo_refusal_lifted(orig, *args, **kwargs)
    decision, report = sbo_decision.decide_sbo(settings, a2a_backend=moe.moe_a2a_backend,
                                               runner_backend=moe.moe_runner_backend)
    sbo_decision.log_once(decision, report)
    if report.gpu.arch not in ("sm90", "sm100"):
        return orig(*args, **kwargs)  # no GPU the table speaks for: upstream decides
    if decision.refusal is not None:
        raise SettingsError(f"sglang-overlap: {decision.refusal}")
    if report.gpu.arch != "sm90":
        return orig(*args, **kwargs)
    result = _with_sbo_refusal_lifted(orig, *args, **kwargs)
    sbo_decision.set_active_decision(decision)
    return result


def _with_sbo_refusal_lifted(orig: Any, *args: Any, **kwargs: Any) -> Any:
    """Upstream raises on SM90 as soon as moe.sbo_enabled is set; where a path exists, run it
    with the flag masked, then set the flag it would have set."""
    from sglang.srt.runtime_context import get_exec, get_flags

    with get_exec().overlap.override(enable_single_batch_overlap=False):
        result = orig(*args, **kwargs)
    get_flags().moe.sbo_enabled = True
    return result


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(INITIALIZE_MOE_CONFIG, initialize_moe_config, "around",
             "choose the SBO path once per process; lift the SM90 refusal only when one exists",
             "src:b3bc305c9370", feature=Feature.SBO),
)
