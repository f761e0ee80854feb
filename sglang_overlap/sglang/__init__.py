"""Glue to SGLang (the release `compat.SUPPORTED_SGLANG`): the only package that imports sglang.

`upstream/`: one file per upstream module the plugin hooks, named after that module's path
(`upstream/token_dispatcher_deepep.py` hooks `sglang.srt.layers.moe.token_dispatcher.deepep`);
each exposes `HOOKS` (and, for argument resolution steps, `RESOLUTION_HOOKS`). What a maintainer
diffs when SGLang is upgraded.

The plugin's own services, which the hook files call:
    hooks.py             HookSpec, the list of hook files, registration
    guard.py             the SGLang version / hook-target check run by register()
    state.py             the one settings reader, the step's decision, the TBO-step marker
    sbo_decision.py      the SBO path of this process (from the installed kernels)
    selector_setup.py    the mode selector (--overlap-gating auto) built at start-up
    selector_runtime.py  the selector's step times and how they reach every rank
    torch_a2a.py         the torch_a2a dispatcher impls
"""
