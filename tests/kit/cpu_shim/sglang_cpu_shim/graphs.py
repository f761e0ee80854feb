"""A stand-in CUDA-graph backend, so SGLang's own `DecodeCudaGraphRunner` runs on a CPU.

On with SGLANG_CPU_SHIM_GRAPHS=1 (and SGLANG_USE_CPU_ENGINE=1). The decode runner of a CPU
server is then upstream's `DecodeCudaGraphRunner` (capture loop over the batch sizes of
`--cuda-graph-max-bs` / `--cuda-graph-bs`, `can_run_graph`, padding to a captured size, the TBO
plugin's `capture_one_batch_size` / `replay_prepare`, the DeepEP adapter) instead of the
torch.compile `CPUGraphRunner`, with `StandInGraphBackend` behind its `BaseCudaGraphBackend`
interface in place of `FullCudaGraphBackend`.

What a capture records, per shape key: the forward callable the runner hands over (it reads the
runner's static input buffers and the capture-time `ForwardBatch`) and the output of the
capture run. `replay` re-runs that callable - so it computes on whatever the runner copied into
the static buffers, exactly the data a CUDA graph reads - and copies the tensors of the new
output into the captured output's tensors, returning the captured output object: the caller
sees the same objects (addresses) every replay, as with a CUDA graph. An input not copied into
a static buffer is therefore not seen by the replay, which shows as wrong tokens.

Where it differs from a CUDA graph: a replay re-runs the Python of the forward, so Python-level
branches are re-decided per replay instead of frozen at capture (a non-tensor leaf of the new
output that differs from the captured one is counted as `python_divergence`); there is no
memory pool and no stream capture. The switches that decide which overlap code a forward runs
are frozen as a graph freezes them: SGLang's `moe.tbo_enabled` / `moe.sbo_enabled` and the
sglang_overlap plugin's step mode are recorded at capture and set to those values while a replay
re-runs, so a replay runs the overlap mode it was captured in, whatever the live switches say.

Counters, per process: with SGLANG_CPU_SHIM_COUNTERS=<dir>, every capture and replay rewrites
`<dir>/graphs-<pid>.json` (see `Counters.snapshot`); each process also logs one line
"cpu_shim graphs: captured N shapes (...)" when its capture loop ends.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

GRAPHS_ENV = "SGLANG_CPU_SHIM_GRAPHS"
COUNTERS_ENV = "SGLANG_CPU_SHIM_COUNTERS"


def enabled() -> bool:
    return os.environ.get(GRAPHS_ENV, "0") == "1"


class Counters:
    """Captures and replays of this process, by shape key (str)."""

    def __init__(self) -> None:
        self.captures: Counter[str] = Counter()
        self.replays: Counter[str] = Counter()
        self.python_divergence = 0
        self.rank: int | None = None

    def snapshot(self) -> dict[str, Any]:
        """{"pid", "rank" (TP rank or null), "captures": {key: n}, "replays": {key: n},
        "python_divergence": n, "deep_ep": the deep_ep stand-in's calls by kind
        (`deep_ep_gloo.COUNTERS`, {} where it is not loaded)}: what `<dir>/graphs-<pid>.json`
        holds."""
        gloo = sys.modules.get("sglang_cpu_shim.deep_ep_gloo")
        deep_ep = dict(gloo.COUNTERS) if gloo is not None else {}
        return {"pid": os.getpid(), "rank": self.rank, "captures": dict(self.captures),
                "replays": dict(self.replays), "python_divergence": self.python_divergence,
                "deep_ep": deep_ep}

    def flush(self) -> None:
        folder = os.environ.get(COUNTERS_ENV)
        if not folder:
            return
        path = Path(folder) / f"graphs-{os.getpid()}.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.snapshot()))
        tmp.replace(path)


COUNTERS = Counters()


def key_name(shape_key: Any) -> str:
    """A shape key as the counters name it: "bs8" for a plain decode key (size 8, no stream,
    LoRA or attention variant), else the key's repr."""
    fields = ("stream_idx", "variant_label", "attention_variant")
    if hasattr(shape_key, "size") and all(getattr(shape_key, f, None) is None for f in fields):
        return f"bs{shape_key.size}"
    return repr(shape_key)


def read_counters(folder: Path) -> list[dict[str, Any]]:
    """Every process's snapshot written under `folder` (for the tests)."""
    return [json.loads(p.read_text()) for p in sorted(Path(folder).glob("graphs-*.json"))]


def _copy_into(captured: Any, new: Any, path: str = "out") -> int:
    """Copy the tensors of `new` into those of `captured` (same structure); returns how many
    non-tensor leaves differ. A tensor of another shape or dtype is an error: a CUDA graph
    cannot produce it."""
    if isinstance(captured, torch.Tensor):
        if not isinstance(new, torch.Tensor) or new.shape != captured.shape or (
                new.dtype != captured.dtype):
            raise RuntimeError(f"cpu_shim graph replay: {path} is {type(new).__name__} "
                               f"{getattr(new, 'shape', '')}, captured {tuple(captured.shape)} "
                               f"{captured.dtype}")
        if new.data_ptr() != captured.data_ptr():
            captured.copy_(new)
        return 0
    if isinstance(captured, list | tuple):
        if not isinstance(new, list | tuple) or len(new) != len(captured):
            return 1
        return sum(_copy_into(c, n, f"{path}[{i}]")
                   for i, (c, n) in enumerate(zip(captured, new, strict=True)))
    if isinstance(captured, dict):
        if not isinstance(new, dict) or new.keys() != captured.keys():
            return 1
        return sum(_copy_into(captured[k], new[k], f"{path}[{k!r}]") for k in captured)
    if hasattr(captured, "__dict__") and type(new) is type(captured):
        return sum(_copy_into(v, getattr(new, k, None), f"{path}.{k}")
                   for k, v in vars(captured).items())
    try:
        return int(bool(captured != new))
    except (RuntimeError, TypeError, ValueError):
        return 1


def _overlap_switches() -> tuple[Any, ...]:
    """(moe.tbo_enabled, moe.sbo_enabled, the plugin's step decision) now; None where absent."""
    try:
        from sglang.srt.runtime_context import get_flags

        moe = get_flags().moe
        flags: tuple[Any, ...] = (moe.tbo_enabled, moe.sbo_enabled)
    except Exception:  # noqa: BLE001 - no SGLang runtime context (unit tests)
        flags = (None, None)
    try:
        from sglang_overlap.sglang import state
    except ImportError:
        return (*flags, None)
    return (*flags, state.decision())


@contextlib.contextmanager
def _switches_set_to(frozen: tuple[Any, ...]) -> Iterator[None]:
    """Set the overlap switches to `frozen` (from `_overlap_switches`) for the block: a replay
    runs as its capture did, whatever the step's own decision (a CUDA graph bakes them in)."""
    tbo, sbo, decision = frozen
    flags = None
    if tbo is not None:
        from sglang.srt.runtime_context import get_flags

        flags = get_flags().moe
        saved = flags.tbo_enabled, flags.sbo_enabled
        flags.tbo_enabled, flags.sbo_enabled = tbo, sbo
    try:
        try:
            from sglang_overlap.sglang import state
        except ImportError:
            yield
        else:
            with state.step(decision):
                yield
    finally:
        if flags is not None:
            flags.tbo_enabled, flags.sbo_enabled = saved


class StandInGraphBackend:
    """`BaseCudaGraphBackend` for the CPU: capture records, replay re-runs (module docstring).

    Capture mirrors `FullCudaGraphBackend.capture_one`: two warm-up runs (each after a TP
    barrier, then `post_warmup_hook`), then the recorded run."""

    def __init__(self, cuda_graph_runner: Any, *, tp_group: Any = None, tp_rank: int = 0,
                 **_: Any) -> None:
        if tp_group is None:  # in a server: the runner's TP group
            from sglang.srt.runtime_context import get_parallel

            tp_group, tp_rank = get_parallel().tp_group, get_parallel().tp_rank
        self._runner = cuda_graph_runner
        self._tp_group = tp_group
        COUNTERS.rank = int(tp_rank or 0)
        self._forwards: dict[Any, Callable[[], Any]] = {}
        self._outputs: dict[Any, Any] = {}
        self._switches: dict[Any, tuple[Any, ...]] = {}

    @contextlib.contextmanager
    def capture_session(self, stream: Any) -> Iterator[None]:
        tic = time.perf_counter()
        yield
        logger.info("cpu_shim graphs: captured %d shapes (%s) in %.2f s", len(self._forwards),
                    ", ".join(key_name(k) for k in self._forwards), time.perf_counter() - tic)

    def capture_one(self, shape_key: Any, forward_fn: Callable[[], Any],
                    capture_inputs: Any = None,
                    post_warmup_hook: Callable[[], None] | None = None) -> None:
        for _ in range(2):
            self._tp_group.barrier()
            forward_fn()
            if post_warmup_hook is not None:
                post_warmup_hook()
        self._outputs[shape_key] = forward_fn()
        self._forwards[shape_key] = forward_fn
        self._switches[shape_key] = _overlap_switches()
        COUNTERS.captures[key_name(shape_key)] += 1
        COUNTERS.flush()

    def can_run(self, forward_batch: Any, shape_key: Any) -> bool:
        return shape_key in self._forwards

    @contextlib.contextmanager
    def replay_session(self) -> Iterator[None]:
        yield

    def replay(self, shape_key: Any, static_forward_batch: Any, **kwargs: Any) -> Any:
        captured = self._outputs[shape_key]
        with _switches_set_to(self._switches[shape_key]):
            new = self._forwards[shape_key]()
        COUNTERS.python_divergence += _copy_into(captured, new)
        COUNTERS.replays[key_name(shape_key)] += 1
        COUNTERS.flush()
        return captured

    def cleanup(self) -> None:
        self._forwards.clear()
        self._outputs.clear()
        self._switches.clear()


def _capture_decode_graph(orig: Callable[..., Any]) -> Callable[..., Any]:
    def capture_decode_graph(*, model_runner: Any) -> Any:
        if model_runner.device != "cpu":
            return orig(model_runner=model_runner)
        from sglang.srt.model_executor.cuda_graph_config import Backend, Phase
        from sglang.srt.model_executor.model_runner_components import cuda_graph_setup as cgs

        if not model_runner.is_generation or cgs.check_cuda_graph_backend(
                Phase.DECODE, Backend.DISABLED):
            return orig(model_runner=model_runner)
        tic = time.perf_counter()
        runner = model_runner._decode_cuda_graph_runner_cls()(model_runner)
        return cgs.GraphCapture(runner=runner, memory_phase="decode", memory_usage_gb=0,
                                capture_time=time.perf_counter() - tic)

    capture_decode_graph._cpu_shim = True  # type: ignore[attr-defined]
    return capture_decode_graph


def _keep_decode_graph(server_args: Any, previous: Callable[[Any], None]) -> None:
    """Resolution step `handle_attention_backend_compatibility` turns decode graphs off for
    torch_native; on the CPU the stand-in backend replays them, so keep decode's backend."""
    from sglang.srt.arg_groups.model_override_base import resolving_view
    from sglang.srt.arg_groups.overrides import declare_resolution
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase, with_phase

    before = resolving_view(server_args).cuda_graph_config.decode.backend
    previous(server_args)
    cfg = resolving_view(server_args)
    if cfg.device == "cpu" and cfg.cuda_graph_config.decode.backend != before:
        declare_resolution(server_args, "_cpu_shim_graphs", cuda_graph_config=with_phase(
            cfg.cuda_graph_config, Phase.DECODE, backend=before))
        assert before != Backend.DISABLED


def _torch_native_graph_methods() -> None:
    """TorchNativeAttnBackend reads its inputs from the ForwardBatch each forward (no captured
    metadata): graph state is nothing, padded rows get seq_len 1 (a one-token attention on the
    padding slot), per-replay metadata is its eager `init_forward_metadata`."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend as B

    def init_cuda_graph_state(self: Any, max_bs: int, max_num_tokens: int) -> None:
        return None

    def get_cuda_graph_seq_len_fill_value(self: Any) -> int:
        return 1

    def init_forward_metadata_out_graph(self: Any, forward_batch: Any,
                                        in_capture: bool = False) -> None:
        B.init_forward_metadata(self, forward_batch)

    B.init_cuda_graph_state = init_cuda_graph_state
    B.get_cuda_graph_seq_len_fill_value = get_cuda_graph_seq_len_fill_value
    B.init_forward_metadata_out_graph = init_forward_metadata_out_graph


def install_resolution() -> None:
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS, register_resolution_hook

    step = "handle_attention_backend_compatibility"
    if _keep_decode_graph not in _HOOKS.get(step, ()):
        register_resolution_hook(step)(_keep_decode_graph)


def install() -> None:
    """Route CPU decode-graph capture to `DecodeCudaGraphRunner` + `StandInGraphBackend`."""
    install_resolution()
    from sglang.srt.model_executor import model_runner as mr
    from sglang.srt.model_executor.model_runner_components import cuda_graph_setup as cgs
    from sglang.srt.model_executor.runner import decode_cuda_graph_runner as dcgr

    if getattr(cgs.capture_decode_graph, "_cpu_shim", False):
        return
    wrapped = _capture_decode_graph(cgs.capture_decode_graph)
    cgs.capture_decode_graph = mr.capture_decode_graph = wrapped
    orig_resolve = dcgr.resolve_decode_backend

    def resolve_decode_backend(cuda_graph_runner: Any) -> Any:
        if cuda_graph_runner.model_runner.device != "cpu":
            return orig_resolve(cuda_graph_runner)
        return StandInGraphBackend(cuda_graph_runner)

    dcgr.resolve_decode_backend = resolve_decode_backend
    orig_graph_capture = dcgr.graph_capture

    @contextlib.contextmanager
    def graph_capture(stream: Any = None) -> Iterator[Any]:
        if not torch.cuda.is_available():  # the CPU: no capture stream, no PyNccl to switch
            from sglang.srt.distributed.parallel_state import GraphCaptureContext

            yield GraphCaptureContext(torch.cpu.current_stream())
            return
        with orig_graph_capture(stream=stream) as context:
            yield context

    dcgr.graph_capture = graph_capture
    dcgr.get_or_create_global_graph_capture_stream = lambda: None
    if not hasattr(torch.cpu, "is_current_stream_capturing"):  # nothing is stream-captured
        torch.cpu.is_current_stream_capturing = lambda: False  # type: ignore[attr-defined]
    _torch_native_graph_methods()
