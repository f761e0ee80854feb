"""Entry point of the SGLang plugin (group `sglang.srt.plugins`, name `sglang_overlap`).

SGLang calls `register()` in every process (launcher, schedulers, detokenizer) before it parses
arguments or builds the model, then applies the registered hooks. `register()` imports no torch
and is safe to call any number of times.

First the version guard (`sglang/guard.py`) reads the installed sglang: if its version or any
hook target differs from what the hooks were written for, the plugin stays inert (one log line)
and only its argument hooks are installed, so that a server asking for overlap is refused at
argument parsing, naming the versions and the first mismatching target.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("sglang_overlap")

_done: dict[str, bool] = {}


def register() -> None:
    from sglang_overlap.sglang import guard, hooks, server_args

    specs = hooks.all_specs()
    result = guard.check(hooks.all_pins())
    if result.ok:
        server_args.set_inert(None)
        new = hooks.install(specs)
        hooks.install_resolution_hooks(hooks.resolution_specs())
        if new:
            logger.debug("sglang-overlap: registered %d hooks", len(new))
        return
    server_args.set_inert(result.message())
    hooks.install(s for s in specs if s.target in server_args.ALWAYS)
    if not _done.get("logged"):
        _done["logged"] = True
        logger.warning("%s; the plugin is inert (overlap flags will be refused)",
                       result.message())
