"""Which single-batch-overlap (SBO) path a server can run, from what its kernels accept.

SBO overlaps two things on the DeepEP low-latency path:
  1. the shared expert with the dispatch receive (same stream; needs nothing from the kernels);
  2. the down GEMM with the combine send: the GEMM publishes which units of its output are final
     and DeepEP's combine kernel sends each unit as soon as it is marked. This needs a GEMM that
     writes signals and a combine that reads them, in the same form.

The forms DeepEP's `Buffer.low_latency_combine` may accept (found by `kernels/capabilities.py`):
  per_block  - Hopper fork: packed_recv_count, comp_signal [E*blocks] int32, block_m, threshold,
               num_sms (what the supported SGLang passes on SM90; in no released sgl-deep-ep);
  per_expert - overlap, src_signals [E_local] uint32, src_signal_expect_value
               (sgl-deep-ep 0.1.2.post1, the version the supported SGLang pins).
Signal GEMMs: DeepGEMM's masked GEMM with `enable_overlap`/`signal` (per block; in no released
sgl-deep-gemm), or this plugin's Triton signal GEMM (per expert or per block; needs triton).

The table (SM90, --moe-a2a-backend deepep, DeepGEMM runner):
  fine_grained        per-block combine form and a per-block signal GEMM (DeepGEMM's or ours)
  per_expert          per-expert combine form and the plugin's signal GEMM
  shared_expert_only  anything else: overlap 1 only; the down GEMM and combine run plainly
A path forced by --sbo-down-gemm-overlap force or --sbo-signal-granularity expert|block that the
installed kernels cannot run is refused, naming the package, the version found and what to
install. On SM100 SGLang's own Blackwell SBO runs unchanged (`upstream_blackwell`).

Plain Python; no torch, no sglang.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Arch = Literal["sm90", "sm100", "cpu", "other"]
CombineForm = Literal["per_block", "per_expert"]
GemmSignalSource = Literal["deep_gemm", "plugin"]

PINNED_DEEP_EP = "sgl-deep-ep==0.1.2.post1"
PER_BLOCK_ARGS = ("packed_recv_count", "comp_signal", "block_m", "threshold", "num_sms")
PER_EXPERT_ARGS = ("overlap", "src_signals", "src_signal_expect_value")


class SboPath(StrEnum):
    OFF = "off"
    FINE_GRAINED = "fine_grained"
    PER_EXPERT = "per_expert"
    SHARED_EXPERT_ONLY = "shared_expert_only"
    UPSTREAM_BLACKWELL = "upstream_blackwell"


@dataclass(frozen=True)
class Capabilities:
    """What the machine and the installed kernel packages offer (see `kernels/capabilities.py`)."""

    arch: Arch
    deep_ep_version: str | None  # None: deep_ep not installed
    deep_ep_combine_forms: tuple[CombineForm, ...]  # () = combine takes no overlap arguments
    deep_gemm_version: str | None  # None: deep_gemm not installed
    deep_gemm_signal: bool  # masked GEMM takes enable_overlap / signal
    plugin_signal_gemm: bool  # triton (a release that builds them) and the plugin's kernels
    plugin_signal_gemm_problem: str | None = None  # why not, when triton is there but too old


@dataclass(frozen=True)
class SboRequest:
    """The flags that steer the choice (names as in `settings.OverlapSettings`)."""

    enabled: bool = True
    down_gemm_overlap: Literal["auto", "force", "off"] = "auto"
    granularity: Literal["auto", "expert", "block"] = "auto"
    a2a_backend: str = "deepep"
    runner_backend: str = "auto"


@dataclass(frozen=True)
class SboDecision:
    path: SboPath | None  # None: refused
    reason: str
    refusal: str | None = None
    granularity: Literal["expert", "block"] | None = None
    gemm_signal_source: GemmSignalSource | None = None
    combine_form: CombineForm | None = None

    @property
    def ok(self) -> bool:
        return self.refusal is None

    @property
    def down_gemm_overlap(self) -> bool:
        return self.path in (SboPath.FINE_GRAINED, SboPath.PER_EXPERT)

    def summary(self) -> str:
        if self.refusal is not None:
            return f"refused: {self.refusal}"
        return f"{self.path.value if self.path else 'none'}: {self.reason}"


def _refuse(message: str) -> SboDecision:
    return SboDecision(path=None, reason="refused", refusal=message)


def _forms_text(caps: Capabilities) -> str:
    if not caps.deep_ep_combine_forms:
        return "no overlap arguments"
    return " and ".join(f"the {f.replace('_', '-')} form" for f in caps.deep_ep_combine_forms)


def _missing_block(caps: Capabilities) -> list[str]:
    missing = []
    if "per_block" not in caps.deep_ep_combine_forms:
        missing.append(
            f"sgl-deep-ep {caps.deep_ep_version}: low_latency_combine accepts {_forms_text(caps)}, "
            f"not the per-block form ({', '.join(PER_BLOCK_ARGS)}); no released sgl-deep-ep has "
            "it: install a DeepEP build whose low_latency_combine takes those arguments"
        )
    if not (caps.deep_gemm_signal or caps.plugin_signal_gemm):
        missing.append(_missing_gemm(caps))
    return missing


def _missing_expert(caps: Capabilities) -> list[str]:
    missing = []
    if "per_expert" not in caps.deep_ep_combine_forms:
        missing.append(
            f"sgl-deep-ep {caps.deep_ep_version}: low_latency_combine accepts {_forms_text(caps)}, "
            f"not the per-expert form ({', '.join(PER_EXPERT_ARGS)}); install {PINNED_DEEP_EP}"
        )
    if not caps.plugin_signal_gemm:
        missing.append(caps.plugin_signal_gemm_problem or (
            "the plugin's signal GEMM needs triton (pip install triton; it ships with torch on "
            "CUDA) and sglang_overlap.kernels.signal_fused"
        ))
    return missing


def _missing_gemm(caps: Capabilities) -> str:
    dg = f"sgl-deep-gemm {caps.deep_gemm_version}" if caps.deep_gemm_version else "deep_gemm"
    plugin = caps.plugin_signal_gemm_problem or (
        "the plugin's Triton signal GEMM needs triton (pip install triton)")
    return (
        f"no signal GEMM: {dg} has no masked GEMM with enable_overlap/signal (no released "
        f"sgl-deep-gemm has), and {plugin}"
    )


def _decide_sm90(caps: Capabilities, req: SboRequest) -> SboDecision:
    forced = req.down_gemm_overlap == "force" or req.granularity != "auto"
    what = (f"--sbo-signal-granularity {req.granularity}" if req.granularity != "auto"
            else "--sbo-down-gemm-overlap force")
    if req.down_gemm_overlap == "off":
        return SboDecision(SboPath.SHARED_EXPERT_ONLY, "--sbo-down-gemm-overlap off")
    if req.runner_backend not in ("auto", "deep_gemm"):
        if forced:
            return _refuse(f"{what} needs --moe-runner-backend deep_gemm on SM90 "
                           f"(got {req.runner_backend})")
        return SboDecision(SboPath.SHARED_EXPERT_ONLY,
                           f"--moe-runner-backend {req.runner_backend} has no signal GEMM")
    fine_ok = not _missing_block(caps)
    expert_ok = not _missing_expert(caps)
    source: GemmSignalSource = "deep_gemm" if caps.deep_gemm_signal else "plugin"
    if fine_ok and req.granularity in ("auto", "block"):
        return SboDecision(SboPath.FINE_GRAINED, "per-block combine form and a per-block signal "
                           f"GEMM ({source})", granularity="block", gemm_signal_source=source,
                           combine_form="per_block")
    if expert_ok and req.granularity in ("auto", "expert"):
        return SboDecision(SboPath.PER_EXPERT, f"sgl-deep-ep {caps.deep_ep_version} takes the "
                           "per-expert combine form; the plugin's signal GEMM writes it",
                           granularity="expert", gemm_signal_source="plugin",
                           combine_form="per_expert")
    if req.granularity == "block":
        missing = _missing_block(caps)
    elif req.granularity == "expert":
        missing = _missing_expert(caps)
    else:
        missing = _missing_block(caps) + _missing_expert(caps)
        missing = list(dict.fromkeys(missing))
    if forced:
        return _refuse(f"{what}: the down-GEMM/combine overlap cannot run on SM90 here: "
                       + "; ".join(missing))
    return SboDecision(SboPath.SHARED_EXPERT_ONLY, "no signal path: " + "; ".join(missing))


def _decide_sm100(caps: Capabilities, req: SboRequest) -> SboDecision:
    if req.granularity == "block":
        return _refuse("--sbo-signal-granularity block is the Hopper (SM90) form; on SM100 "
                       "SGLang's Blackwell SBO uses per-expert signals (use expert or auto)")
    if req.down_gemm_overlap == "force":
        if req.runner_backend != "flashinfer_cutedsl":
            return _refuse("--sbo-down-gemm-overlap force on SM100 needs --moe-runner-backend "
                           f"flashinfer_cutedsl (got {req.runner_backend})")
        if "per_expert" not in caps.deep_ep_combine_forms:
            return _refuse(f"--sbo-down-gemm-overlap force: sgl-deep-ep {caps.deep_ep_version} "
                           f"accepts {_forms_text(caps)}; install {PINNED_DEEP_EP}")
    return SboDecision(SboPath.UPSTREAM_BLACKWELL, "SGLang's own Blackwell SBO runs unchanged",
                       granularity="expert" if req.runner_backend == "flashinfer_cutedsl" else None)


def decide_sbo_path(caps: Capabilities, req: SboRequest) -> SboDecision:
    """The SBO path for `req` on `caps`, or a refusal whose message says what to install."""
    if not req.enabled:
        return SboDecision(SboPath.OFF, "--enable-single-batch-overlap not given")
    if req.a2a_backend != "deepep":
        if req.down_gemm_overlap == "force" or req.granularity != "auto":
            return _refuse("the down-GEMM/combine overlap needs --moe-a2a-backend deepep "
                           f"(got {req.a2a_backend})")
        return SboDecision(SboPath.SHARED_EXPERT_ONLY,
                           f"--moe-a2a-backend {req.a2a_backend}: no DeepEP combine to overlap")
    if caps.arch not in ("sm90", "sm100"):
        return _refuse(f"SBO with --moe-a2a-backend deepep runs on an NVIDIA SM90 (Hopper) or "
                       f"SM100 (Blackwell) GPU; this machine: {caps.arch} (try "
                       "`sglang-overlap check --assume-arch sm90` to see a Hopper box's choice)")
    if caps.deep_ep_version is None:
        return _refuse("--enable-single-batch-overlap with --moe-a2a-backend deepep needs the "
                       "deep_ep package: sgl-deep-ep is not installed; "
                       f"pip install {PINNED_DEEP_EP}")
    if caps.arch == "sm100":
        return _decide_sm100(caps, req)
    return _decide_sm90(caps, req)


__all__ = [
    "Arch",
    "Capabilities",
    "CombineForm",
    "PER_BLOCK_ARGS",
    "PER_EXPERT_ARGS",
    "SboDecision",
    "SboPath",
    "SboRequest",
    "decide_sbo_path",
]
