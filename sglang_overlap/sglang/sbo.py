"""SGLang glue for single-batch overlap (SBO) on the DeepEP low-latency path, pinned to 0.5.23.

SGLang 0.5.23 refuses --enable-single-batch-overlap on SM90, because its Hopper path calls a
DeepGEMM masked GEMM with `enable_overlap`/`signal` and a DeepEP combine with the per-block
arguments, neither of which any released wheel accepts. These hooks keep upstream's SBO schedule
(`DeepseekV2MoE.forward_deepep`: shared expert between dispatch send and receive; down GEMM
beside the combine send) and route its kernel calls to what is installed, as chosen once per
process by `planning.sbo_path.decide_sbo_path` from `engine.probe`:

  initialize_moe_config (around)  decide; refuse with the table's message, or on SM90 run
                                  upstream with the SBO leaf masked so its SM90 check passes,
                                  then set the flag; log the choice once
  SboFlags...down_gemm... (around) down-GEMM/combine overlap only on fine_grained / per_expert
  compute_overlap_args (around)   per_expert / plugin per-block: the signal laid out by
                                  SboLayout for the plugin's signal GEMM tiles
  grouped_gemm_nt_f8f8bf16_masked (around)  the plugin's signal down GEMM
                                  (kernels.down_gemm: fused or sliced, measured per shape)
  _DeepEPDispatcherImplLowLatency._combine_core (around)  only the combine kwargs the
                                  installed deep_ep declares (engine.deepep builds them)

CUDA graphs: the decision is fixed per process before the model is built; the layout is a pure
function of static shapes (E_local, C, H, expected_m of the captured batch size); the signal is
allocated with torch.zeros inside the forward, so replay re-zeroes it. No Python state changes
between capture and replay. On SM100 and on machines without a GPU the hooks hand straight back.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from sglang_overlap.kernels.capabilities import ProbeReport, probe
from sglang_overlap.kernels.deepep import check_combine_call, combine_overlap_kwargs
from sglang_overlap.planning.sbo_layout import SboLayout
from sglang_overlap.planning.sbo_path import SboDecision, SboRequest, decide_sbo_path
from sglang_overlap.settings import OverlapSettings, SettingsError
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

INITIALIZE_MOE_CONFIG = "sglang.srt.layers.moe.utils.initialize_moe_config"
SBO_DOWN_GEMM_FLAG = ("sglang.srt.batch_overlap.single_batch_overlap.SboFlags."
                      "enable_combine_down_gemm_two_stream_overlap")
COMPUTE_OVERLAP_ARGS = "sglang.srt.batch_overlap.single_batch_overlap.compute_overlap_args"
MASKED_GEMM = "sglang.srt.layers.deep_gemm_wrapper.entrypoint.grouped_gemm_nt_f8f8bf16_masked"
LL_COMBINE_CORE = ("sglang.srt.layers.moe.token_dispatcher.deepep."
                   "_DeepEPDispatcherImplLowLatency._combine_core")

_state: dict[str, Any] = {"decision": None, "report": None, "logged": set()}


def active_decision() -> SboDecision | None:
    """The SBO path this process runs with the plugin's routing (None: upstream unchanged)."""
    decision: SboDecision | None = _state["decision"]
    return decision


@contextlib.contextmanager
def probe_override(report: ProbeReport) -> Iterator[None]:
    """Use `report` instead of probing this machine (tests; `check --assume-arch`)."""
    saved = _state["report"]
    _state["report"] = report
    try:
        yield
    finally:
        _state["report"] = saved


def _name(value: Any) -> str:
    return str(getattr(value, "value", value))


def decide_sbo(settings: OverlapSettings, *, a2a_backend: str, runner_backend: str,
               report: ProbeReport | None = None) -> tuple[SboDecision, ProbeReport]:
    """The SBO decision for these flags on this machine (shared with `sglang-overlap check`)."""
    report = report or _state["report"] or probe()
    req = SboRequest(enabled=settings.enable_single_batch_overlap,
                     down_gemm_overlap=settings.sbo_down_gemm_overlap,
                     granularity=settings.sbo_signal_granularity,
                     a2a_backend=_name(a2a_backend), runner_backend=_name(runner_backend))
    decision = decide_sbo_path(report.capabilities, req)
    if decision.down_gemm_overlap and report.deep_ep.params is not None:
        probe_kwargs = combine_overlap_kwargs(
            decision.combine_form, signal=torch.zeros(1), expect_value=1,
            packed_recv_count=torch.zeros(1), block_m=64, threshold=1, num_sms=1)
        check_combine_call(report.deep_ep.params, probe_kwargs)  # at start-up, never mid-serving
    return decision, report


def _log_once(decision: SboDecision, report: ProbeReport) -> None:
    line = (f"sglang-overlap SBO on {report.gpu.arch} ({report.gpu.source}): {decision.summary()}"
            f" [deep_ep {report.deep_ep.version}, deep_gemm {report.deep_gemm.version}]")
    if line not in _state["logged"]:
        _state["logged"].add(line)
        logger.info(line)


def _initialize_moe_config(orig: Any, *args: Any, **kwargs: Any) -> Any:
    from sglang.srt.runtime_context import get_exec

    from sglang_overlap.sglang.args import current_settings

    overlap, moe = get_exec().overlap, get_exec().moe
    _state["decision"] = None
    if not overlap.enable_single_batch_overlap:
        return orig(*args, **kwargs)
    settings = current_settings()
    if settings.moe_a2a_backend == "torch_a2a":
        # The plugin's all-to-all backend (resolved to deepep) computes the experts and signals
        # itself: no DeepEP/DeepGEMM kernel is involved, so no kernel table applies, and the
        # SM90 refusal (about DeepGEMM's missing signal GEMM) does not either.
        logger.info("sglang-overlap SBO: torch_a2a path (engine signal contract)")
        return _with_sbo_refusal_lifted(orig, *args, **kwargs)
    decision, report = decide_sbo(settings, a2a_backend=moe.moe_a2a_backend,
                                  runner_backend=moe.moe_runner_backend)
    _log_once(decision, report)
    if report.gpu.arch not in ("sm90", "sm100"):
        return orig(*args, **kwargs)  # no GPU the table speaks for: upstream decides
    if decision.refusal is not None:
        raise SettingsError(f"sglang-overlap: {decision.refusal}")
    if report.gpu.arch != "sm90":
        return orig(*args, **kwargs)
    result = _with_sbo_refusal_lifted(orig, *args, **kwargs)
    _state["decision"] = decision
    return result


def _with_sbo_refusal_lifted(orig: Any, *args: Any, **kwargs: Any) -> Any:
    """Upstream raises on SM90 as soon as moe.sbo_enabled is set; where a path exists, run it
    with the flag masked, then set the flag it would have set."""
    from sglang.srt.runtime_context import get_exec, get_flags

    with get_exec().overlap.override(enable_single_batch_overlap=False):
        result = orig(*args, **kwargs)
    get_flags().moe.sbo_enabled = True
    return result


def _down_gemm_flag(orig: Any, cls: Any) -> bool:
    decision = active_decision()
    if decision is None:
        return bool(orig(cls))
    from sglang.srt.layers.moe.utils import is_sbo_enabled

    return bool(is_sbo_enabled()) and decision.down_gemm_overlap


def apply_plugin_signal(decision: SboDecision, combine: Any, down: Any, meta: dict[str, Any],
                        shape: tuple[int, int, int], expected_m: int, device: Any,
                        comm_num_sms: int = 0) -> None:
    """Swap upstream's Hopper per-block int32 signal for the plugin signal GEMM's, in place:
    the layout the installed tree's combine reads (`down_gemm.combine_signal_layout`: 64-row
    blocks per block, the GEMM off the send's SMs and on an even count)."""
    from sglang_overlap.kernels.down_gemm import combine_signal_layout
    from sglang_overlap.kernels.signal_gemm import new_signal

    total = combine.num_sms + meta["compute_num_sms"]
    comm = comm_num_sms or combine.num_sms
    e_local, capacity, hidden = shape
    assert decision.granularity is not None
    form = decision.combine_form or ("per_expert" if decision.granularity == "expert"
                                     else "per_block")
    layout = combine_signal_layout(form, num_local_experts=e_local, world_size=1,
                                   num_max_dispatch_tokens_per_rank=capacity,  # C = N * W
                                   num_tokens=capacity, hidden=hidden, expected_m=expected_m,
                                   num_sms=total, comm_num_sms=comm)
    signal = new_signal(layout, device)  # zeroed in the forward: re-zeroed on graph replay
    combine.signal = down.signal = signal
    combine.num_sms, combine.threshold = comm, layout.expect_value
    down.num_sms = meta["compute_num_sms"] = layout.compute_num_sms
    down.sbo_layout, down.expected_m = layout, expected_m
    if layout.granularity == "block":
        meta["block_m"], meta["threshold"] = layout.block_m, layout.expect_value


def _compute_overlap_args(orig: Any, dispatch_output: Any, alt_stream: Any) -> Any:
    combine, down, meta = orig(dispatch_output, alt_stream)
    decision = active_decision()
    if (decision is None or down is None or decision.gemm_signal_source != "plugin"):
        return combine, down, meta
    from sglang_overlap.sglang.args import current_settings

    hidden = dispatch_output.hidden_states  # [E_local, C, H]
    apply_plugin_signal(decision, combine, down, meta, tuple(hidden.shape),
                        int(dispatch_output.expected_m), hidden.device,
                        current_settings().sbo_combine_num_sms)
    return combine, down, meta


def _masked_gemm(orig: Any, lhs: Any, rhs: Any, out: Any, masked_m: Any, expected_m: int,
                 overlap_args: Any = None, max_block_n: int = 256, recipe_a: Any = None,
                 recipe_b: Any = None) -> Any:
    layout: SboLayout | None = getattr(overlap_args, "sbo_layout", None)
    if overlap_args is None or layout is None:
        return orig(lhs, rhs, out, masked_m, expected_m, overlap_args=overlap_args,
                    max_block_n=max_block_n, recipe_a=recipe_a, recipe_b=recipe_b)
    from sglang_overlap.kernels.down_gemm import signal_down_gemm

    (a, a_scale), (b, b_scale) = lhs, rhs  # [E, C, K] fp8 + fp32 scales; [E, H, K] fp8 + scales
    signal_down_gemm(a, a_scale, b, b_scale, out, masked_m, expected_m,
                     signal=overlap_args.signal, layout=layout,
                     compute_num_sms=overlap_args.num_sms)
    if layout.granularity == "block":
        return layout.block_m, layout.expect_value
    return None  # per expert: the combine needs no block_m / threshold


def _combine_core(orig: Any, self: Any, hidden_states: torch.Tensor, topk_ids: torch.Tensor,
                  topk_weights: torch.Tensor) -> Any:
    decision = active_decision()
    oa = self.overlap_args
    if decision is None or oa is None:
        return orig(self, hidden_states, topk_ids, topk_weights)
    from sglang.srt.layers.moe.token_dispatcher import deepep as upstream

    meta = self.meta_overlap_args or {}
    kwargs = {}
    if oa.overlap and decision.down_gemm_overlap:
        kwargs = combine_overlap_kwargs(
            decision.combine_form, signal=oa.signal, expect_value=int(oa.threshold or 0),
            packed_recv_count=self.packed_recv_count, block_m=meta.get("block_m"),
            threshold=meta.get("threshold"), num_sms=oa.num_sms)
    buffer = self._get_buffer()
    oa.stream.wait_event(oa.wait_event)
    with torch.cuda.stream(oa.stream):
        upstream._deepep_precompile_tp_barrier()
        combined, event, hook = buffer.low_latency_combine(
            x=hidden_states, topk_idx=topk_ids, topk_weights=topk_weights, handle=self.handle,
            async_finish=not self.return_recv_hook, return_recv_hook=self.return_recv_hook,
            **kwargs)
    self.packed_recv_count = self.handle = None
    return combined, event, hook


SBO_HOOKS: tuple[HookSpec, ...] = (
    HookSpec(INITIALIZE_MOE_CONFIG, _initialize_moe_config, "around",
             "choose the SBO path once per process; lift the SM90 refusal only when one exists"),
    HookSpec(SBO_DOWN_GEMM_FLAG, _down_gemm_flag, "around",
             "down-GEMM/combine overlap only when the chosen path has a signal GEMM and form"),
    HookSpec(COMPUTE_OVERLAP_ARGS, _compute_overlap_args, "around",
             "lay the signal out for the plugin's signal GEMM (per expert or per block)"),
    HookSpec(MASKED_GEMM, _masked_gemm, "around",
             "the down GEMM is kernels.down_gemm (signals; deep_gemm wheels lack the kwargs)"),
    HookSpec(LL_COMBINE_CORE, _combine_core, "around",
             "pass only the combine overlap kwargs the installed deep_ep declares"),
)

__all__ = ["SBO_HOOKS", "active_decision", "apply_plugin_signal", "decide_sbo",
           "probe_override"]
