"""Per-process state the hooks share; `settings()` is the one reader of the plugin's settings.

Settings ride on the ServerArgs record (`server_args.py` stores them on `SETTINGS_ATTR` when the
command line is parsed; the record is pickled to every scheduler process). A record built without
the command line (the Python `Engine(**kwargs)` API) carries none: then the upstream fields it
has, plus the flags in $SGLANG_OVERLAP_ARGS, are used. The settings read from a published record
are kept until another record is published (a process serves one; tests switch contexts).

Besides the settings: the step's decision (`StepDecision`), whether the plugin's TBO step is
running (SBO does not apply inside TBO, as upstream), and the SM counts SBO layouts are planned on.

The step's decision travels one way. The mode selector makes it where SGLang has synced the step
across ranks (`upstream/dp_attn.py`: `hand_over`); the served model's forward takes it
(`upstream/model_runner.py`: `take_handed_over`, or `upstream_rule` for a step the selector did not
decide) and runs the step inside `step(decision)`. Inside, every hook reads `decision()`: the
decode graph set replayed and its key (`upstream/decode_cuda_graph_runner.py`, which also captures
each set inside `step` with that set's mode), whether the MoE layers run SBO (`sbo_active`,
`upstream/deepseek_v2.py`), the timing cell and the counters. Nobody derives the mode again.
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

from sglang_overlap.modes import Mode, Phase, StepDecision, upstream_rule
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
_handed: list[StepDecision | None] = [None]  # made by the selector, not yet taken by a forward
_current: list[StepDecision | None] = [None]  # the decision of the step running now


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


def hand_over(decision: StepDecision | None) -> None:
    """The selector's decision for the next forward of the served model (None: the next step is
    undecided, e.g. SGLang skipped its metadata sync; SGLang's own rule then applies)."""
    _handed[0] = decision


def take_handed_over() -> StepDecision | None:
    """The decision handed over for this forward, once (a later forward gets None)."""
    d, _handed[0] = _handed[0], None
    return d


@contextlib.contextmanager
def step(decision: StepDecision | None) -> Iterator[StepDecision | None]:
    """Run the block as `decision`'s step (None: outside any step); a nested step (a graph
    capture, a graph replayed as the mode it was captured in) restores the outer one."""
    saved, _current[0] = _current[0], decision
    try:
        yield decision
    finally:
        _current[0] = saved


def decision() -> StepDecision | None:
    """The decision of the step running now (None: outside a step of the served model, e.g. a
    draft model's forward or a graph captured without per-mode sets)."""
    return _current[0]


def batch_phase(forward_mode: Any) -> Phase:
    """The phase of a batch SGLang runs (its `ForwardMode`): prefill for an extend that is not a
    target-verify, else decode."""
    return Phase.PREFILL if forward_mode.is_extend() and not forward_mode.is_target_verify() \
        else Phase.DECODE


def sglang_rule(forward_batch: Any) -> StepDecision:
    """The decision of a step no selector decided: SGLang's own rule (`modes.upstream_rule`) for
    the batch it built (split: TBO)."""
    return upstream_rule(batch_phase(forward_batch.forward_mode), bool(forward_batch.can_run_tbo),
                         settings().enable_single_batch_overlap)


def sbo_active() -> bool:
    """SBO applies to this MoE call: enabled, and the step's decision is SBO; outside a step,
    SGLang's own rule (enabled and not inside TBO)."""
    if not settings().enable_single_batch_overlap:
        return False
    d = _current[0]
    if d is not None:
        return d.mode == Mode.SBO
    return not in_tbo()


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
