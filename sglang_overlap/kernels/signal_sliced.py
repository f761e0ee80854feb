"""SignalPlan.path "sliced": unmodified DeepGEMM launched on slices of experts, each slice followed
on the same stream by a release store of its units' final signal values.

Legend: E local experts, M capacity rows per expert, K reduction dim, N output dim (hidden).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch

from sglang_overlap.kernels.deepgemm import masked_gemm

if TYPE_CHECKING:
    from sglang_overlap.planning.sbo_layout import SboLayout

_KERNELS: dict[str, Any] = {}


def _store_signal_kernel() -> Any:
    if not _KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def store_signal_kernel(sig_ptr, lo, hi, value, BLOCK: tl.constexpr):
            offs = lo + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.atomic_xchg(sig_ptr + offs, value, mask=offs < hi, sem="release", scope="gpu")

        _KERNELS["store_signal"] = store_signal_kernel
    return _KERNELS["store_signal"]


def plan_expert_slices(num_local_experts: int, slice_experts: int) -> tuple[tuple[int, int], ...]:
    """Expert ranges [start, end) for the sliced path, in launch (= signal) order."""
    if num_local_experts < 1:
        raise ValueError(f"num_local_experts must be >= 1 (got {num_local_experts})")
    if not 1 <= slice_experts <= num_local_experts:
        raise ValueError(f"slice_experts must be in [1, num_local_experts={num_local_experts}] "
                         f"(got {slice_experts})")
    return tuple((s, min(s + slice_experts, num_local_experts))
                 for s in range(0, num_local_experts, slice_experts))


def slice_signal_range(layout: SboLayout, start: int, end: int) -> tuple[int, int]:
    """Signal indices [lo, hi) that cover experts [start, end) in `layout`'s form."""
    if layout.granularity == "expert":
        return start, end
    last = layout.signal_index(end - 1, layout.blocks_per_expert - 1)
    return layout.signal_index(start, 0), last + 1


def sliced_masked_gemm_signal(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor,
                              b_scale: torch.Tensor, out: torch.Tensor, masked_m: torch.Tensor,
                              expected_m: int, *, signal: torch.Tensor, layout: SboLayout,
                              slice_experts: int, streams: int = 1) -> None:
    """The signal form on unmodified DeepGEMM: one masked launch per slice of experts, each
    followed on the same stream by a release store of the slice's final counter values.

    Arguments:
        a, a_scale, b, b_scale, out, masked_m, expected_m: as `deepgemm.masked_gemm`:
            a `[E, M, K]` float8_e4m3fn, a_scale `[E, M, K / 128]` float32, b `[E, N, K]`
            float8_e4m3fn, b_scale `[E, ceil(N / 128), K / 128]` float32, out `[E, M, N]`
            bfloat16 (written in place; rows past masked_m[e] unspecified), masked_m `[E]`
            int32, expected_m a host-int hint; M a multiple of 64.
        signal: the zeroed buffer of `signals.new_signal(layout)`; after each slice its
            experts' counters are set to `layout.expect_value` (any granularity: whole
            experts are marked at once).
        layout: the `SboLayout` of `signal` (its E and M as above).
        slice_experts: experts per DeepGEMM launch (1 to E).
        streams: 1, or 2 to alternate slices between the current stream and a side stream
            (joined before returning), so a slice's CTAs fill the SMs that the previous
            slice's tail leaves idle.
    """
    if streams not in (1, 2):
        raise ValueError(f"streams must be 1 or 2 (got {streams})")
    main = side = None
    if streams == 2:
        main, side = torch.cuda.current_stream(), _side_stream(a.device)
        side.wait_stream(main)
    for i, (start, end) in enumerate(plan_expert_slices(a.shape[0], slice_experts)):
        on_side = side is not None and i % 2 == 1
        with torch.cuda.stream(side) if on_side else contextlib.nullcontext():
            masked_gemm(a[start:end], a_scale[start:end], b[start:end], b_scale[start:end],
                        out[start:end], masked_m[start:end], expected_m)
            write_slice_signal(signal, layout, start, end)
    if side is not None and main is not None:
        main.wait_stream(side)


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def _side_stream(device: torch.device) -> torch.cuda.Stream:
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def write_slice_signal(signal: torch.Tensor, layout: SboLayout, start: int, end: int) -> None:
    """Mark experts [start, end) final: store `layout.expect_value` into their counters (release).

    Issued on the GEMM's stream right after the slice's GEMM, so stream order makes the slice's
    output visible before the store. A signal off CUDA lives on a device that runs each
    operation as the host issues it (the CPU), where a plain store after the GEMM is that order.
    """
    lo, hi = slice_signal_range(layout, start, end)
    if signal.device.type != "cuda":
        signal.view(torch.int32)[lo:hi] = layout.expect_value
        return
    block = 128
    grid = (-(-(hi - lo) // block),)
    _store_signal_kernel()[grid](signal.view(torch.int32), lo, hi, layout.expect_value,
                                     BLOCK=block, num_warps=1)
