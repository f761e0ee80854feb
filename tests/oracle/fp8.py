"""The oracle's fp8 inverses: DeepGEMM's (1, 128, 128) recipe dequantised in float64, and the
float32 SiLU-and-mul the fused kernel is checked against (`kernels/fp8.py` holds the quantisers).

Legend: E experts, N output dim, K reduction dim, I intermediate size.
"""

from __future__ import annotations

import torch

from sglang_overlap.kernels.fp8 import GROUP


def dequant_per_token_group(q: torch.Tensor, scale: torch.Tensor,
                            dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Inverse of `quant_per_token_group` in `dtype` (the fp64 reference uses this)."""
    g = q.to(dtype).unflatten(-1, (q.shape[-1] // GROUP, GROUP))
    return (g * scale.to(dtype).unsqueeze(-1)).flatten(-2)


def dequant_per_block(q: torch.Tensor, scale: torch.Tensor,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Inverse of `quant_per_block` in `dtype`."""
    s = scale.to(dtype).repeat_interleave(GROUP, dim=1)[:, : q.shape[1]]
    return q.to(dtype) * s.repeat_interleave(GROUP, dim=2)


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """`[..., 2I]` -> `[..., I]` float32: silu(gate) * up, as the fused kernel computes it."""
    gate, up = x.float().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up
