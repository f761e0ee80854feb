"""Entry point of the SGLang plugin (group `sglang.srt.plugins`, name `sglang_overlap`).

SGLang calls `register()` in every process (launcher, schedulers, detokenizer) before it parses
arguments or builds the model, then applies the registered hooks. `register()` imports no torch
and is safe to call any number of times.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_overlap")


def all_hook_specs() -> list:  # list[HookSpec]
    """Every hook the plugin installs, from each glue module."""
    from sglang_overlap.sglang import args

    specs = list(args.ARG_HOOKS)
    for module_name, attr in _OPTIONAL_GLUE:
        try:
            module = __import__(module_name, fromlist=[attr])
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
            continue
        specs.extend(getattr(module, attr))
    return specs


# Glue modules that contribute hooks (module, attribute holding a tuple of HookSpec).
_OPTIONAL_GLUE: tuple[tuple[str, str], ...] = (
    ("sglang_overlap.sglang.tbo", "SPLIT_HOOKS"),
    ("sglang_overlap.sglang.a2a_backend", "A2A_HOOKS"),
    ("sglang_overlap.sglang.moe", "MOE_HOOKS"),
    ("sglang_overlap.sglang.sbo", "SBO_HOOKS"),
)


def register() -> None:
    from sglang_overlap.sglang import a2a_backend
    from sglang_overlap.sglang.hooks import install, install_resolution_hooks

    new = install(all_hook_specs())
    install_resolution_hooks(a2a_backend.RESOLUTION_HOOKS)
    if new:
        logger.debug("sglang-overlap: registered %d hooks", len(new))
