"""The SBO path this process serves, decided once from what the installed kernels accept.

The supported SGLang refuses --enable-single-batch-overlap on SM90, because its Hopper path calls a
DeepGEMM masked GEMM with `enable_overlap`/`signal` and a DeepEP combine with the per-block
arguments, neither of which any released wheel accepts. The plugin keeps upstream's SBO schedule
(`DeepseekV2MoE.forward_deepep`: shared expert between dispatch send and receive; down GEMM
beside the combine send) and routes its kernel calls to what is installed, as chosen here by
`planning.sbo_path.decide_sbo_path` from `kernels.capabilities`. The hooks that act on the
decision are in `upstream/`: `moe_utils.py`, `single_batch_overlap.py`,
`deep_gemm_wrapper_entrypoint.py` and `token_dispatcher_deepep.py`.

CUDA graphs: the decision is fixed per process before the model is built; the signal layout is a
pure function of static shapes; no Python state changes between capture and replay.

Never a spin the plugin can prevent: upstream launches the down GEMM (`run_moe_core`) before the
combine send, on the host, so every producer kernel is launched, hence loaded, before a send can
spin on its signal; `signal_down_gemm` either launches a producer that completes every unit or
raises before the send is launched (a failing patched DeepGEMM falls back to the sliced GEMM).
`check_signal_raised` makes that order a checked precondition: a send whose signal no producer of
this step was launched for (another runner, a reordered upstream) raises instead of spinning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from sglang_overlap.kernels.capabilities import ProbeReport, probe
from sglang_overlap.planning.sbo_path import SboDecision, SboRequest, decide_sbo_path
from sglang_overlap.settings import OverlapSettings

logger = logging.getLogger("sglang_overlap")

_state: dict[str, Any] = {"decision": None, "report": None, "logged": set()}


def active_decision() -> SboDecision | None:
    """The SBO path this process runs with the plugin's routing (None: upstream unchanged)."""
    decision: SboDecision | None = _state["decision"]
    return decision


def set_active_decision(decision: SboDecision | None) -> None:
    _state["decision"] = decision


def note_signal_raised(signal: Any) -> None:
    """The plugin's down GEMM has launched every store of `signal` (called after the launch)."""
    _state["raised"] = signal


def check_signal_raised(signal: Any) -> None:
    """Before launching a combine send that spins on `signal`: raise unless the plugin's down GEMM
    was launched for this very signal tensor (no producer launched = a send spinning forever)."""
    if _state.get("raised") is not signal:
        raise RuntimeError("sglang-overlap SBO: the combine send would wait on a signal no down "
                           "GEMM of this step was launched for (the MoE runner did not call "
                           "deep_gemm_wrapper.grouped_gemm_nt_f8f8bf16_masked with the plugin's "
                           "layout); refusing to launch a send that would never finish")
    _state["raised"] = None


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


def current_report() -> ProbeReport:
    """What the kernels probe finds here, or the report `probe_override` set (tests)."""
    return _state["report"] or probe()


def decide_sbo(settings: OverlapSettings, *, a2a_backend: str, runner_backend: str,
               report: ProbeReport | None = None) -> tuple[SboDecision, ProbeReport]:
    """The SBO decision for these flags on this machine (shared with `sglang-overlap check`)."""
    report = report or current_report()
    req = SboRequest(enabled=settings.enable_single_batch_overlap,
                     down_gemm_overlap=settings.sbo_down_gemm_overlap,
                     granularity=settings.sbo_signal_granularity,
                     a2a_backend=_name(a2a_backend), runner_backend=_name(runner_backend))
    decision = decide_sbo_path(report.capabilities, req)
    if decision.down_gemm_overlap and report.deep_ep.params is not None:
        from sglang_overlap.kernels.combine_overlap import (
            check_combine_call,
            combine_overlap_kwargs,
        )

        tensor: Any = object()  # only the keywords are bound: any value stands for a tensor
        probe_kwargs = combine_overlap_kwargs(
            decision.combine_form, signal=tensor, expect_value=1,
            packed_recv_count=tensor, block_m=64, threshold=1, num_sms=1)
        check_combine_call(report.deep_ep.params, probe_kwargs)  # at start-up, never mid-serving
    return decision, report


def log_once(decision: SboDecision, report: ProbeReport) -> None:
    """The decision, and (where the plugin's down GEMM serves it) which producer: the line
    `sglang-overlap check` prints."""
    lines = [f"sglang-overlap SBO on {report.gpu.arch} ({report.gpu.source}): "
             f"{decision.summary()} [deep_ep {report.deep_ep.version}, deep_gemm "
             f"{report.deep_gemm.version}]"]
    if (decision.down_gemm_overlap and decision.gemm_signal_source == "plugin"
            and report.gpu.arch == "sm90"):
        from sglang_overlap.kernels.producers import sbo_producers
        from sglang_overlap.kernels.signal_deepgemm import probe as probe_patched_deepgemm

        producers = sbo_producers(probe_patched_deepgemm(), triton_installed=report.triton,
                                  triton_version=report.triton_version)
        lines.append(f"sglang-overlap SBO down-GEMM producer (triton {report.triton_version}): "
                     f"{producers.serves}")
    for line in lines:
        if line not in _state["logged"]:
            _state["logged"].add(line)
            logger.info(line)
