"""Test-only stand-in for sgl-deep-gemm 0.2.3.post2 on the CPU: the grouped masked GEMMs that
SGLang's `deep_gemm_wrapper` and the MoE runners call (masked and contiguous), with the wheel's signatures verbatim
(tests/fixtures/deep_gemm_trees/sgl-deep-gemm-0.2.3.post2). Like the wheel, they accept no
`enable_overlap` / `signal` arguments (a call passing them fails with TypeError, as it would on
a GPU with this release).

Legend: G groups (local experts), M rows per group (capacity), N output columns, K reduction.

m_grouped_fp8_fp4_gemm_nt_masked((a [G, M, K] float8_e4m3fn, sfa [G, M, K/128] float32),
                                 (b [G, N, K] float8_e4m3fn, sfb [G, N/128, K/128] float32),
                                 d [G, M, N], masked_m [G] int32, expected_m)
    d[g, :masked_m[g]] = (a[g] * sfa[g]) @ (b[g] * sfb[g])^T for the first masked_m[g] rows
    (1 x 128 scales on a, 128 x 128 blocks on b, DeepGEMM's default recipe); rows past
    masked_m[g] are left as they were. The CPU computes exactly the dequantized products
    (every fp8 value and fp32 scale is exact in float32), summed in float32 in torch's order:
    equal to the GPU kernel's result up to the order of its float32 accumulation. Scales
    packed as UE8M0 int32 (Blackwell) are refused.
m_grouped_bf16_gemm_nt_masked(a [G, M, K], b [G, N, K], d [G, M, N], masked_m, expected_m)
    the same without scales, in float32 (float64 for float64 inputs), cast to d's dtype.
m_grouped_bf16_gemm_nt_contiguous(a [T, K], b [G, N, K], d [T, N], grouped_layout [T] int32)
    d[t] = a[t] @ b[g]^T with g = grouped_layout[t], in float32 (float64 for float64 inputs),
    cast to d's dtype; rows whose group is -1 (padding) are left as they were.
m_grouped_fp8_fp4_gemm_nt_contiguous((a [T, K] fp8, sfa [T, K/128]), (b [G, N, K] fp8,
                                     sfb [G, N/128, K/128]), d [T, N], grouped_layout [T] int32)
    d[t] = (a[t] * sfa[t]) @ (b[g] * sfb[g])^T with g = grouped_layout[t]; rows whose group is
    -1 (padding) are left as they were. get_mk_alignment_for_contiguous_layout() = 128: each
    group's rows start at a multiple of it (DeepGEMM's M block on SM90).
"""

from typing import Any

import torch

__version__ = '0.2.3.post2'
_GROUP = 128


def _parse_tensor_or_tuple(x: Any) -> Any:
    return x if isinstance(x, tuple) else (x, None)


def _dequant(x: torch.Tensor, sf: torch.Tensor, block_rows: int) -> torch.Tensor:
    """x [G, R, K] fp8 with sf [G, R / block_rows, K / 128] float32 -> float32 [G, R, K]."""
    if sf.dtype != torch.float32:
        raise NotImplementedError(f"deep_gemm stand-in: {sf.dtype} scales (UE8M0 packing)")
    g, r, k = x.shape
    scale = sf.repeat_interleave(block_rows, dim=1)[:, :r].repeat_interleave(_GROUP, dim=2)
    return x.float() * scale[:, :, :k]


def _masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor) -> None:
    for g, m in enumerate(masked_m.tolist()):
        if m:
            d[g, :m] = (a[g, :m] @ b[g].transpose(0, 1)).to(d.dtype)


def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None, compiled_dims='nk', disable_ue8m0_cast=False):
    (a, a_sf), (b, b_sf) = _parse_tensor_or_tuple(a), _parse_tensor_or_tuple(b)
    if a_sf is None or b_sf is None:
        raise ValueError("deep_gemm stand-in: fp8 operands need their scale factors")
    _masked(_dequant(a, a_sf, 1), _dequant(b, b_sf, _GROUP), d, masked_m)


m_grouped_fp4_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
m_grouped_fp8_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_fp4_gemm_nt_masked


def m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None, recipe_b=None, compiled_dims='nk', disable_ue8m0_cast=False, use_psum_layout=False, ensure_zero_padding=True, expected_m_for_psum_layout=None):
    (a, a_sf), (b, b_sf) = _parse_tensor_or_tuple(a), _parse_tensor_or_tuple(b)
    if a_sf is None or b_sf is None:
        raise ValueError("deep_gemm stand-in: fp8 operands need their scale factors")
    if use_psum_layout:
        raise NotImplementedError("deep_gemm stand-in: the psum layout (SM100)")
    a_deq = _dequant(a[None], a_sf[None], 1)[0]
    b_deq = _dequant(b, b_sf, _GROUP)
    for g in grouped_layout.unique().tolist():
        if g >= 0:
            rows = (grouped_layout == g).nonzero().squeeze(1)
            d[rows] = (a_deq[rows] @ b_deq[g].transpose(0, 1)).to(d.dtype)


m_grouped_fp4_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous
m_grouped_fp8_gemm_nt_contiguous = m_grouped_fp8_fp4_gemm_nt_contiguous


def get_mk_alignment_for_contiguous_layout() -> int:
    return 128


def m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, compiled_dims='nk', use_psum_layout=False, ensure_zero_padding=True, expected_m_for_psum_layout=None):
    if use_psum_layout:
        raise NotImplementedError("deep_gemm stand-in: the psum layout (SM100)")
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    for g in grouped_layout.unique().tolist():
        if g >= 0:
            rows = (grouped_layout == g).nonzero().squeeze(1)
            d[rows] = (a[rows].to(acc) @ b[g].to(acc).transpose(0, 1)).to(d.dtype)


def m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m, compiled_dims='nk'):
    acc = torch.float64 if a.dtype == torch.float64 else torch.float32
    _masked(a.to(acc), b.to(acc), d, masked_m)


bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked

_num_sms = 132


def set_num_sms(num_sms: int) -> None:
    global _num_sms
    _num_sms = num_sms


def get_num_sms() -> int:
    return _num_sms
