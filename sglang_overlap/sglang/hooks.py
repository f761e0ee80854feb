"""Every SGLang function the plugin hooks, by name, and the one place that registers them.

Each glue module exposes a tuple of `HookSpec`s; `install` registers them all with SGLang's
`HookRegistry`. A hook whose mode is off hands straight back to the original function, so a server
with the plugin installed and no overlap flag set behaves exactly like one without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

HookKind = Literal["before", "after", "around", "replace"]


@dataclass(frozen=True)
class HookSpec:
    target: str
    """Dotted path: `module.attr` or `module.Class.method`, resolved by HookRegistry."""
    fn: Callable[..., Any]
    kind: HookKind
    why: str
    """One line: what the hook changes and why a hook (not a patch) can do it."""


_installed: set[tuple[str, str]] = set()


def install(specs: Iterable[HookSpec]) -> list[HookSpec]:
    """Register `specs` with SGLang's HookRegistry; safe to call repeatedly (each target and
    function is registered once per process). Returns the specs newly registered."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    new: list[HookSpec] = []
    for spec in specs:
        key = (spec.target, f"{spec.fn.__module__}.{spec.fn.__qualname__}")
        if key in _installed:
            continue
        HookRegistry.register(spec.target, spec.fn, HookType(spec.kind))
        _installed.add(key)
        new.append(spec)
    return new


def install_resolution_hooks(steps: Iterable[tuple[str, Callable[..., Any]]]) -> None:
    """Register `fn(server_args, previous)` on SGLang's overridable resolution steps, once."""
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook

    for step, fn in steps:
        if fn not in _HOOKS.get(step, ()):
            register_resolution_hook(step)(fn)
