"""Hooks on `sglang.srt.server_args`: the plugin's flags on SGLang's parser, carried to every
process, and the resolution step that lets `--moe-a2a-backend torch_a2a` take DeepEP's paths.

The supported SGLang's ServerArgs is a msgspec Struct: a plugin cannot add fields. So:
  * `ServerArgs.add_cli_args` (AFTER) adds the plugin's flags to SGLang's parser;
  * `ServerArgs.from_cli_args` (AFTER) builds an `OverlapSettings` from the parsed namespace,
    validates it against the server, and stores it as the bookkeeping attribute
    `state.SETTINGS_ATTR` (private names are allowed on the record and pickled with it, so
    spawned scheduler processes receive it); `state.settings()` reads it back in any process;
  * resolution step `handle_a2a_moe`: torch_a2a resolves to deepep (so every `is_deepep()` branch
    applies, and ep_size = tp_size); the user's choice stays on the plugin's settings.

  * `ServerArgs.resolve_once` (BEFORE, the first step of every launch): a record built without
    the command line (the Python `Engine(**kwargs)` API, with $SGLANG_OVERLAP_ARGS) is refused
    on the same terms as the command line, before any process starts.

The version guard (`guard.py`) turns features off one by one. The argument hooks are always
installed: a server asking for a feature that is off is refused here, with the guard's message
naming the first changed dependency; one that asks for none runs as plain SGLang.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.settings import (
    OverlapSettings,
    ServerFacts,
    SettingsError,
    add_arguments,
)
from sglang_overlap.settings import (
    validate_settings as _validate,
)
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import FEATURES, HookSpec

logger = logging.getLogger("sglang_overlap")

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
RESOLVE_ONCE = "sglang.srt.server_args.ServerArgs.resolve_once"

TORCH_A2A = "torch_a2a"
"""The a2a backend the plugin adds to --moe-a2a-backend (`upstream/token_dispatcher_deepep.py`)."""

_verdict: dict[str, Any] = {}  # "verdict": the guard's FeatureVerdict when a feature is off


def set_verdict(verdict: Any) -> None:
    """Called by `register()` with the guard's `FeatureVerdict` (None: everything served)."""
    _verdict.clear()
    if verdict is not None:
        _verdict["verdict"] = verdict


def _after_add_cli_args(result: Any, parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    action = parser._option_string_actions.get("--moe-a2a-backend")  # noqa: SLF001
    if action is not None and action.choices is not None and TORCH_A2A not in action.choices:
        action.choices = [*action.choices, TORCH_A2A]


def server_facts(values: Any) -> ServerFacts:
    """What validation needs, from a ServerArgs or an argparse namespace."""
    attn_dp = getattr(values, "attn_dp_size", 1) or 1
    if getattr(values, "enable_dp_attention", False):  # the deprecated spelling
        attn_dp = max(attn_dp, getattr(values, "dp_size", 1) or 1)
    return ServerFacts(
        moe_a2a_backend=str(getattr(values, "moe_a2a_backend", "none") or "none"),
        tp_size=int(getattr(values, "tp_size", 1) or 1),
        attn_dp_size=int(attn_dp),
    )


def requested_features(settings: OverlapSettings) -> dict[Feature, str]:
    """feature -> the flag asking for it ("args": any other plugin flag)."""
    out: dict[Feature, str] = {}
    if settings.enable_two_batch_overlap:
        out[Feature.TBO] = "--enable-two-batch-overlap"
    if settings.enable_single_batch_overlap:
        out[Feature.SBO] = "--enable-single-batch-overlap"
    if settings.overlap_gating == "auto":
        out[Feature.GATE] = "--overlap-gating auto"
    if settings.requested_a2a_backend == TORCH_A2A:
        out[Feature.TORCH_A2A] = f"--moe-a2a-backend {TORCH_A2A}"
    if settings != OverlapSettings():
        out[Feature.ARGS] = "the overlap flags"
    return out


def cpu_server(values: Any) -> bool:
    """Whether a ServerArgs / namespace serves on CPU (--device cpu, or no CUDA when unset)."""
    device = getattr(values, "device", None)
    if device:
        return str(device).split(":")[0] == "cpu"
    import torch

    return not torch.cuda.is_available()


def refuse_if_off(settings: OverlapSettings, values: Any) -> None:
    """Refuse a flag whose feature the guard turned off, naming the first changed dependency."""
    verdict = _verdict.get("verdict")
    if verdict is None:
        return
    asked = requested_features(settings)
    cpu = any(f in verdict.off_on_cpu for f in asked) and cpu_server(values)
    for feature, flag in asked.items():
        message = verdict.message(feature, cpu=cpu)
        if message is None:
            continue
        if feature == "args":
            raise SettingsError(f"{message}; the overlap flags cannot be served (start without "
                                "them, or install a supported sglang)")
        raise SettingsError(f"{message}; {flag} cannot be served ({FEATURES[feature]} is off: "
                            "start without it, or install a supported sglang)")


PROG = "sglang serve"  # SGLang's parser's prog (`prepare_server_args`)
_raising: list[bool] = []  # non-empty: parse_server_args wants the SettingsError itself


def check_settings(settings: OverlapSettings, values: Any) -> list[str]:
    """THE validation of the plugin's settings, the same for the command line (`sglang serve`,
    `from_cli_args`) and the Python API (`Engine(**kwargs)` with $SGLANG_OVERLAP_ARGS,
    `resolve_once`): a feature the version guard turned off, ranges and contradictions
    (`settings.validate_settings`), a forced SBO path the kernels lack, a served model the
    requested modes are not proven on. `values` is a ServerArgs or an argparse namespace.
    Raises SettingsError naming the flags; returns the warnings."""
    refuse_if_off(settings, values)
    warnings = _validate(settings, server_facts(values))
    _refuse_unavailable_sbo_path(settings, values)
    _refuse_unsupported_model(settings, values)
    return warnings


def _after_from_cli_args(result: Any, cls: Any, args: argparse.Namespace) -> None:
    settings = OverlapSettings.from_mapping(vars(args))
    try:
        warnings = check_settings(settings, args)
    except SettingsError as exc:
        if _raising:
            raise
        # as argparse ends a bad command line: one line on stderr, exit status 2
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        raise SystemExit(2) from None
    for warning in warnings:
        logger.warning("sglang-overlap: %s", warning)
    setattr(result, state.SETTINGS_ATTR, settings)


def _before_resolve_once(server_args: Any, *args: Any, **kwargs: Any) -> None:
    """A record built by `Engine(**kwargs)` (no command line): its settings (upstream fields and
    $SGLANG_OVERLAP_ARGS, which must parse) get `check_settings`, as the command line's do, and
    ride on the record to every process. Raises SettingsError (the Engine caller sees it)."""
    if getattr(server_args, state.SETTINGS_ATTR, None) is not None:
        return  # from the command line: checked in from_cli_args
    if getattr(server_args, "_resolution_finished", False):
        return
    settings = state.settings_of(server_args)
    for warning in check_settings(settings, server_args):
        logger.warning("sglang-overlap: %s", warning)
    setattr(server_args, state.SETTINGS_ATTR, settings)


CONFIG = "config.json"


def load_config(path: str, model_path: str) -> dict[str, Any]:
    """`path` (a config.json of --model-path `model_path`) as a dict. Raises SettingsError
    naming --model-path when it cannot be read, is not a JSON object, or its "architectures"
    is not a list of class names (SGLang's own reading would end in a traceback)."""
    import json

    where = f"--model-path {model_path}: {path}"
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as exc:
        raise SettingsError(f"{where} cannot be read ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{where} is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SettingsError(f"{where} is not a JSON object (got {type(data).__name__})")
    archs = data.get("architectures")
    if archs is not None and not (isinstance(archs, list)
                                  and all(isinstance(a, str) for a in archs)):
        raise SettingsError(f"{where}: \"architectures\" must be a list of class names "
                            f"(got {archs!r})")
    return data


def read_config(model_path: str,
                revision: str | None = None) -> tuple[dict[str, Any], str] | None:
    """(the served model's config.json as a dict, where it was read), without the network and
    without importing transformers: a local folder, or the Hugging Face cache; None when
    neither holds it. Raises SettingsError for a config.json that is there but is not one
    (`load_config`)."""
    import os

    if os.path.isdir(model_path):
        path = os.path.join(model_path, CONFIG)
        return (load_config(path, model_path), model_path) if os.path.isfile(path) else None
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(model_path, CONFIG, revision=revision)
    except Exception:  # noqa: BLE001 - not a repo id, no hub client: not in a cache
        return None
    if not isinstance(cached, str):
        return None
    return load_config(cached, model_path), "the Hugging Face cache"


def hf_config_dict(model_path: str, revision: str | None = None,
                   trust_remote_code: bool = False) -> dict[str, Any] | None:
    """The served model's `config.json` as a plain dict (`read_config`); None when it is not
    on this machine yet (then the checks run again when the model config is built)."""
    found = read_config(model_path, revision)
    return found[0] if found is not None else None


def _refuse_unsupported_model(settings: OverlapSettings, args: Any) -> None:
    """Refuse, naming the architecture and the mode, a served model a requested mode is not
    proven on (`sglang_overlap.models`); with --overlap-gating auto also one the cost model
    cannot describe, naming the missing config field. Where the model's config.json is not on
    this machine yet, `model_config.py` runs the same check when SGLang builds the config."""
    from sglang_overlap.models import requested_modes

    modes = requested_modes(settings)
    if not modes:
        return
    model_path = str(getattr(args, "model_path", "") or "")
    config = hf_config_dict(model_path, getattr(args, "revision", None),
                            bool(getattr(args, "trust_remote_code", False)))
    if config is None:
        logger.info("sglang-overlap: config of %s not readable before start-up; checked when "
                    "SGLang reads it", model_path)
        return
    refuse_model(config, settings, model_path)


def refuse_model(config: dict[str, Any], settings: OverlapSettings, model_path: str) -> None:
    """SettingsError when `config` (an HF config dict) cannot be served with `settings`."""
    from sglang_overlap.models import architecture_of, refusal, requested_modes
    from sglang_overlap.planning.cost.model_config import model_from_hf_config
    from sglang_overlap.planning.cost.profiles import ProfileError

    why = refusal(architecture_of(config), requested_modes(settings))
    if why is not None:
        raise SettingsError(why)
    if settings.overlap_gating != "auto":
        return
    try:
        model_from_hf_config(config)
    except ProfileError as exc:
        raise SettingsError(f"sglang-overlap: --overlap-gating auto cannot model {model_path}: "
                            f"{exc}") from None


def _refuse_unavailable_sbo_path(settings: OverlapSettings, args: Any) -> None:
    """On a GPU the SBO table speaks for, refuse a forced path the installed kernels lack now,
    in the launcher, instead of in every scheduler process after the workers spawned."""
    if not settings.enable_single_batch_overlap or settings.requested_a2a_backend == TORCH_A2A:
        return
    from sglang_overlap.sglang.sbo_decision import current_report, decide_sbo

    report = current_report()
    if report.gpu.arch not in ("sm90", "sm100"):
        return
    decision, _ = decide_sbo(settings, a2a_backend=settings.requested_a2a_backend,
                             runner_backend=str(getattr(args, "moe_runner_backend", "auto")),
                             report=report)
    if decision.refusal is not None:
        raise SettingsError(f"sglang-overlap: {decision.refusal}")


def parse_server_args(argv: list[str]) -> tuple[Any, OverlapSettings]:
    """Parse `argv` exactly as `sglang serve` would with the plugin loaded.

    Raises SettingsError for invalid plugin settings and SystemExit for argparse errors.
    """
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    _raising.append(True)
    try:
        server_args = prepare_server_args(list(argv))
    finally:
        _raising.pop()
    return server_args, state.settings_of(server_args)


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(ADD_CLI_ARGS, _after_add_cli_args, "after",
             "add the plugin's flags (and its a2a backend choice) to SGLang's parser",
             "src:25ec4221e026", feature=Feature.ARGS),
    HookSpec(FROM_CLI_ARGS, _after_from_cli_args, "after",
             "validate the plugin's flags and carry them to every process on the record",
             "src:3a4e3110ef2d", feature=Feature.ARGS),
    HookSpec(RESOLVE_ONCE, _before_resolve_once, "before",
             "Engine(**kwargs): the command line's validation (check_settings) before any process",
             "src:cea6e91ef921", feature=Feature.ARGS),
)

# The hooks installed even when the guard failed (they only parse, validate and refuse).
ALWAYS = frozenset({ADD_CLI_ARGS, FROM_CLI_ARGS, RESOLVE_ONCE})
