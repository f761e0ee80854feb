"""Per-process state the hooks share; `settings()` is the one reader of the plugin's settings.

Settings ride on the ServerArgs record (`server_args.py` stores them on `SETTINGS_ATTR` when the
command line is parsed; the record is pickled to every scheduler process). A record built without
the command line (the Python `Engine(**kwargs)` API) carries none: then the upstream fields it
has, plus the flags in $SGLANG_OVERLAP_ARGS, are used. The settings read from a published record
are kept until another record is published (a process serves one; tests switch contexts).

Besides the settings: whether the plugin's TBO step is running (SBO does not apply inside TBO, as
upstream), the mode selector's mode for the current step (`step_mode`; `upstream_flags` makes
SGLang's own TBO/SBO code follow it), and the SM counts SBO layouts are planned on.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import shlex
import typing
from collections.abc import Iterator
from typing import Any

from sglang_overlap.planning.sbo_layout import HOPPER_NUM_SMS, default_comm_num_sms
from sglang_overlap.settings import OverlapSettings, SettingsError, add_arguments

SETTINGS_ATTR = "_sglang_overlap"
ENV_ARGS = "SGLANG_OVERLAP_ARGS"
# SGLang's message when no ServerArgs is published in this process: `RuntimeContext.server_args`,
# pinned in hooks.SHARED_PINS (a change there turns the whole plugin off)
_NOT_PUBLISHED = "Global server args is not set yet!"

_settings: OverlapSettings | None = None  # set by configure()
_read: tuple[Any, OverlapSettings] | None = None  # (the published record, its settings)
_tbo_depth = 0
_step_mode: str | None = None  # --overlap-gating auto: the selector's mode for the current step


def settings() -> OverlapSettings:
    """This process's plugin settings; defaults (every mode off) where SGLang has published no
    ServerArgs (the launcher before parsing, a plain Python process). Any other failure raises."""
    global _read
    if _settings is not None:
        return _settings
    from sglang.srt.runtime_context import get_server_args

    try:
        server_args = get_server_args()
    except ValueError as exc:
        if str(exc) != _NOT_PUBLISHED:
            raise
        return OverlapSettings()
    if _read is None or _read[0] is not server_args:
        _read = (server_args, settings_of(server_args))
    return _read[1]


def configure(value: OverlapSettings | None) -> None:
    """Set (or, with None, forget) this process's settings; for tests and embedders."""
    global _settings
    _settings = value


def settings_of(server_args: Any) -> OverlapSettings:
    """The plugin settings carried by `server_args` (a ServerArgs from any process)."""
    carried = getattr(server_args, SETTINGS_ATTR, None)
    if isinstance(carried, OverlapSettings):
        return carried
    upstream = {
        name: getattr(server_args, name)
        for name in ("enable_two_batch_overlap", "enable_single_batch_overlap",
                     "tbo_token_distribution_threshold", "moe_a2a_backend")
        if hasattr(server_args, name)
    }
    return env_settings(OverlapSettings.from_mapping(upstream))


def env_settings(base: OverlapSettings) -> OverlapSettings:
    """`base` overlaid with the flags in $SGLANG_OVERLAP_ARGS (the Engine API's command line)."""
    raw = os.environ.get(ENV_ARGS, "").strip()
    if not raw:
        return base
    parser = _EnvParser(prog=ENV_ARGS, add_help=False, exit_on_error=False)
    add_arguments(parser, include_upstream=True, defaults=False)
    try:
        ns, unknown = parser.parse_known_args(shlex.split(raw))
    except (argparse.ArgumentError, ValueError) as exc:  # ValueError: shlex (an open quote)
        raise SettingsError(f"sglang-overlap: {ENV_ARGS}={raw!r}: {exc}") from None
    if unknown:
        raise SettingsError(f"sglang-overlap: {ENV_ARGS}={raw!r}: unknown token {unknown[0]!r}")
    return OverlapSettings.from_mapping({**base.to_dests(), **vars(ns)})


class _EnvParser(argparse.ArgumentParser):
    """Raises instead of exiting (argparse exits on a missing value even without exit_on_error)."""

    def error(self, message: str) -> typing.NoReturn:
        raise argparse.ArgumentError(None, message)


@contextlib.contextmanager
def tbo_running() -> Iterator[None]:
    """Marks a TBO step as running (SBO does not apply inside TBO, as upstream)."""
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


def step_mode() -> str | None:
    """The mode selector's mode for the current step (None: no selector decided this step)."""
    return _step_mode


def sbo_active() -> bool:
    """SBO applies to this MoE call: enabled, not inside TBO, and (with the mode selector,
    --overlap-gating auto) the selector chose it for this step."""
    s = settings()
    if not s.enable_single_batch_overlap or in_tbo():
        return False
    return s.overlap_gating != "auto" or _step_mode in (None, "sbo")


@contextlib.contextmanager
def upstream_flags(*, tbo: bool | None = None, sbo: bool | None = None) -> Iterator[None]:
    """SGLang's process-wide `moe.tbo_enabled` / `moe.sbo_enabled` (read live by
    `is_tbo_enabled()` / `is_sbo_enabled()`, hence by `SboFlags` and the TBO graph plugin) set
    to `tbo` / `sbo` (None: left as is) for the block, restored after."""
    from sglang.srt.runtime_context import get_flags

    moe = get_flags().moe
    saved = moe.tbo_enabled, moe.sbo_enabled
    if tbo is not None:
        moe.tbo_enabled = tbo
    if sbo is not None:
        moe.sbo_enabled = sbo
    try:
        yield
    finally:
        moe.tbo_enabled, moe.sbo_enabled = saved


@functools.lru_cache(maxsize=1)
def _device_sms() -> tuple[int, bool]:
    import torch

    if not torch.cuda.is_available():
        return HOPPER_NUM_SMS, False  # nominal: SBO layouts still need a count on CPU
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(props.multi_processor_count), props.major >= 10


def num_sms() -> int:
    return _device_sms()[0]


def combine_num_sms() -> int:
    """--sbo-combine-num-sms, or upstream's default for this GPU."""
    return settings().sbo_combine_num_sms or default_comm_num_sms(_device_sms()[1])
