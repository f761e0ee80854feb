"""Compile the plugin's Triton kernels ahead of time, on a machine without a GPU, exactly as a
launch would (tests/kernels/test_triton_aot.py).

A launch is recorded, not run: the real launcher (`down_gemm.signal_down_gemm`,
`signal_sliced.write_slice_signal`, `fp8.silu_and_mul_quant`) is called on fake CUDA tensors
(torch's FakeTensorMode: shapes, strides and dtypes, no memory), with its module's kernel cache
holding a `Recorder` in place of the `triton.jit` function. The recorded arguments then go
through triton's own launch binder for the target GPU (`create_function_from_signature` and
`JITFunction._pack_args`, what `JITFunction.run` calls), so each compile has the signature,
constexprs, divisibility attributes and options a launch on that GPU would have, and
`triton.compile` builds it with triton's bundled ptxas. Base allocations count as 16-byte aligned
(CUDA's allocator gives 256 bytes); a view's offset is kept.

The shapes the launches are made for come from the data the plugin serves from: the shipped
producer tables (`producer-<GPU>.json`: tiles, warps, stages, fused / sliced choices), the shipped
model profiles (hidden and MoE intermediate sizes) and the signal layouts of both DeepEP combine
forms (`down_gemm.combine_signal_layout`); the producer of each shape is `choose_signal_path`'s.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

PACKAGE = Path(__file__).resolve().parents[2] / "sglang_overlap"

TARGETS = {"sm_90a": ("cuda", 90, 32)}
"""(backend, capability, warp size) per target. Every kernel the plugin ships runs on Hopper
only: SBO's producers and the DeepGEMM expert runner are the SM90 path; on SM100 SGLang's own
Blackwell SBO runs (`planning/sbo_path.py`), so no kernel claims sm_100a."""

# the launch grid the enumeration covers, besides the shipped tables and profiles
EXPERTS = (1, 4, 8, 16, 32, 64)  # local experts per rank
DISPATCH = ((128, 8), (256, 16), (24, 2), (5, 2), (1, 1))  # (tokens per rank, ranks): capacity
NUM_SMS, COMM_SMS = 132, 3
TOKENS = tuple(range(1, 67)) + (255, 256, 1000, 4096)  # rows of the contiguous layout


@dataclass(frozen=True)
class Pointer:
    """What a launch reads of a tensor argument: its dtype and where its data starts."""

    dtype: torch.dtype
    offset: int  # bytes from a 16-byte aligned allocation

    def data_ptr(self) -> int:
        return self.offset

    def ptr_range(self) -> int:
        return 0


@dataclass(frozen=True)
class Launch:
    """One recorded `kernel[grid](*args, **kwargs)`."""

    kernel: str  # "<module>.<function>", as `shipped_kernels` names it
    fn: Any = field(repr=False, compare=False)  # the triton.jit function
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]


def kernel_name(fn: Any) -> str:
    return f"{fn.fn.__module__}.{fn.fn.__name__}"


class Recorder:
    """Stands in for a `triton.jit` function in a kernel cache: `rec[grid](*args, **kwargs)`
    records the launch (tensors as `Pointer`s) instead of running it."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.launches: list[Launch] = []

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.launches.append(Launch(kernel_name(self.fn), self.fn, tuple(map(_arg, args)),
                                        tuple(sorted(kwargs.items()))))
        return launch


def _arg(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return Pointer(value.dtype, int(value.storage_offset()) * value.element_size())
    return value


@dataclass(frozen=True)
class Specialisation:
    """What triton compiles for one launch on one target (equal launches compile once)."""

    kernel: str
    target: str
    signature: tuple[tuple[str, Any], ...]
    constexprs: tuple[tuple[Any, Any], ...]
    attrs: tuple[tuple[Any, Any], ...]
    options: tuple[tuple[str, Any], ...]
    fn: Any = field(repr=False, compare=False)

    def describe(self) -> str:
        consts = {self.fn.arg_names[k[0]]: v for k, v in self.constexprs}
        opts = dict(self.options)
        return (f"{self.kernel} [{self.target}] constexprs {consts} num_warps "
                f"{opts.get('num_warps')} num_stages {opts.get('num_stages')} "
                f"signature {dict(self.signature)} attrs {dict(self.attrs)}")


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def specialise(launch: Launch, target: str) -> Specialisation:
    """The compile `launch` makes on `target`, through triton's own launch binder."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    fn = launch.fn
    backend = make_backend(GPUTarget(*TARGETS[target]))
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(launch.kwargs)
    bound, spec, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = _pack(fn, backend, kwargs, bound, spec, options)
    return Specialisation(launch.kernel, target, tuple(signature.items()),
                          tuple(sorted(constexprs.items())),
                          tuple(sorted((k, _freeze(v)) for k, v in attrs.items())),
                          tuple(sorted((k, _freeze(v)) for k, v in options.__dict__.items())),
                          fn)


def _pack(fn: Any, backend: Any, kwargs: dict[str, Any], bound: Any, spec: Any,
          options: Any) -> tuple[Any, dict[str, Any], dict[Any, Any], dict[Any, Any]]:
    """`JITFunction._pack_args` (triton >= 3.5); before, the same steps inline in `run`."""
    if hasattr(fn, "_pack_args"):
        packed: tuple[Any, dict[str, Any], dict[Any, Any], dict[Any, Any]] = fn._pack_args(
            backend, kwargs, bound, spec, options)
        return packed
    from triton._utils import find_paths_if, get_iterable_path

    sigvals = [x[0] for x in spec]
    signature = dict(zip([p.name for p in fn.params], sigvals, strict=True))
    constexprs = {path: get_iterable_path(list(bound.values()), path)
                  for path in find_paths_if(sigvals, lambda _, val: val == "constexpr")}
    attrvals = [x[1] for x in spec]
    attrs = {k: backend.parse_attr(get_iterable_path(attrvals, k))
             for k in find_paths_if(attrvals, lambda _, x: isinstance(x, str))}
    return backend.parse_options(kwargs), signature, constexprs, attrs


def compile_specialisation(spec: Specialisation) -> Any:
    """`triton.compile` of `spec` for its target (raises what triton raises)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    attrs = {k: [list(a) for a in v] for k, v in spec.attrs}
    source = ASTSource(spec.fn, dict(spec.signature), dict(spec.constexprs), attrs)
    return triton.compile(source, target=GPUTarget(*TARGETS[spec.target]),
                          options=dict(spec.options))


def unique(launches: list[Launch]) -> list[Specialisation]:
    """The distinct compiles of `launches` on every target, in first-seen order."""
    return list(dict.fromkeys(specialise(launch, t) for launch in launches for t in TARGETS))


# ------------------------------------------------------------------ what the plugin launches


@contextlib.contextmanager
def recording(cache: dict[str, Any] | None, key: str, fn: Any,
              module: Any = None) -> Iterator[Recorder]:
    """`fn`'s slot in a kernel cache (a dict entry, or a module attribute when `cache` is None)
    holds a Recorder for the block."""
    rec = Recorder(fn)
    if cache is not None:
        old = cache.get(key)
        cache[key] = rec
    else:
        old = getattr(module, key)
        setattr(module, key, rec)
    try:
        yield rec
    finally:
        if cache is not None:
            cache[key] = old
        else:
            setattr(module, key, old)


@contextlib.contextmanager
def producer_tables(gpu: str) -> Iterator[None]:
    """`gpu`'s shipped producer tables serve, the patched DeepGEMM producer counts as
    unavailable (the case where the Triton producers serve) and the fused one as built (what
    it launches is recorded whatever the installed triton; whether it builds is the test)."""
    from sglang_overlap.kernels import down_gemm, gpu_tables

    old_env = os.environ.get(gpu_tables.TABLE_ENV)
    old_dg = list(down_gemm._DG_SIGNAL_UNAVAILABLE)
    old_fused = list(down_gemm._FUSED_UNAVAILABLE)
    os.environ[gpu_tables.TABLE_ENV] = gpu
    gpu_tables.reset()
    down_gemm._DG_SIGNAL_UNAVAILABLE[:] = ["AOT compile: the Triton producers serve"]
    down_gemm._FUSED_UNAVAILABLE[:] = [""]
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop(gpu_tables.TABLE_ENV, None)
        else:
            os.environ[gpu_tables.TABLE_ENV] = old_env
        gpu_tables.reset()
        down_gemm._DG_SIGNAL_UNAVAILABLE[:] = old_dg
        down_gemm._FUSED_UNAVAILABLE[:] = old_fused


@dataclass(frozen=True)
class Shape:
    """One served SBO down GEMM: the model's sizes, the rank's experts and DeepEP's buffer."""

    hidden: int
    inter: int
    experts: int
    dispatch: int  # num_max_dispatch_tokens_per_rank
    world: int
    expected_m: int
    form: str


def _models() -> list[tuple[int, int]]:
    from sglang_overlap.planning.cost.profiles import MODEL_NAMES, load_model

    return sorted({(m.hidden, m.moe_intermediate) for m in map(load_model, MODEL_NAMES)})


def _rows(gpu: str) -> list[int]:
    """A rows-per-expert value in each bucket of `gpu`'s fused and fallback tables, and past
    the last bound."""
    from sglang_overlap.planning.producer_tables import load_producer_tables

    tables = load_producer_tables(gpu)
    bounds = sorted(set(tables.fused.rows) | set(tables.fallback.rows))
    return sorted({1, *bounds, *(b + 1 for b in bounds)})


def served_shapes(gpu: str) -> Iterator[Shape]:
    for (hidden, inter), e, (n, w), rows, form in itertools.product(
            _models(), EXPERTS, DISPATCH, _rows(gpu), ("per_block", "per_expert")):
        yield Shape(hidden, inter, e, n, w, rows, form)


def _layout(s: Shape) -> Any:
    from sglang_overlap.kernels.down_gemm import combine_signal_layout

    return combine_signal_layout(s.form, num_local_experts=s.experts,  # type: ignore[arg-type]
                                 world_size=s.world, num_max_dispatch_tokens_per_rank=s.dispatch,
                                 num_tokens=s.dispatch, hidden=s.hidden,
                                 expected_m=s.expected_m, num_sms=NUM_SMS, comm_num_sms=COMM_SMS)


def _operands(s: Shape, capacity: int, mn_major: bool) -> tuple[torch.Tensor, ...]:
    """Fake CUDA operands of the down GEMM `[E, C, K] x [E, N, K] -> [E, C, N]` (K = inter,
    N = hidden): activation scales row-major or MN-major TMA-aligned, as the contract allows."""
    from sglang_overlap.kernels import fp8

    e, k, n = s.experts, s.inter, s.hidden
    a_scale = (fp8.empty_mn_major_scales((e,), capacity, k // 128, "cuda") if mn_major else
               torch.empty((e, capacity, k // 128), dtype=torch.float32, device="cuda"))
    return (torch.empty((e, capacity, k), dtype=fp8.FP8, device="cuda"), a_scale,
            torch.empty((e, n, k), dtype=fp8.FP8, device="cuda"),
            torch.empty((e, -(-n // 128), k // 128), dtype=torch.float32, device="cuda"),
            torch.empty((e, capacity, n), dtype=torch.bfloat16, device="cuda"),
            torch.empty((e,), dtype=torch.int32, device="cuda"))


def sbo_launches(gpus: list[str]) -> tuple[list[Launch], list[Launch]]:
    """(the fused producer's launches, the sliced producer's signal stores) over every served
    shape of each GPU's tables: `signal_down_gemm` with the plan `choose_signal_path` picks
    (fused), and every slice of the sliced plans (theirs and the runtime's fallback, E / 4 on
    two streams) through `write_slice_signal`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sglang_overlap.kernels import signal_fused, signal_sliced
    from sglang_overlap.kernels.down_gemm import choose_signal_path, signal_down_gemm
    from sglang_overlap.kernels.signals import new_signal

    fused_fn = signal_fused._kernels()["gemm"]
    store_fn = signal_sliced._store_signal_kernel()
    with (recording(signal_fused._KERNELS, "gemm", fused_fn) as fused,
          recording(signal_sliced._KERNELS, "store_signal", store_fn) as stores,
          FakeTensorMode(allow_non_fake_inputs=True)):
        for gpu in gpus:
            with producer_tables(gpu):
                for s in served_shapes(gpu):
                    layout = _layout(s)
                    plan = choose_signal_path(s.experts, s.expected_m, layout.capacity)
                    signal = new_signal(layout, "cuda")
                    if plan.path == "fused":
                        for mn_major in (False, True):
                            a, a_scale, b, b_scale, out, masked_m = _operands(
                                s, layout.capacity, mn_major)
                            signal_down_gemm(a, a_scale, b, b_scale, out, masked_m,
                                             s.expected_m, signal=signal, layout=layout,
                                             plan=plan)
                    sizes = {max(1, s.experts // 4)} | (
                        {plan.slice_experts} if plan.path == "sliced" else set())
                    for size in sorted(sizes):
                        for start, end in signal_sliced.plan_expert_slices(s.experts, size):
                            signal_sliced.write_slice_signal(signal, layout, start, end)
    return fused.launches, stores.launches


def silu_quant_launches() -> list[Launch]:
    """`fp8.silu_and_mul_quant` as the DeepGEMM expert runner calls it
    (`deepgemm.run_masked_experts` / `run_contiguous_experts`): every shipped model's
    intermediate size, the masked layout `[E, C, 2I]` over the served capacities and the
    contiguous layout `[T, 2I]` over `TOKENS` rows."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from sglang_overlap.kernels import fp8

    with (recording(None, "_KERNEL", fp8._build_kernel(), module=fp8) as rec,
          FakeTensorMode(allow_non_fake_inputs=True)):
        for _, inter in _models():
            for e, (n, w) in itertools.product(EXPERTS, DISPATCH):
                up = torch.empty((e, n * w, 2 * inter), dtype=torch.bfloat16, device="cuda")
                fp8.silu_and_mul_quant(up, torch.empty((e,), dtype=torch.int32, device="cuda"))
            for t in TOKENS:
                fp8.silu_and_mul_quant(torch.empty((t, 2 * inter), dtype=torch.bfloat16,
                                                   device="cuda"))
    return rec.launches


# ------------------------------------------------------------------ which kernels exist


def shipped_kernels(root: Path = PACKAGE) -> set[str]:
    """"<module>.<function>" of every function under `root` decorated with `triton.jit` (read
    from the source, nothing imported)."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                    _is_triton_jit(d) for d in node.decorator_list):
                found.add(f"{module}.{node.name}")
    return found


def _is_triton_jit(node: ast.expr) -> bool:
    target = node.func if isinstance(node, ast.Call) else node
    return ast.unparse(target) in ("triton.jit", "jit", "tl.jit")
