"""Tests for kernels/fp8.py on CPU: DeepGEMM's (1, 128, 128) fp8 recipe in torch.

Contracts: one fp32 scale per token per 128 channels (activations) or per 128 x 128 block
(weights), scale = group amax / 448 (floored at 1e-4 / 448), so each group's largest magnitude
maps to e4m3's 448 and the oracle's fp64 inverse (`tests/oracle/fp8.py`) recovers the input to
e4m3's precision; scales in the MN-major TMA-aligned layout DeepGEMM reads.
"""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.kernels import fp8
from tests.oracle.fp8 import dequant_per_block, dequant_per_token_group

E4M3_REL = 2.0 ** -4  # e4m3 keeps 3 mantissa bits: rounding error <= half an ulp = 2^-4 of 2^e
SUBNORMAL_HALF_STEP = 2.0 ** -10  # below 2^-6 the step is 2^-9 (in units of the scale)


def test_recipe_constants() -> None:
    assert fp8.FP8 is torch.float8_e4m3fn and fp8.GROUP == 128
    assert fp8.FP8_MAX == torch.finfo(torch.float8_e4m3fn).max == 448.0


@pytest.mark.parametrize(("rows", "aligned"), [(0, 0), (1, 4), (4, 4), (5, 8), (127, 128)])
def test_tma_aligned_rows_pads_to_four_floats(rows: int, aligned: int) -> None:
    assert fp8.tma_aligned_rows(rows) == aligned


def test_mn_major_scales_have_contiguous_rows() -> None:
    s = fp8.empty_mn_major_scales((3,), 5, 2, "cpu")
    assert s.shape == (3, 5, 2) and s.dtype == torch.float32
    assert s.stride() == (2 * 8, 1, 8)  # rows contiguous, each group column 8 (= 5 aligned) apart
    flat = fp8.empty_mn_major_scales((), 6, 3, "cpu")
    assert flat.shape == (6, 3) and flat.stride() == (1, 8)


def test_per_token_group_quant_scales_each_group_to_its_amax() -> None:
    torch.manual_seed(0)
    x = torch.randn(3, 5, 256, dtype=torch.bfloat16) * 10
    x[0, 0, :128] = 0  # an all-zero group: the scale floor, zeros out
    q, scale = fp8.quant_per_token_group(x)
    assert q.shape == x.shape and q.dtype == fp8.FP8
    assert scale.shape == (3, 5, 2) and scale.dtype == torch.float32
    amax = x.float().unflatten(-1, (2, 128)).abs().amax(-1)
    assert torch.equal(scale, amax.clamp(min=1e-4) / 448.0)
    assert scale[0, 0, 0] == pytest.approx(1e-4 / 448.0)
    assert torch.all(q[0, 0, :128].float() == 0)
    # each nonzero group's largest magnitude lands on 448
    qa = q.float().unflatten(-1, (2, 128)).abs().amax(-1)
    assert torch.all(qa[amax > 0] == 448.0)
    back = dequant_per_token_group(q, scale)
    err = (back - x.double()).abs()
    step = scale.double().repeat_interleave(128, -1)
    assert torch.all(err <= E4M3_REL * x.double().abs() + SUBNORMAL_HALF_STEP * step + 1e-12)


def test_per_token_group_quant_names_a_bad_k() -> None:
    with pytest.raises(ValueError, match=r"K % 128 == 0 \(got K=100\)"):
        fp8.quant_per_token_group(torch.ones(2, 100))


def test_per_block_quant_scales_each_128_square() -> None:
    torch.manual_seed(1)
    w = torch.randn(2, 200, 256) * 3  # N = 200 pads to 256: two row blocks, the second partial
    w[1, 128:, 128:] = 0
    q, scale = fp8.quant_per_block(w)
    assert q.shape == (2, 200, 256) and q.dtype == fp8.FP8 and q.is_contiguous()
    assert scale.shape == (2, 2, 2) and scale.dtype == torch.float32
    for e in range(2):
        for i in range(2):
            for j in range(2):
                block = w[e, i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                want = block.abs().amax().clamp(min=1e-4) / 448.0
                assert scale[e, i, j] == want
    assert scale[1, 1, 1] == pytest.approx(1e-4 / 448.0)
    back = dequant_per_block(q, scale)
    step = scale.double().repeat_interleave(128, 1)[:, :200].repeat_interleave(128, 2)
    bound = E4M3_REL * w.double().abs() + SUBNORMAL_HALF_STEP * step + 1e-12
    assert torch.all((back - w.double()).abs() <= bound)
    with pytest.raises(ValueError, match=r"K % 128 == 0 \(got K=64\)"):
        fp8.quant_per_block(torch.ones(1, 128, 64))


def test_silu_and_mul_quant_refuses_bad_shapes_before_launching() -> None:
    pytest.importorskip("triton")  # the kernel is built (not launched) before the checks
    with pytest.raises(ValueError, match=r"I % 128 == 0.*I=96"):
        fp8.silu_and_mul_quant(torch.zeros(4, 192, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"contiguous last dim"):
        fp8.silu_and_mul_quant(torch.zeros(512, 4, dtype=torch.bfloat16).t())
    with pytest.raises(ValueError, match=r"masked_m needs x of shape \[E, M, 2I\]"):
        fp8.silu_and_mul_quant(torch.zeros(4, 256, dtype=torch.bfloat16),
                               torch.ones(1, dtype=torch.int32))
