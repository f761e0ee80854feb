"""How this server's mode selector (--overlap-gating auto) is set up, once per process, when the
model runner starts (`start`), and the process's one `SelectorRuntime` (`runtime`).

The model profile comes from the served model's HF config (`planning.cost.model_config`), the
deployment from the real parallel layout (EP size, attention DP, nodes), the prior from
--overlap-hardware-profile (`resolve_prior`): a named or JSON profile is the cost model on it;
`auto` is the cost model on the detected GPU's shipped profile, or, on a CPU or a GPU without a
shipped profile, a flat prior (measurements alone decide), logged once. How measurements travel
(`selector_runtime.Transport`) follows the layout: `all_reduce` with attention DP, else
`broadcast` from the TP leader.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any

from sglang_overlap.planning.cost.experts import TRIVIAL, replicas_dispatched
from sglang_overlap.planning.cost.model_config import model_from_hf_config
from sglang_overlap.planning.cost.prior import CostModelPrior, FlatPrior, Prior
from sglang_overlap.planning.cost.profiles import (
    Deployment,
    ModelProfile,
    ProfileError,
    deployment_for_server,
    load_hardware,
    resolve_hardware,
)
from sglang_overlap.planning.selector import ModeSelector, SelectorConfig
from sglang_overlap.settings import OverlapSettings
from sglang_overlap.sglang import state
from sglang_overlap.sglang.selector_runtime import SelectorRuntime, Transport
from sglang_overlap.sglang.upstream import deepseek_v2

logger = logging.getLogger("sglang_overlap")

FLAG = "--overlap-hardware-profile"


def resolve_prior(s: OverlapSettings, model: ModelProfile, deploy: Deployment, *,
                  device: str, device_name: str | None) -> tuple[Prior, str]:
    """(the prior, one line saying how --overlap-hardware-profile was resolved). Raises
    ProfileError naming the flag for a profile that cannot be used."""
    enabled = s.enabled_modes
    spec = s.overlap_hardware_profile
    if spec != "auto":
        try:
            hw = load_hardware(spec)
        except ProfileError as exc:
            raise ProfileError(f"{FLAG} {spec}: {exc}") from None
        return CostModelPrior(model, hw, deploy, enabled), f"{FLAG} {spec}: cost model on {hw.name}"
    if device != "cuda" or not device_name:
        why = f"{FLAG} auto on device {device!r}: no GPU profile applies"
        return FlatPrior(enabled, "no GPU profile"), f"{why}; measurements alone decide"
    try:
        hw = resolve_hardware("auto", device_name)
    except ProfileError:
        why = f"{FLAG} auto: no shipped profile for {device_name!r}"
        return FlatPrior(enabled, f"no profile for {device_name}"), (
            f"{why}; measurements alone decide (pass {FLAG} with a profile JSON from the "
            "source repository's calibrate.py for a cost-model prior)")
    return CostModelPrior(model, hw, deploy, enabled), (
        f"{FLAG} auto: device {device_name!r} -> cost model on {hw.name}")


def selector_config(s: OverlapSettings) -> SelectorConfig:
    return SelectorConfig(hysteresis=s.overlap_gating_hysteresis,
                          min_trials=s.overlap_gating_trials,
                          explore_share=s.overlap_gating_explore)


def _model_profile(model_runner: Any) -> ModelProfile:
    cfg = model_runner.model_config
    hf = getattr(cfg, "hf_text_config", None) or cfg.hf_config
    return model_from_hf_config(hf.to_dict(), name=str(getattr(cfg, "model_path", "") or ""))


def _deployment(s: OverlapSettings, server_args: Any) -> Deployment:
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    tp = int(getattr(p, "tp_size", 0) or getattr(server_args, "tp_size", 1) or 1)
    try:
        ep = int(p.moe_ep_size)
        attn_dp = int(p.attn_dp_size)
    except (RuntimeError, ValueError, AttributeError):
        ep, attn_dp = tp, int(getattr(server_args, "attn_dp_size", 1) or 1)
    return deployment_for_server(ep_size=ep, tp_size=tp, attn_dp_size=attn_dp,
                                 nnodes=int(getattr(server_args, "nnodes", 1) or 1),
                                 two_chunk_threshold=s.tbo_token_distribution_threshold,
                                 **redundant_experts(server_args))


def redundant_experts(server_args: Any) -> dict[str, Any]:
    """`deployment_for_server`'s redundant-expert arguments from SGLang's server args:
    --ep-num-redundant-experts, and whether the dispatch sends tokens to the copies
    (--ep-dispatch-algorithm, --enable-eplb, --init-expert-location)."""
    return {
        "num_redundant_experts": int(getattr(server_args, "ep_num_redundant_experts", 0) or 0),
        "redundant_experts_used": replicas_dispatched(
            enable_eplb=bool(getattr(server_args, "enable_eplb", False)),
            init_expert_location=str(getattr(server_args, "init_expert_location", TRIVIAL)
                                     or TRIVIAL),
            ep_dispatch_algorithm=getattr(server_args, "ep_dispatch_algorithm", None)),
    }


def build_runtime(model_runner: Any) -> SelectorRuntime:
    """The mode selector for the model `model_runner` serves, on this server's layout and
    device."""
    import torch
    from sglang.srt.runtime_context import get_server_args

    s = state.settings()
    deepseek_v2.check_model(model_runner.model)
    model = _model_profile(model_runner)
    deploy = _deployment(s, get_server_args())
    device = str(getattr(model_runner, "device", "cpu"))
    name = torch.cuda.get_device_name() if device == "cuda" else None
    prior, how = resolve_prior(s, model, deploy, device=device, device_name=name)
    setup = (f"{how}; model {model.name} ({model.num_experts} experts, top-{model.topk}, "
             f"{model.num_moe_layers} MoE layers, {model.attn_kind}); EP {deploy.ep_size}, "
             f"{'DP' if deploy.dp_attention else 'TP'} attention")
    transport, source = _transport()
    return SelectorRuntime(ModeSelector(prior, selector_config(s)),
                           sync_steps=s.overlap_gating_sync_steps,
                           cuda=device == "cuda", setup=f"{setup}; measurements by {transport}",
                           transport=transport, source=source)


def _transport() -> tuple[Transport, bool]:
    """(how measurements travel, whether this rank's are shared) on this server's layout."""
    from sglang.srt.runtime_context import get_parallel

    p = get_parallel()
    if p.attn_dp_enabled:
        return "all_reduce", True
    # the rank that pulls requests and broadcasts them to its TP group (request_receiver.py)
    return "broadcast", p.attn_tp_rank == 0 and p.attn_cp_rank == 0


_runtime: list[SelectorRuntime] = []


def start(model_runner: Any) -> SelectorRuntime:
    """Build this process's mode selector (once) at start-up; logs how it was set up."""
    if not _runtime:
        _runtime.append(build_runtime(model_runner))
        logger.info("sglang-overlap gate: %s", _runtime[0].setup)
        atexit.register(_runtime[0].log_table)
    return _runtime[0]


def runtime() -> SelectorRuntime | None:
    """This process's selector runtime (None before the model runner started it)."""
    return _runtime[0] if _runtime else None


def set_runtime(rt: SelectorRuntime | None) -> None:
    """Replace (None: forget) this process's selector runtime; for tests and embedders."""
    _runtime.clear()
    if rt is not None:
        _runtime.append(rt)
