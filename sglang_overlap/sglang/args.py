"""The plugin's server flags on SGLang's own parser, and how they reach every SGLang process.

SGLang 0.5.23's ServerArgs is a msgspec Struct: a plugin cannot add fields. So:
  * `ServerArgs.add_cli_args` (AFTER) adds the plugin's flags to SGLang's parser;
  * `ServerArgs.from_cli_args` (AFTER) builds an `OverlapSettings` from the parsed namespace,
    validates it against the deployment, and stores it as the bookkeeping attribute
    `_sglang_overlap` (private names are allowed on the record and pickled with it, so spawned
    scheduler processes receive it);
  * `current_settings()` reads it back in any process.

The Python `Engine(**kwargs)` path has no command line; there the plugin flags come from the
environment variable SGLANG_OVERLAP_ARGS (e.g. "--overlap-gating auto").
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
from typing import Any

from sglang_overlap.settings import (
    Deployment,
    OverlapSettings,
    SettingsError,
    add_arguments,
    validate_settings,
)
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"

SETTINGS_ATTR = "_sglang_overlap"
ENV_ARGS = "SGLANG_OVERLAP_ARGS"

# a2a backends the plugin adds to --moe-a2a-backend (see sglang/a2a_backend.py).
PLUGIN_A2A_BACKENDS: tuple[str, ...] = ("torch_a2a",)


def _after_add_cli_args(result: Any, parser: argparse.ArgumentParser) -> None:
    add_arguments(parser)
    action = parser._option_string_actions.get("--moe-a2a-backend")  # noqa: SLF001
    if action is not None and action.choices is not None:
        extra = [b for b in PLUGIN_A2A_BACKENDS if b not in action.choices]
        action.choices = [*action.choices, *extra]


def deployment_of(values: Any) -> Deployment:
    """The facts validation needs, from a ServerArgs or an argparse namespace."""
    attn_dp = getattr(values, "attn_dp_size", 1) or 1
    if getattr(values, "enable_dp_attention", False):  # the deprecated spelling
        attn_dp = max(attn_dp, getattr(values, "dp_size", 1) or 1)
    return Deployment(
        moe_a2a_backend=str(getattr(values, "moe_a2a_backend", "none") or "none"),
        tp_size=int(getattr(values, "tp_size", 1) or 1),
        ep_size=int(getattr(values, "ep_size", 1) or 1),
        attn_dp_size=int(attn_dp),
        deepep_mode=str(getattr(values, "deepep_mode", "auto") or "auto"),
        disaggregation_mode=str(getattr(values, "disaggregation_mode", "null") or "null"),
        extra_a2a_backends=PLUGIN_A2A_BACKENDS,
    )


def settings_from_namespace(ns: argparse.Namespace) -> OverlapSettings:
    return OverlapSettings.from_mapping(vars(ns))


def _after_from_cli_args(result: Any, cls: Any, args: argparse.Namespace) -> None:
    settings = settings_from_namespace(args)
    for warning in validate_settings(settings, deployment_of(args)):
        logger.warning("sglang-overlap: %s", warning)
    _refuse_unavailable_sbo_path(settings, args)
    setattr(result, SETTINGS_ATTR, settings)


def _refuse_unavailable_sbo_path(settings: OverlapSettings, args: argparse.Namespace) -> None:
    """On a GPU the SBO table speaks for, refuse a forced path the installed kernels lack now,
    in the launcher, instead of in every scheduler process after the workers spawned."""
    if not settings.enable_single_batch_overlap or settings.moe_a2a_backend == "torch_a2a":
        return
    from sglang_overlap.sglang.sbo import decide_sbo

    decision, report = decide_sbo(settings, a2a_backend=settings.moe_a2a_backend,
                                  runner_backend=str(getattr(args, "moe_runner_backend", "auto")))
    if report.gpu.arch in ("sm90", "sm100") and decision.refusal is not None:
        raise SettingsError(f"sglang-overlap: {decision.refusal}")


def _env_settings(base: OverlapSettings) -> OverlapSettings:
    raw = os.environ.get(ENV_ARGS, "").strip()
    if not raw:
        return base
    parser = argparse.ArgumentParser(prog=ENV_ARGS, add_help=False)
    add_arguments(parser, include_upstream=True, defaults=False)
    try:
        ns = parser.parse_args(shlex.split(raw))
    except SystemExit as exc:
        raise SettingsError(f"sglang-overlap: cannot parse {ENV_ARGS}={raw!r}") from exc
    return OverlapSettings.from_mapping({**base.to_dict(), **vars(ns)})


def settings_of(server_args: Any) -> OverlapSettings:
    """The plugin settings carried by `server_args` (a ServerArgs from any process).

    A record built without the command line (the Engine API) carries none: then the upstream
    fields it has, plus SGLANG_OVERLAP_ARGS, are used.
    """
    carried = getattr(server_args, SETTINGS_ATTR, None)
    if isinstance(carried, OverlapSettings):
        return carried
    upstream = {
        name: getattr(server_args, name)
        for name in ("enable_two_batch_overlap", "enable_single_batch_overlap",
                     "tbo_token_distribution_threshold", "moe_a2a_backend")
        if hasattr(server_args, name)
    }
    return _env_settings(OverlapSettings.from_mapping(upstream))


def current_settings() -> OverlapSettings:
    """Settings of this SGLang process (after the scheduler published its ServerArgs)."""
    from sglang.srt.runtime_context import get_server_args

    return settings_of(get_server_args())


def parse_server_args(argv: list[str]) -> tuple[Any, OverlapSettings]:
    """Parse `argv` exactly as `sglang serve` would with the plugin loaded.

    Raises SettingsError for invalid plugin settings and SystemExit for argparse errors.
    """
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import prepare_server_args

    load_plugins()
    server_args = prepare_server_args(list(argv))
    return server_args, settings_of(server_args)


ARG_HOOKS: tuple[HookSpec, ...] = (
    HookSpec(ADD_CLI_ARGS, _after_add_cli_args, "after",
             "add the plugin's flags (and its a2a backend choice) to SGLang's parser"),
    HookSpec(FROM_CLI_ARGS, _after_from_cli_args, "after",
             "validate the plugin's flags and carry them to every process on the record"),
)
