"""Hooks on `sglang.srt.model_executor.runner.decode_cuda_graph_runner`: one decode graph set
per overlap mode, so that every decode step in the captured range replays the mode the mode
selector (--overlap-gating auto) chose.

Upstream captures one set: with TBO on, TBO graphs only, replayed only when the step can run TBO
(`can_run_graph`), so a step the selector runs without TBO would fall out of its graph. With the
selector on, `DecodeCudaGraphRunner` (never a draft model's) captures every batch size once per
graph mode (`graph_modes`: TBO if on, SBO if on, and none), each inside a step decided for that
mode (`state.step`) and under SGLang's own switches for it (`state.upstream_flags`: the TBO plugin
splits only in the TBO capture, SBO's hooks run only in the SBO capture, `deepseek_v2.py`), keyed
by `ShapeKey.variant_label` (`mode_label`). Capture time and graph memory grow by the number of
graph modes (at most 3); --cuda-graph-max-bs bounds both, as upstream.

* `capture_one_shape` (around): capture the shape once per graph mode.
* `_make_graph_key` (around): the key names the mode of the step's decision (`state.decision`):
  the mode being captured, or the mode the step runs.
* `can_run_graph` / `execute` (around): the step's decision picks the set; the runner's TBO switch
  follows it, so a step not in TBO replays without the TBO split. SGLang asking outside a step of
  the served model (a speculative worker checking the target's runner) gets SGLang's own rule for
  that batch (`state.sglang_rule`).

A decode step in the captured range that runs eager anyway is counted
(`stats.add("eager_fallbacks", mode, reason)`) and logged once per (mode, reason).

Refused at capture, before any graph exists (a SettingsError naming the fix):

* a decode attention backend that builds new state for every capture of a batch size
  (`PER_CAPTURE_STATE`: FlashInfer MLA and its subclasses TRT-LLM MLA and CuteDSL MLA keep the
  last capture's wrapper / `seq_lens_k` in `decode_cuda_graph_metadata[bs]`, so the graphs of the
  modes captured first would read stale or freed memory); triton, fa3/fa4 and flashmla write one
  set of buffers allocated once and are safe;
* a further mode's graphs that would leave less free GPU memory than the activations' reserve
  (`memory_floor`): SGLang sizes the KV pool before capture, so every set comes out of the same
  slack (`check_memory` measures the first set's cost per batch size and refuses with the
  numbers).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from typing import Any

from sglang_overlap import stats
from sglang_overlap.modes import GRAPH_ORDER, Feature, Mode, Phase, StepDecision
from sglang_overlap.settings import OverlapSettings, SettingsError
from sglang_overlap.sglang import state
from sglang_overlap.sglang.hooks import HookSpec

logger = logging.getLogger("sglang_overlap")

RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner"
CAPTURE_ONE_SHAPE = f"{RUNNER}.capture_one_shape"
MAKE_GRAPH_KEY = f"{RUNNER}._make_graph_key"
CAN_RUN_GRAPH = f"{RUNNER}.can_run_graph"
EXECUTE = f"{RUNNER}.execute"

MODES_ATTR = "_sglang_overlap_graph_modes"  # set on a runner whose graphs are per mode
_logged: set[tuple[Mode, str]] = set()


def graph_modes(s: OverlapSettings) -> tuple[Mode, ...]:
    """The decode modes captured as graph sets, largest first (`modes.GRAPH_ORDER`); () where
    upstream's single set serves (no mode selector, or nothing to select)."""
    if s.overlap_gating != "auto":
        return ()
    modes = tuple(m for m in GRAPH_ORDER if m == Mode.NONE or m in s.enabled_modes)
    return modes if len(modes) > 1 else ()


def mode_label(label: str | None, mode: Mode) -> str:
    """`ShapeKey.variant_label` of `mode`'s graph (upstream's label, e.g. LoRA's, kept)."""
    return f"{label}+overlap:{mode}" if label else f"overlap:{mode}"


def runner_modes(runner: Any) -> tuple[Mode, ...]:
    """The graph modes `runner` captures (cached on it): () for a draft model's runner."""
    modes = runner.__dict__.get(MODES_ATTR)
    if modes is None:
        draft = bool(getattr(runner.model_runner, "is_draft_worker", False))
        modes = () if draft else graph_modes(state.settings())
        if len(modes) > 1:
            check_attention_state(runner.attn_backend, modes)
        runner.__dict__[MODES_ATTR] = modes
    return tuple(modes)


# Decode attention backends (and their subclasses) that rebuild per-batch-size state at each
# capture instead of writing buffers allocated once (the supported SGLang: flashinfer_mla_backend.py
# `init_forward_metadata_out_graph` makes a new wrapper per capture; trtllm_mla_backend.py a new
# `seq_lens_k`; CuteDslMLABackend subclasses TRTLLMMLABackend, which subclasses this one)
PER_CAPTURE_STATE = ("FlashInferMLAAttnBackend",)


def attention_backends(backend: Any) -> list[Any]:
    """The backends that run decode attention: `backend` itself, or what SGLang's wrappers hold
    (TboAttnBackend: primary and children; HybridAttnBackend: its decode backend)."""
    if hasattr(backend, "primary") and hasattr(backend, "children"):
        return [b for child in (backend.primary, *backend.children)
                for b in attention_backends(child)]
    if hasattr(backend, "decode_backend"):
        return attention_backends(backend.decode_backend)
    return [backend]


def check_attention_state(backend: Any, modes: tuple[Mode, ...]) -> None:
    """Raise SettingsError where a decode attention backend keeps only its last capture's state
    per batch size (`PER_CAPTURE_STATE`), which one graph set per mode cannot share."""
    for b in attention_backends(backend):
        bad = next((c.__name__ for c in type(b).__mro__ if c.__name__ in PER_CAPTURE_STATE), None)
        if bad is not None:
            raise SettingsError(
                f"sglang-overlap: --overlap-gating auto with decode CUDA graphs captures each "
                f"batch size once per overlap mode ({', '.join(modes)}), but the decode attention "
                f"backend {type(b).__name__} ({bad}) rebuilds its per-batch-size state at every "
                f"capture, so the graphs of all but the last mode would read stale memory. Use "
                f"--decode-attention-backend triton, fa3 or flashmla (or --attention-backend), "
                f"or --disable-decode-cuda-graph, or drop --overlap-gating auto")


GIB = 1 << 30


def memory_floor() -> int:
    """Free GPU bytes that must remain after a graph set: SGLang's own activation reserve when it
    chooses --mem-fraction-static (512 MB + 1.5 MB per --chunked-prefill-size token, at least
    2048 tokens; SGLang's arg_groups/memory_hook.py), so a prefill after capture still fits."""
    from sglang.srt.runtime_context import get_schedule

    chunk = int(get_schedule().chunked_prefill_size or 0)
    return int((512 + 1.5 * max(chunk, 2048)) * (1 << 20))


def check_memory(free: int, set_cost: int, floor: int, *, mode: Mode, bs: int, max_bs: int,
                 modes: tuple[Mode, ...]) -> None:
    """Refuse (SettingsError, with the numbers) to capture `mode`'s graph for batch size `bs` when
    `free` bytes minus `set_cost` (what this batch size's first set took) would leave less than
    `floor` free."""
    if free - set_cost >= floor:
        return
    raise SettingsError(
        f"sglang-overlap: the {mode} decode graph of batch size {bs} does not fit: "
        f"{free / GIB:.2f} GiB free, one graph set of this size took {set_cost / GIB:.2f} GiB, and "
        f"{floor / GIB:.2f} GiB must stay free for activations. --overlap-gating auto captures "
        f"{len(modes)} sets ({', '.join(modes)}) up to --cuda-graph-max-bs-decode {max_bs}: lower "
        f"it, or lower --mem-fraction-static so that {(floor - free + set_cost) / GIB:.2f} GiB "
        f"more stay free")


def _free_bytes() -> int | None:
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info()[0])


def step_graph_decision(forward_batch: Any) -> StepDecision:
    """The decision whose graph set a batch replays: the step's (`state.decision`), or, asked
    outside a step of the served model, SGLang's own rule for the batch."""
    d = state.decision()
    if d is not None:
        return d
    return state.sglang_rule(forward_batch)


@contextlib.contextmanager
def _as_step(runner: Any, decision: StepDecision, *, capture: bool = False) -> Iterator[None]:
    """The runner (and, in capture, SGLang's TBO/SBO switches) as `decision`'s mode, inside
    `decision`'s step (which `make_graph_key` reads)."""
    mode, saved_tbo = decision.mode, runner.enable_two_batch_overlap
    runner.enable_two_batch_overlap = saved_tbo and mode == Mode.TBO
    flags: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
    if capture:
        flags = state.upstream_flags(tbo=mode == Mode.TBO if saved_tbo else None,
                                     sbo=mode == Mode.SBO if mode != Mode.TBO else None)
    try:
        with flags, state.step(decision):
            yield
    finally:
        runner.enable_two_batch_overlap = saved_tbo


def capture_one_shape(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    modes = runner_modes(self)
    if not modes:
        return orig(self, *args, **kwargs)
    out, before, cost = None, _free_bytes(), 0
    for i, mode in enumerate(modes):
        free = _free_bytes()
        if i == 1 and before is not None and free is not None:
            cost = max(before - free, 0)
        if i >= 1 and free is not None:
            check_memory(free, cost, memory_floor(), mode=mode, bs=_batch_size(args, kwargs),
                         max_bs=int(self.max_bs), modes=modes)
        capture = StepDecision(mode, Phase.DECODE, why="graph capture", source="capture")
        with _as_step(self, capture, capture=True):
            out = orig(self, *args, **kwargs)
    return out


def _batch_size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """`capture_one_shape(size, forward, ...)`'s batch size (for messages)."""
    bs = kwargs.get("size", args[0] if args else -1)
    return int(bs) if isinstance(bs, int) else -1


def make_graph_key(orig: Any, self: Any, *args: Any, **kwargs: Any) -> Any:
    key = orig(self, *args, **kwargs)
    d = state.decision()
    if d is None or not runner_modes(self):
        return key
    return dataclasses.replace(key, variant_label=mode_label(key.variant_label, d.mode))


def can_run_graph(orig: Any, self: Any, forward_batch: Any) -> bool:
    modes = runner_modes(self)
    if not modes:
        return bool(orig(self, forward_batch))
    decision = step_graph_decision(forward_batch)
    with _as_step(self, decision):
        ok = bool(orig(self, forward_batch))
    if not ok and forward_batch.forward_mode.is_decode():
        _fallback(self, forward_batch, decision.mode)
    return ok


def execute(orig: Any, self: Any, forward_batch: Any, *args: Any, **kwargs: Any) -> Any:
    modes = runner_modes(self)
    if not modes:
        return orig(self, forward_batch, *args, **kwargs)
    with _as_step(self, step_graph_decision(forward_batch)):
        return orig(self, forward_batch, *args, **kwargs)


def _fallback(runner: Any, forward_batch: Any, mode: Mode) -> None:
    """Count (and log once) a decode step in the captured range that will run eager."""
    if forward_batch.batch_size > runner.max_bs:
        return  # above --cuda-graph-max-bs: eager by configuration, as upstream
    reason = fallback_reason(runner, forward_batch)
    stats.add("eager_fallbacks", mode, reason)
    if (mode, reason) not in _logged:
        _logged.add((mode, reason))
        logger.warning("sglang-overlap: a %s decode step of batch size %d runs eager inside the "
                       "captured range (--cuda-graph-max-bs %d): %s (logged once)", mode,
                       forward_batch.batch_size, runner.max_bs, reason)


def fallback_reason(runner: Any, forward_batch: Any) -> str:
    """Why upstream's `can_run_graph` refused a batch within --cuda-graph-max-bs."""
    if forward_batch.replace_embeds is not None:
        return "embedding_override"
    if runner.require_mlp_sync and not forward_batch.can_run_decode_cuda_graph:
        return "a_dp_rank_cannot_replay"
    if forward_batch.lora_ids is not None:
        return "lora"
    return "upstream_refused"


HOOKS: tuple[HookSpec, ...] = (
    HookSpec(CAPTURE_ONE_SHAPE, capture_one_shape, "around",
             "--overlap-gating auto: capture each decode shape once per overlap mode",
             "src:1b06a732620c", feature=Feature.GATE),
    HookSpec(MAKE_GRAPH_KEY, make_graph_key, "around",
             "--overlap-gating auto: a graph key names the mode of the step's decision",
             "src:0e1925a77c08",
             feature=Feature.GATE),
    HookSpec(CAN_RUN_GRAPH, can_run_graph, "around",
             "--overlap-gating auto: a step replays its mode's graph (not only TBO ones)",
             "src:fa22154437e3", feature=Feature.GATE),
    HookSpec(EXECUTE, execute, "around",
             "--overlap-gating auto: replay the step's mode's graph", "src:5b4ef7f1439a",
             feature=Feature.GATE),
)
