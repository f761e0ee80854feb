"""The plugin's settings, declared once.

`OverlapSettings` is the single source of truth: the argparse flags, their defaults and their
`--help` text are generated from its fields, and `validate_settings` checks a value of it against
the deployment it is used in. Pure Python (no torch, no sglang) so that `sglang-overlap args`,
the cost model and the tests can use it anywhere.

Four upstream flags keep their SGLang names and meaning (SGLang's own parser defines them; the
plugin only reads them, and adds the choice torch_a2a to the last): --enable-two-batch-overlap,
--enable-single-batch-overlap, --tbo-token-distribution-threshold and --moe-a2a-backend. Every
other field is a flag this plugin adds.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from sglang_overlap.modes import Mode
from sglang_overlap.planning.cost.profiles import HARDWARE_PROFILES, ProfileError, load_hardware
from sglang_overlap.planning.sbo_layout import default_comm_num_sms
from sglang_overlap.planning.selector import check_explore_share, check_hysteresis, check_trials
from sglang_overlap.planning.two_chunk import check_threshold

GatingPolicy = Literal["always", "auto"]
SignalGranularity = Literal["auto", "expert", "block"]
DownGemmOverlap = Literal["auto", "force", "off"]


HARDWARE_PROFILE_CHOICES = ("auto", *HARDWARE_PROFILES)


class SettingsError(ValueError):
    """A flag value, or a combination of flags, that cannot work. The message names the flags."""


@dataclass(frozen=True)
class OverlapSettings:
    """Everything the plugin reads from the command line, after parsing."""

    enable_two_batch_overlap: bool = dataclasses.field(
        default=False,
        metadata={"help": "Two-batch overlap (TBO): split each batch in two micro-batches and "
                  "interleave them so one's all-to-all runs while the other computes.",
                  "upstream": True, "metavar": None},
    )
    """--enable-two-batch-overlap (SGLang's flag, same meaning)."""

    enable_single_batch_overlap: bool = dataclasses.field(
        default=False,
        metadata={"help": "Single-batch overlap (SBO): shared expert during dispatch-receive and "
                  "down GEMM overlapped with combine-send.", "upstream": True, "metavar": None},
    )
    """--enable-single-batch-overlap (SGLang's flag, same meaning; Hopper works with the plugin)."""

    tbo_token_distribution_threshold: float = dataclasses.field(
        default=0.48,
        metadata={"help": "Two-chunk threshold t in [0, 0.5]: cut one request in two when the "
                  "best sequence boundary leaves a micro-batch under t or over 1-t of the tokens; "
                  "0 disables two-chunk.", "upstream": True, "metavar": "T"},
    )
    """--tbo-token-distribution-threshold (SGLang's flag, same meaning)."""

    requested_a2a_backend: str = dataclasses.field(
        default="none",
        metadata={"help": "Expert-parallel all-to-all backend. The plugin adds torch_a2a: "
                  "torch.distributed all-to-all over the tensor-parallel group (gloo on CPU, "
                  "NCCL on GPU), for machines without DeepEP.", "upstream": True,
                  "metavar": "BACKEND", "dest": "moe_a2a_backend"},
    )
    """--moe-a2a-backend as the user gave it (SGLang's flag; the plugin adds the choice
    torch_a2a). SGLang's own copy on ServerArgs resolves torch_a2a to deepep, so that DeepEP's
    code paths apply; this field keeps what was asked for."""

    overlap_gating: GatingPolicy = dataclasses.field(
        default="always",
        metadata={"help": "always: run each enabled overlap mode on every eligible step. auto: per "
                  "step, run the enabled mode (or none) measured fastest for this phase and "
                  "token count, starting from the cost model's prediction for the served model; "
                  "the same decision on every rank.", "upstream": False, "metavar": None},
    )
    """--overlap-gating: always on, or chosen per step from measured step times."""

    overlap_hardware_profile: str = dataclasses.field(
        default="auto",
        metadata={"help": "Hardware profile of the cost model that --overlap-gating auto starts "
                  "from: auto (detect the GPU; on a CPU or a GPU without a shipped profile, no "
                  "prior: measurements alone decide), one of H20, H800, H100, H200, B200, "
                  "H200-measured, or a path to a profile JSON file (the source repository's "
                  "calibrate.py writes one).", "upstream": False, "metavar": "PROFILE"},
    )
    """--overlap-hardware-profile: GPU name, 'auto', or a calibrated profile file."""

    overlap_gating_hysteresis: float = dataclasses.field(
        default=0.03,
        metadata={"help": "With --overlap-gating auto: switch modes only when the new mode is "
                  "estimated at least this fraction faster than the current one (0 to 0.5).",
                  "upstream": False, "metavar": "FRACTION"},
    )
    """--overlap-gating-hysteresis: relative margin that stops automatic gating from flapping."""

    overlap_gating_explore: float = dataclasses.field(
        default=0.05,
        metadata={"help": "With --overlap-gating auto: at most this share of each phase's "
                  "(decode, prefill) steps (0 to 0.5) runs a mode to measure it: one not yet "
                  "measured often enough at that token count, or not run there for a while; 0: "
                  "no exploration (the prior decides until measured).",
                  "upstream": False, "metavar": "FRACTION"},
    )
    """--overlap-gating-explore: cap on the share of each phase's steps spent measuring modes."""

    overlap_gating_trials: int = dataclasses.field(
        default=3,
        metadata={"help": "With --overlap-gating auto: steps each candidate mode runs per token "
                  "bucket before measurements alone rank it (0 to 100).",
                  "upstream": False, "metavar": "N"},
    )
    """--overlap-gating-trials: exploration trials per (phase, token bucket, mode)."""

    overlap_gating_sync_steps: int = dataclasses.field(
        default=16,
        metadata={"help": "With --overlap-gating auto: every this many steps new step-time "
                  "measurements are shared (on SGLang's request broadcast; with attention DP, "
                  "one all-reduce on the CPU group), and every rank applies them at the same "
                  "step (1 to 4096).",
                  "upstream": False, "metavar": "STEPS"},
    )
    """--overlap-gating-sync-steps: how often ranks share measurements."""

    sbo_combine_num_sms: int = dataclasses.field(
        default=0,
        metadata={"help": "SMs given to the combine-send kernel while the down GEMM runs; 0 = "
                  f"default for the GPU ({default_comm_num_sms(False)} on Hopper, "
                  f"{default_comm_num_sms(True)} on Blackwell, as upstream).",
                  "upstream": False, "metavar": "N"},
    )
    """--sbo-combine-num-sms: SMs reserved for combine-send during the down GEMM (0 = default)."""

    sbo_signal_granularity: SignalGranularity = dataclasses.field(
        default="auto",
        metadata={"help": "Unit the down GEMM signals as finished: expert (one counter per local "
                  "expert; what sgl-deep-ep's combine consumes), block (one counter per "
                  "(expert, block_m) tile row), or auto (the finest the installed kernels accept).",
                  "upstream": False, "metavar": None},
    )
    """--sbo-signal-granularity: per-expert or per-(expert, block) signals."""

    sbo_down_gemm_overlap: DownGemmOverlap = dataclasses.field(
        default="auto",
        metadata={"help": "Down-GEMM/combine-send overlap: auto (when the installed kernels allow "
                  "it), force (refuse to start without it), off (shared-expert overlap only).",
                  "upstream": False, "metavar": None},
    )
    """--sbo-down-gemm-overlap: force or forbid the down-GEMM/combine overlap."""

    @property
    def two_chunk_enabled(self) -> bool:
        return self.enable_two_batch_overlap and self.tbo_token_distribution_threshold > 0

    @property
    def any_overlap(self) -> bool:
        return self.enable_two_batch_overlap or self.enable_single_batch_overlap

    @property
    def enabled_modes(self) -> frozenset[Mode]:
        """The overlap modes these flags turn on (none can always run): the one place a flag
        becomes a mode."""
        on = {Mode.TBO: self.enable_two_batch_overlap, Mode.TWO_CHUNK: self.two_chunk_enabled,
              Mode.SBO: self.enable_single_batch_overlap}
        return frozenset(m for m, enabled in on.items() if enabled)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_dests(self) -> dict[str, Any]:
        """The values keyed by argparse dest (what `from_mapping` reads back)."""
        return {dest_of(f): getattr(self, f.name) for f in _fields()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> OverlapSettings:
        """Build from any mapping keyed by argparse dests (a namespace's vars, ServerArgs
        fields): unknown keys are ignored, missing keys take the default."""
        return cls(**{f.name: values[dest_of(f)] for f in dataclasses.fields(cls)
                      if values.get(dest_of(f)) is not None})


def _fields() -> list[dataclasses.Field[Any]]:
    return list(dataclasses.fields(OverlapSettings))


def dest_of(f: dataclasses.Field[Any]) -> str:
    """The argparse dest (and ServerArgs field) a setting is read from."""
    return str(f.metadata.get("dest", f.name))


def flag_name(field_name: str) -> str:
    """`--flag-name` of a settings field (by field name or argparse dest)."""
    fields = {f.name: f for f in _fields()}
    dest = dest_of(fields[field_name]) if field_name in fields else field_name
    return "--" + dest.replace("_", "-")


def upstream_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in _fields() if f.metadata["upstream"]]


def _choices(f: dataclasses.Field[Any]) -> tuple[Any, ...] | None:
    hints = typing.get_type_hints(OverlapSettings)
    tp = hints[f.name]
    if typing.get_origin(tp) is Literal:
        return typing.get_args(tp)
    return None  # free values (a profile may be a file path): validate_settings checks them


def add_arguments(
    parser: argparse.ArgumentParser, *, include_upstream: bool = False, defaults: bool = True
) -> None:
    """Add the plugin's flags (and, for a standalone parser, the upstream ones) to `parser`.

    Flags already on the parser are left alone, so calling this twice is harmless. With
    `defaults=False` a flag not given is absent from the namespace (to overlay explicit values).
    """
    existing = set(parser._option_string_actions)  # noqa: SLF001 - argparse has no public view
    group = parser.add_argument_group(
        "sglang-overlap", "MoE communication/computation overlap (plugin sglang-overlap)"
    )
    hints = typing.get_type_hints(OverlapSettings)
    for f in _fields():
        if f.metadata["upstream"] and not include_upstream:
            continue
        name = flag_name(f.name)
        if name in existing:
            continue
        default = f.default if defaults else argparse.SUPPRESS
        help_text = f"{f.metadata['help']} (default: {f.default})"
        if hints[f.name] is bool:
            group.add_argument(name, action="store_true", default=default, help=help_text)
            continue
        kind: Any = hints[f.name] if hints[f.name] in (int, float, str) else str
        group.add_argument(
            name, type=kind, default=default, choices=_choices(f), help=help_text,
            metavar=f.metadata["metavar"],
        )


@dataclass(frozen=True)
class ServerFacts:
    """What validation needs to know of the server besides the plugin's own settings."""

    moe_a2a_backend: str = "none"
    """--moe-a2a-backend as given (before SGLang resolves torch_a2a to deepep)."""
    tp_size: int = 1
    attn_dp_size: int = 1


def validate_settings(s: OverlapSettings, d: ServerFacts) -> list[str]:
    """Raise SettingsError naming the flags when `s` cannot work in `d`. Return warnings."""
    errors: list[str] = []
    warnings: list[str] = []
    checks: tuple[tuple[Any, Any], ...] = (
        (check_threshold, s.tbo_token_distribution_threshold),
        (check_hysteresis, s.overlap_gating_hysteresis),
        (check_explore_share, s.overlap_gating_explore), (check_trials, s.overlap_gating_trials))
    for check, value in checks:
        try:
            check(value)
        except ValueError as exc:
            errors.append(str(exc))
    if not 1 <= s.overlap_gating_sync_steps <= 4096:
        errors.append(f"--overlap-gating-sync-steps must be in [1, 4096] "
                      f"(got {s.overlap_gating_sync_steps})")
    if s.sbo_combine_num_sms < 0:
        errors.append(f"--sbo-combine-num-sms must be >= 0 (got {s.sbo_combine_num_sms})")
    profile = s.overlap_hardware_profile
    if profile not in HARDWARE_PROFILE_CHOICES and not profile.endswith(".json"):
        errors.append(
            f"--overlap-hardware-profile must be one of {', '.join(HARDWARE_PROFILE_CHOICES)} or a "
            f"path to a .json profile (got {profile!r})"
        )
    elif profile != "auto" and s.overlap_gating == "auto":
        try:  # a bad file would otherwise fail in every scheduler, after the model loaded
            load_hardware(profile)
        except ProfileError as exc:
            errors.append(f"--overlap-hardware-profile {profile}: {exc}")
    has_a2a = d.moe_a2a_backend not in ("none", "", None)
    if d.moe_a2a_backend == "torch_a2a" and d.tp_size < 2:
        errors.append("--moe-a2a-backend torch_a2a needs --tp 2 or more (experts are spread over "
                      f"the tensor-parallel ranks, got --tp {d.tp_size})")
    if s.enable_single_batch_overlap and not has_a2a:
        errors.append(
            "--enable-single-batch-overlap needs an expert-parallel all-to-all backend: "
            f"--moe-a2a-backend deepep or torch_a2a (got {d.moe_a2a_backend})"
        )
    if s.enable_two_batch_overlap and has_a2a and d.moe_a2a_backend != "torch_a2a" \
            and d.tp_size < 2:  # (torch_a2a is refused below 2 ranks above)
        errors.append(
            f"--enable-two-batch-overlap with --moe-a2a-backend {d.moe_a2a_backend} needs the "
            f"experts on 2 or more ranks (--tp 2 or more, got --tp {d.tp_size}): SGLang's "
            "two-batch operations dispatch tokens only when the expert-parallel size is above 1, "
            "and the expert stage then fails (KeyError 'dispatch_output' in "
            "DeepseekV2MoE.op_experts), so on one GPU only --enable-single-batch-overlap serves"
        )
    if s.enable_two_batch_overlap and not has_a2a and d.attn_dp_size <= 1:
        errors.append(
            "--enable-two-batch-overlap needs --moe-a2a-backend deepep or torch_a2a, or "
            f"attention data parallelism (got --moe-a2a-backend {d.moe_a2a_backend}, "
            f"--attn-dp-size {d.attn_dp_size})"
        )
    both = s.enable_single_batch_overlap and s.enable_two_batch_overlap
    if both and s.overlap_gating == "always":
        warnings.append(
            "--enable-single-batch-overlap with --enable-two-batch-overlap and --overlap-gating "
            "always: TBO steps run without SBO (as upstream); SBO applies to steps TBO skips"
        )
    if not s.enable_single_batch_overlap:
        sbo_only = {
            "--sbo-down-gemm-overlap": s.sbo_down_gemm_overlap != "auto",
            "--sbo-signal-granularity": s.sbo_signal_granularity != "auto",
            "--sbo-combine-num-sms": s.sbo_combine_num_sms != 0,
        }
        for flag, set_ in sbo_only.items():
            if set_:
                errors.append(f"{flag} needs --enable-single-batch-overlap")
    if s.sbo_down_gemm_overlap == "off" and s.sbo_signal_granularity != "auto":
        errors.append(
            f"--sbo-signal-granularity {s.sbo_signal_granularity} contradicts "
            "--sbo-down-gemm-overlap off (no signals are produced without the overlap)"
        )
    if s.sbo_down_gemm_overlap == "off" and s.sbo_combine_num_sms != 0:
        errors.append(
            "--sbo-combine-num-sms contradicts --sbo-down-gemm-overlap off "
            "(combine-send gets its own SMs only while the down GEMM runs)"
        )
    if s.overlap_gating == "auto" and not s.any_overlap:
        errors.append(
            "--overlap-gating auto needs at least one of --enable-two-batch-overlap, "
            "--enable-single-batch-overlap"
        )
    if errors:
        raise SettingsError("sglang-overlap: " + "; ".join(errors))
    return warnings
