"""Operand checks and the launch of the patched kernel (compiled and loaded once per
instantiation and process, launched on the current torch stream; CUDA graphs capture it).

Legend: E local experts, C capacity rows per expert, K reduction dim, N output dim (hidden).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import TYPE_CHECKING

from sglang_overlap.kernels.signal_deepgemm.build import compile_cubin, kernel_source
from sglang_overlap.kernels.signal_deepgemm.configs import (
    BLOCK_K,
    DgSignalConfig,
    SignalMode,
    swizzle_mode,
)
from sglang_overlap.kernels.signal_deepgemm.driver import (
    BFLOAT16,
    FLOAT32,
    UINT8,
    driver,
    tensor_map,
)
from sglang_overlap.kernels.signal_deepgemm.headers import Source, locate, prepared_include

if TYPE_CHECKING:
    import torch

    from sglang_overlap.planning.sbo_layout import SboLayout

_FUNCS: dict[tuple[object, ...], int] = {}
_SOURCE: list[tuple[Source, Path]] = []  # the installed release and its patched include folder


def _source() -> tuple[Source, Path]:
    if not _SOURCE:
        source = locate()
        _SOURCE.append((source, prepared_include(source)))
    return _SOURCE[0]


def kernel(config: DgSignalConfig, *, device: int, num_groups: int, n: int, k: int,
           num_sms: int, mode: SignalMode, unit_m: int) -> int:
    """The loaded CUfunction for this instantiation (compiled and loaded once per process)."""
    key = (device, config, num_groups, n, k, num_sms, mode, unit_m)
    func = _FUNCS.get(key)
    if func is None:
        source, include = _source()
        text = kernel_source(config, release=source.spec, num_groups=num_groups, n=n, k=k,
                             num_sms=num_sms, mode=mode, unit_m=unit_m)
        cubin = compile_cubin(text, include)
        func = driver().load_kernel(cubin.read_bytes(), config.smem(k, mode != "none"))
        _FUNCS[key] = func
    return func


def device_index(device: torch.device | int) -> int:
    """A CUDA device's index (the current device for a bare `cuda`)."""
    import torch

    if isinstance(device, int):
        return device
    return device.index if device.index is not None else torch.cuda.current_device()


def load(config: DgSignalConfig, layout: SboLayout | None, *, num_groups: int, n: int, k: int,
         num_sms: int, device: torch.device | int) -> int:
    """The CUfunction counting `layout`'s units (None: signals off), compiled and loaded on
    `device` once per process. Loading a module waits for the device to go idle: call this
    before a combine send can spin on the signal (`down_gemm.prepare_signal_down_gemm`)."""
    import torch

    mode, unit_m = layout_mode(layout, config, n)
    index = device_index(device)
    with torch.cuda.device(index):
        return kernel(config, device=index, num_groups=num_groups, n=n, k=k, num_sms=num_sms,
                      mode=mode, unit_m=unit_m)




def check_operands(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                   b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                   config: DgSignalConfig) -> tuple[int, int, int, int]:
    """(E, C, N, K) of `[E, C, K] x [E, N, K] -> [E, C, N]`; ValueError naming what is off.
    `a_scale` may have any strides (`mn_major_scales` re-lays it out)."""
    import torch

    if a.dim() != 3 or b.dim() != 3 or out.dim() != 3:
        raise ValueError(f"need a [E, C, K], b [E, N, K], out [E, C, N] (got {tuple(a.shape)}, "
                         f"{tuple(b.shape)}, {tuple(out.shape)})")
    e, c, k = a.shape
    n = b.shape[1]
    if b.shape != (e, n, k) or out.shape != (e, c, n):
        raise ValueError(f"shapes do not match [E, C, K] x [E, N, K] -> [E, C, N] (got "
                         f"{tuple(a.shape)}, {tuple(b.shape)}, {tuple(out.shape)})")
    if k % BLOCK_K or n % 16:
        raise ValueError(f"need K % 128 == 0 and N % 16 == 0 (got K={k}, N={n})")
    if c % config.block_m:
        raise ValueError(f"capacity {c} is not a multiple of block_m {config.block_m}: a tile's "
                         "store would cross into the next expert")
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise ValueError(f"a and b must be float8_e4m3fn (got {a.dtype}, {b.dtype})")
    if out.dtype != torch.bfloat16:
        raise ValueError(f"out must be bfloat16 (got {out.dtype})")
    if not (a.is_contiguous() and b.is_contiguous() and out.is_contiguous()):
        raise ValueError("a, b and out must be contiguous")
    if a_scale.dtype != torch.float32 or b_scale.dtype != torch.float32:
        raise ValueError(f"scales must be float32 (got {a_scale.dtype}, {b_scale.dtype})")
    groups = k // BLOCK_K
    if a_scale.shape != (e, c, groups):
        raise ValueError(f"a_scale must be [E, C, K/128] = {(e, c, groups)} (got "
                         f"{tuple(a_scale.shape)})")
    if b_scale.shape != (e, -(-n // BLOCK_K), groups) or not b_scale.is_contiguous():
        raise ValueError(f"b_scale must be a contiguous [E, ceil(N/128), K/128] = "
                         f"{(e, -(-n // BLOCK_K), groups)} (got {tuple(b_scale.shape)})")
    if masked_m.shape != (e,) or masked_m.dtype != torch.int32:
        raise ValueError(f"masked_m must be int32 [E] = ({e},) (got {masked_m.dtype} "
                         f"{tuple(masked_m.shape)})")
    for name, t in (("a", a), ("a_scale", a_scale), ("b", b), ("b_scale", b_scale),
                    ("out", out), ("masked_m", masked_m)):
        if t.device != a.device or t.device.type != "cuda":
            raise ValueError(f"{name} must be on a's CUDA device (got {t.device})")
    return e, c, n, k


def mn_major_scales(a_scale: torch.Tensor) -> torch.Tensor:
    """`a_scale` `[E, C, G]` in the layout the kernel's TMA reads: C contiguous, padded to 4
    rows (DeepGEMM's MN-major TMA-aligned layout; `fp8.silu_and_mul_quant` writes it so). Other
    strides are copied into it (one small kernel), as DeepGEMM itself does."""
    from sglang_overlap.kernels.fp8 import empty_mn_major_scales, tma_aligned_rows

    e, c, groups = a_scale.shape
    aligned = tma_aligned_rows(c)
    if a_scale.stride() == (groups * aligned, 1, aligned):
        return a_scale
    return empty_mn_major_scales((e,), c, groups, a_scale.device).copy_(a_scale)


def layout_mode(layout: SboLayout | None, config: DgSignalConfig, n: int) -> tuple[SignalMode,
                                                                                 int]:
    """(mode, unit rows) of the kernel for `layout`; ValueError when the layout's final value
    is not what this config's tiles produce."""
    if layout is None:
        return "none", 64
    if layout.block_n != config.block_n or layout.n_tiles != -(-n // config.block_n):
        raise ValueError(f"the SBO layout counts tiles of {layout.block_n} columns, the kernel "
                         f"runs block_n {config.block_n}: lay the signal out with "
                         "down_gemm's plan")
    if layout.granularity == "block":
        if config.block_m % layout.block_m:
            raise ValueError(f"per-block signals of {layout.block_m} rows need block_m a "
                             f"multiple of it (got {config.block_m})")
        return "block", layout.block_m
    if layout.block_m != config.block_m:
        raise ValueError(f"the per-expert layout counts {layout.block_m}-row blocks, the "
                         f"kernel runs block_m {config.block_m}")
    return "expert", 64


def masked_gemm_signal(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                       b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor, *,
                       config: DgSignalConfig, num_sms: int, signal: torch.Tensor | None = None,
                       layout: SboLayout | None = None) -> None:
    """DeepGEMM's SM90 fp8 masked grouped GEMM with the signal patch: `out[e, :masked_m[e]] =
    a[e, :masked_m[e]] @ b[e]^T`, on a persistent grid of `num_sms` CTAs (the other SMs stay
    free for the combine send), launched on the current torch stream; CUDA graphs capture it.
    The kernel is built for the installed deep_gemm release and loaded once per shape and
    process (`load`).

    Arguments:
        a: `torch.Tensor` `[E, C, K]` `torch.float8_e4m3fn`, contiguous, on a CUDA device;
            C a multiple of `config.block_m`, K a multiple of 128.
        a_scale: `torch.Tensor` `[E, C, K / 128]` `torch.float32`, one scale per row per 128
            channels of K; any strides (copied into DeepGEMM's MN-major TMA-aligned layout
            unless already in it, see `mn_major_scales`).
        b: `torch.Tensor` `[E, N, K]` `torch.float8_e4m3fn`, contiguous; N a multiple of 16.
        b_scale: `torch.Tensor` `[E, ceil(N / 128), K / 128]` `torch.float32`, contiguous, one
            scale per 128 x 128 block.
        out: `torch.Tensor` `[E, C, N]` `torch.bfloat16`, contiguous, written in place. Rows
            past masked_m[e] inside a written `block_m` block hold garbage (as with DeepGEMM);
            blocks wholly past masked_m[e] are untouched.
        masked_m: `torch.Tensor` `[E]` `torch.int32`: valid rows per expert, each <= C.
        config: the tile (block_m, block_n, stages, TMA multicast, signal timing);
            `config.check_launch(N, num_sms)` must pass.
        num_sms: CTAs of the persistent grid (>= 1; even with TMA multicast).
        signal: None (no signals), or `torch.Tensor` of `layout.signal_shape` on a's device,
            zeroed (`signals.new_signal(layout)`): `[E * ceil(C / layout.block_m)]` int32 per
            row block (`layout.block_m` divides `config.block_m`) or `[E]` uint32 per expert.
            Every unit reaches `layout.expect_value` exactly once, after the rows it covers are
            in global memory (a gpu-scope release); the units of blocks past masked_m are
            credited at start.
        layout: the `SboLayout` of `signal` (given together with it): E and C as above, the
            units of this config's tiles (`layout_mode`).

    Raises:
        ValueError: operands whose shape, dtype, contiguity or device is off, or a layout that
            does not count this config's tiles (the message names which).
        DgSignalError: the kernel cannot be built or loaded here (no nvcc, a driver error).
    """
    import torch

    e, c, n, k = check_operands(a, a_scale, b, b_scale, out, masked_m, config)
    if signal is not None and layout is not None:
        if tuple(signal.shape) != layout.signal_shape or signal.device != a.device:
            raise ValueError(f"signal must be {layout.signal_shape} on {a.device} (got "
                             f"{tuple(signal.shape)} on {signal.device})")
        if layout.num_local_experts != e or layout.capacity != c:
            raise ValueError(f"the SBO layout is for E={layout.num_local_experts}, "
                             f"C={layout.capacity}; the GEMM has E={e}, C={c}")
    elif signal is not None or layout is not None:
        raise ValueError("signal and layout go together")
    if num_sms < 1:
        raise ValueError(f"num_sms must be >= 1 (got {num_sms})")
    config.check_launch(n, num_sms)
    a_scale = mn_major_scales(a_scale)
    func = load(config, layout, num_groups=e, n=n, k=k, num_sms=num_sms, device=a.device)
    device = device_index(a.device)
    with torch.cuda.device(device):
        drv = driver()
        aligned = a_scale.stride(-1)
        maps = (
            tensor_map(drv, a.data_ptr(), UINT8, 1, k, c * e, k, BLOCK_K, config.block_m, 128),
            tensor_map(drv, b.data_ptr(), UINT8, 1, k, n * e, k, BLOCK_K, config.block_n, 128),
            tensor_map(drv, out.data_ptr(), BFLOAT16, 2, n, c * e, n, config.block_n,
                        config.block_m, swizzle_mode(config.block_n)),
            tensor_map(drv, a_scale.data_ptr(), FLOAT32, 4, aligned, (k // BLOCK_K) * e,
                        aligned, config.block_m, 1, 0),
        )
        scalars = [ctypes.c_void_p(b_scale.data_ptr()), ctypes.c_void_p(masked_m.data_ptr()),
                   ctypes.c_void_p(signal.data_ptr() if signal is not None else 0),
                   ctypes.c_uint32(c), ctypes.c_uint32(n), ctypes.c_uint32(k)]
        params = (ctypes.c_void_p * (len(scalars) + len(maps)))(
            *[ctypes.addressof(v) for v in scalars], *[m.address for m in maps])
        drv.launch(func, num_sms, config.threads, config.smem(k, layout is not None),
                   torch.cuda.current_stream(device).cuda_stream, config.multicast, params)
