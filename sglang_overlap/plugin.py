"""Entry point of the SGLang plugin (group `sglang.srt.plugins`, name `sglang_overlap`).

SGLang calls `register()` in every process (launcher, schedulers, detokenizer) before it parses
arguments or builds the model, then applies the registered hooks. `register()` imports no torch
and is safe to call any number of times.

First the version guard (`sglang/guard.py`) reads the installed sglang, feature by feature: a
feature (TBO, SBO, the gate, torch_a2a) any of whose pins differs from what its hooks were
written for gets none of its hooks installed (one log line), and a server asking for it is
refused at argument parsing (or at `Engine(**kwargs)`), naming the first changed dependency. A
wrong version turns every feature off. The argument hooks are always installed.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("sglang_overlap")

_done: dict[str, bool] = {}


def guard_verdict() -> tuple[Any, bool]:
    """The version guard's verdict on the installed sglang (files read, nothing imported), and
    whether it turns any feature off; the argument hooks are told (they refuse what is off)."""
    from sglang_overlap.sglang import guard, hooks
    from sglang_overlap.sglang.upstream import server_args

    verdict = guard.check_features([*hooks.all_specs(), *hooks.resolution_specs()],
                                   hooks.SHARED_PINS)
    off = bool(verdict.off or verdict.off_on_cpu)
    server_args.set_verdict(verdict if off else None)
    return verdict, off


def register() -> None:
    from sglang_overlap.sglang import guard, hooks
    from sglang_overlap.sglang.upstream import server_args

    specs, resolutions = hooks.all_specs(), hooks.resolution_specs()
    verdict, off = guard_verdict()
    new = hooks.install(s for s in specs if s.target in server_args.ALWAYS or (
        s.feature not in verdict.off and s.target not in verdict.changed_targets))
    hooks.install_resolution_hooks(r for r in resolutions if r.feature not in verdict.off)
    if new:
        logger.debug("sglang-overlap: registered %d hooks", len(new))
    if off and not _done.get("logged"):
        _done["logged"] = True
        if set(verdict.off) == {s.feature for s in specs}:
            problem = next(iter(verdict.off.values()))
            logger.warning("%s; the plugin is inert (overlap flags will be refused)",
                           guard.GuardResult(verdict.installed, problem).message())
            return
        for feature, problem in verdict.off.items():
            logger.warning("sglang-overlap: %s is off (its flags will be refused): %s",
                           hooks.FEATURES[feature],  # type: ignore[index]
                           guard.GuardResult(verdict.installed, problem).message())
        for feature, problem in verdict.off_on_cpu.items():
            logger.warning("sglang-overlap: on CPU servers %s is off: %s",
                           hooks.FEATURES[feature], problem)  # type: ignore[index]
