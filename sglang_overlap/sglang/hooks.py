"""Every SGLang function the plugin hooks, by name, and the one place that registers them.

Each glue module is named after the upstream module it hooks and exposes `HOOKS`, a tuple of
`HookSpec`s. `GLUE_MODULES` lists them; `install` registers their specs with SGLang's
`HookRegistry`. Each spec belongs to one feature (`FEATURES`); the version guard turns a feature
off when any of its pins changed (`guard.py`), and its flags are then refused.

With no overlap flag set a server behaves exactly like one without the plugin: every hook is a
BEFORE, AFTER or AROUND hook whose mode is off hands straight back to the original function (the
TBO split functions included: `two_batch_overlap.py` answers them only with the plugin's TBO on).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from sglang_overlap.modes import Feature

HookKind = Literal["before", "after", "around", "replace"]
FEATURES: dict[Feature, str] = {
    Feature.ARGS: "the plugin's flags",
    Feature.TBO: "TBO and two-chunk",
    Feature.SBO: "SBO",
    Feature.GATE: "--overlap-gating auto",
    Feature.TORCH_A2A: "--moe-a2a-backend torch_a2a",
    Feature.METRICS: "the plugin's series in /metrics (no flag: off means not exported)",
}
"""What each feature serves; a changed pin of "args" turns every feature off."""


@dataclass(frozen=True)
class Pin:
    """An upstream definition a hook relies on, with its fingerprint in the supported SGLang."""

    target: str
    """Dotted path of a function, method or class (`guard.fingerprint` reads it)."""
    fingerprint: str
    relied_on: str = ""
    """What the hook relies on there, when the target is not the hooked function itself."""


@dataclass(frozen=True)
class HookSpec:
    target: str
    """Dotted path: `module.attr` or `module.Class.method`, resolved by HookRegistry."""
    fn: Callable[..., Any]
    kind: HookKind
    why: str
    """One line: what the hook changes and why a hook (not a patch) can do it."""
    fingerprint: str
    """The target's source fingerprint in the supported SGLang (see `guard.py`)."""
    feature: Feature
    """The feature turned off when this target or a `relies_on` pin changed."""
    relies_on: tuple[Pin, ...] = ()
    """Other upstream code the hook depends on (a column order, a call's kwargs)."""
    cpu_only: bool = False
    """The hook matters only on CPU servers: a change turns its feature off only there."""

    def pins(self) -> tuple[Pin, ...]:
        return (Pin(self.target, self.fingerprint), *self.relies_on)


@dataclass(frozen=True)
class ResolutionSpec:
    """A function run on one of SGLang's overridable argument-resolution steps."""

    step: str
    fn: Callable[..., Any]
    step_target: str
    """The upstream function that implements the step (guarded like a hook target)."""
    fingerprint: str
    feature: Feature

    def pins(self) -> tuple[Pin, ...]:
        return (Pin(self.step_target, self.fingerprint),)


SHARED_PINS: tuple[Pin, ...] = (
    Pin("sglang.srt.runtime_context.RuntimeContext.server_args", "src:b6e3df2aa4da",
        "state.settings(): ValueError while no ServerArgs is published"),
)
"""Upstream code every feature relies on (a change turns them all off)."""


# Glue modules in registration order: each is named after the upstream module it hooks.
GLUE_MODULES: tuple[str, ...] = (
    "server_args",  # sglang.srt.server_args
    "moe_hook",  # sglang.srt.arg_groups.moe_hook (the a2a resolution step)
    "model_config",  # sglang.srt.configs.model_config
    "two_batch_overlap",  # sglang.srt.batch_overlap.two_batch_overlap
    "operations",  # sglang.srt.batch_overlap.operations
    "operations_strategy",  # sglang.srt.batch_overlap.operations_strategy
    "dp_attn",  # sglang.srt.managers.scheduler_components.dp_attn
    "request_receiver",  # sglang.srt.managers.scheduler_components.request_receiver
    "model_runner",  # sglang.srt.model_executor.model_runner
    "internal_state",  # sglang.srt.managers.scheduler_components.internal_state
    "forward_batch_info",  # sglang.srt.model_executor.forward_batch_info
    "token_dispatcher_deepep",  # sglang.srt.layers.moe.token_dispatcher.deepep
    "ep_moe_layer",  # sglang.srt.layers.moe.ep_moe.layer
    "moe_utils",  # sglang.srt.layers.moe.utils
    "single_batch_overlap",  # sglang.srt.batch_overlap.single_batch_overlap
    "deep_gemm_wrapper_entrypoint",  # sglang.srt.layers.deep_gemm_wrapper.entrypoint
    "metrics_collector",  # sglang.srt.observability.metrics_collector
    "deepseek_v2",  # sglang.srt.models.deepseek_v2
    "decode_cuda_graph_runner",  # sglang.srt.model_executor.runner.decode_cuda_graph_runner
)


def _glue(name: str) -> Any:
    return importlib.import_module(f"sglang_overlap.sglang.upstream.{name}")


def all_specs() -> list[HookSpec]:
    """Every hook the plugin installs, module by module."""
    return [spec for name in GLUE_MODULES for spec in _glue(name).HOOKS]


def resolution_specs() -> list[ResolutionSpec]:
    return [spec for name in GLUE_MODULES
            for spec in getattr(_glue(name), "RESOLUTION_HOOKS", ())]


def all_pins() -> list[tuple[str, str]]:
    """(upstream target, fingerprint) of everything the plugin relies on, for the guard."""
    pins = [*SHARED_PINS]
    specs: list[HookSpec | ResolutionSpec] = [*all_specs(), *resolution_specs()]
    for spec in specs:
        pins += spec.pins()
    return list(dict.fromkeys((p.target, p.fingerprint) for p in pins))


_installed: set[tuple[str, str]] = set()
_resolution_installed: set[tuple[str, str]] = set()


def load_through_sglang() -> int:
    """Run SGLang's own plugin loader, as every server process does at start, and return how many
    hooks this plugin has registered (0: it was not discovered or loaded)."""
    from sglang.srt.plugins import load_plugins

    load_plugins()
    return len(_installed)


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


def install_resolution_hooks(specs: Iterable[ResolutionSpec]) -> None:
    """Register each `fn(server_args, previous)` on its SGLang resolution step, once."""
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    for spec in specs:
        key = (spec.step, f"{spec.fn.__module__}.{spec.fn.__qualname__}")
        if key not in _resolution_installed:
            register_resolution_hook(spec.step)(spec.fn)
            _resolution_installed.add(key)
