"""FP8 (e4m3) block quantisation as DeepGEMM's Hopper recipe wants it, plus SiLU-and-mul + quant.

Recipe (1, 128, 128): activations carry one fp32 scale per token per 128 channels of K, weights
one fp32 scale per 128 x 128 block. The quantisers are torch and run anywhere (their fp64
inverses belong to the test oracle, not the package); `silu_and_mul_quant` is a Triton kernel
(imported lazily, so this module imports without Triton).

Legend: E local experts, M rows per expert (capacity), T tokens, K reduction dim, N output dim,
I intermediate size (the up GEMM writes 2I: gate then up), G = K // 128 scale groups.
"""

from __future__ import annotations

from typing import Any

import torch

FP8_MAX = 448.0
GROUP = 128
FP8 = torch.float8_e4m3fn


def tma_aligned_rows(rows: int) -> int:
    """Row count of an fp32 MN-major scale tensor padded for TMA (16 bytes = 4 floats)."""
    return (rows + 3) // 4 * 4


def empty_mn_major_scales(lead: tuple[int, ...], rows: int, groups: int,
                          device: torch.device | str) -> torch.Tensor:
    """An fp32 `[*lead, rows, groups]` view whose rows are contiguous (MN-major, TMA-aligned).

    DeepGEMM transforms activation scales into this layout itself when they are not already in it
    (an extra kernel per call); writing them this way in the quant kernel skips that.
    """
    aligned = tma_aligned_rows(rows)
    base = torch.empty((*lead, groups, aligned), dtype=torch.float32, device=device)
    return base.transpose(-1, -2)[..., :rows, :]


def quant_per_token_group(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[..., K]` float -> (`[..., K]` fp8, `[..., K/128]` fp32): one scale per 128 channels."""
    if x.shape[-1] % GROUP:
        raise ValueError(f"per-token fp8 quantisation needs K % {GROUP} == 0 (got K={x.shape[-1]})")
    g = x.float().unflatten(-1, (x.shape[-1] // GROUP, GROUP))  # [..., G, 128]
    scale = g.abs().amax(dim=-1).clamp(min=1e-4) / FP8_MAX  # [..., G]
    q = (g / scale.unsqueeze(-1)).to(FP8).flatten(-2)
    return q, scale


def quant_per_block(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`[E, N, K]` float -> (`[E, N, K]` fp8, `[E, ceil(N/128), K/128]` fp32 block scales)."""
    e, n, k = w.shape
    if k % GROUP:
        raise ValueError(f"block fp8 quantisation needs K % {GROUP} == 0 (got K={k})")
    n_pad = (n + GROUP - 1) // GROUP * GROUP
    wp = torch.zeros((e, n_pad, k), dtype=torch.float32, device=w.device)
    wp[:, :n] = w.float()
    blocks = wp.view(e, n_pad // GROUP, GROUP, k // GROUP, GROUP)
    scale = blocks.abs().amax(dim=(2, 4)).clamp(min=1e-4) / FP8_MAX  # [E, N/128, G]
    q = (blocks / scale[:, :, None, :, None]).to(FP8).view(e, n_pad, k)[:, :n].contiguous()
    return q, scale


_KERNEL: Any = None


def _build_kernel() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def silu_mul_quant_kernel(x_ptr, q_ptr, s_ptr, masked_m_ptr, rows_per_group, inter,
                              stride_xr, stride_qr, stride_sr, stride_sg, stride_sb,
                              MASKED: tl.constexpr, GROUP_K: tl.constexpr):
        row = tl.program_id(0)  # flat row over [E * M] (masked) or [T]
        grp = tl.program_id(1)  # which 128-channel group of I
        batch = row // rows_per_group
        r = row % rows_per_group
        if MASKED:
            limit = tl.load(masked_m_ptr + batch)
        else:
            limit = rows_per_group
        cols = grp * GROUP_K + tl.arange(0, GROUP_K)
        keep = (cols * 0 + r) < limit  # rows past masked_m: no loads, no stores
        gate = tl.load(x_ptr + row * stride_xr + cols, mask=keep, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + row * stride_xr + inter + cols, mask=keep, other=0.0).to(tl.float32)
        y = gate / (1.0 + tl.exp(-gate)) * up
        scale = tl.maximum(tl.max(tl.abs(y), axis=0), 1e-4) / 448.0
        q = (y / scale).to(q_ptr.dtype.element_ty)
        tl.store(q_ptr + row * stride_qr + cols, q, mask=keep)
        tl.store(s_ptr + batch * stride_sb + r * stride_sr + grp * stride_sg, scale,
                 mask=r < limit)

    return silu_mul_quant_kernel


def silu_and_mul_quant(x: torch.Tensor, masked_m: torch.Tensor | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused SiLU-and-mul + per-token fp8 quant (Triton).

    x: `[E, M, 2I]` bf16 with `masked_m` `[E]` int32 (rows >= masked_m[e] are skipped and left
    unwritten), or `[T, 2I]` bf16 with masked_m None. Returns (`[..., I]` fp8, `[..., I/128]` fp32
    scales in DeepGEMM's MN-major TMA-aligned layout).
    """
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    inter = x.shape[-1] // 2
    if inter % GROUP or x.stride(-1) != 1:
        raise ValueError(f"silu_and_mul_quant needs I % 128 == 0 and a contiguous last dim "
                         f"(got I={inter}, stride={x.stride(-1)})")
    lead = tuple(x.shape[:-2]) if x.dim() == 3 else ()
    rows = x.shape[-2]
    q = torch.empty((*x.shape[:-1], inter), dtype=FP8, device=x.device)
    s = empty_mn_major_scales(lead, rows, inter // GROUP, x.device)
    x2 = x.reshape(-1, x.shape[-1])
    masked = masked_m is not None
    if masked and x.dim() != 3:
        raise ValueError(f"masked_m needs x of shape [E, M, 2I] (got {tuple(x.shape)})")
    stride_sb = s.stride(0) if x.dim() == 3 else 0
    grid = (x2.shape[0], inter // GROUP)
    if x2.shape[0]:
        _KERNEL[grid](x2, q, s, masked_m if masked else x2, rows, inter,
                      x2.stride(0), inter, s.stride(-2), s.stride(-1), stride_sb,
                      MASKED=masked, GROUP_K=GROUP, num_warps=1)
    return q, s
