"""Hook on `sglang.srt.arg_groups.moe_hook`: `--moe-a2a-backend torch_a2a` takes DeepEP's paths.

SGLang resolves --moe-a2a-backend in the argument-resolution step `handle_a2a_moe`; the plugin's
step (run before SGLang's own) declares the resolved backend deepep when torch_a2a was asked for,
so every later step and every layer sees DeepEP's paths, and `token_dispatcher_deepep.py` and
`ep_moe_layer.py` swap in the torch all-to-all and the torch experts.
"""

from __future__ import annotations

from typing import Any

from sglang_overlap.modes import Feature
from sglang_overlap.sglang.hooks import HookSpec, ResolutionSpec
from sglang_overlap.sglang.upstream.server_args import TORCH_A2A

A2A_RESOLUTION_STEP = "handle_a2a_moe"
A2A_RESOLUTION_TARGET = "sglang.srt.arg_groups.moe_hook.handle_a2a_moe"


def alias_to_deepep(server_args: Any, previous: Any) -> None:
    """Resolution step `handle_a2a_moe`: torch_a2a takes DeepEP's code paths."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolved_view

    if resolved_view(server_args).moe_a2a_backend == TORCH_A2A:
        declare_resolution(server_args, "sglang_overlap", moe_a2a_backend="deepep")
    previous(server_args)


HOOKS: tuple[HookSpec, ...] = ()

RESOLUTION_HOOKS: tuple[ResolutionSpec, ...] = (
    ResolutionSpec(A2A_RESOLUTION_STEP, alias_to_deepep, A2A_RESOLUTION_TARGET, "src:93b7e3ef5636",
                   Feature.TORCH_A2A),
)
