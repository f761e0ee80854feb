"""kernels/signal_deepgemm/launch.py on the CPU: operand and layout checks (the kernel itself
runs in tests/gpu/test_deepgemm_signal.py)."""

from __future__ import annotations

import pytest
import torch

from sglang_overlap.kernels.signal_deepgemm import launch as ds
from sglang_overlap.kernels.signal_deepgemm.configs import DgSignalConfig
from sglang_overlap.planning.sbo_layout import plan_sbo_layout


def _operands(e: int = 2, cap: int = 128, n: int = 256, k: int = 256):
    a = torch.zeros((e, cap, k), dtype=torch.float8_e4m3fn)
    a_s = torch.ones((e, cap, k // 128))
    b = torch.zeros((e, n, k), dtype=torch.float8_e4m3fn)
    b_s = torch.ones((e, -(-n // 128), k // 128))
    out = torch.empty((e, cap, n), dtype=torch.bfloat16)
    return a, a_s, b, b_s, out, torch.zeros(e, dtype=torch.int32)


@pytest.mark.parametrize(("change", "match"), [
    ({"cap": 96}, "capacity 96 is not a multiple of block_m 64"),
    ({"k": 200}, "K % 128 == 0"),
])
def test_bad_shapes_are_refused(change: dict, match: str) -> None:
    args = {"e": 2, "cap": 128, "n": 256, "k": 256, **change}
    if args["k"] % 128:
        a, a_s, b, b_s, out, masked = _operands(2, 128, 256, 256)
        a = torch.zeros((2, 128, 200), dtype=torch.float8_e4m3fn)
        b = torch.zeros((2, 256, 200), dtype=torch.float8_e4m3fn)
    else:
        a, a_s, b, b_s, out, masked = _operands(**args)
    with pytest.raises(ValueError, match=match):
        ds.check_operands(a, a_s, b, b_s, out, masked, DgSignalConfig(64, 128, 4))


def test_bad_dtypes_and_scales_are_refused() -> None:
    cfg = DgSignalConfig(64, 128, 4)
    a, a_s, b, b_s, out, masked = _operands()
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        ds.check_operands(a.float(), a_s, b, b_s, out, masked, cfg)
    with pytest.raises(ValueError, match="out must be bfloat16"):
        ds.check_operands(a, a_s, b, b_s, out.float(), masked, cfg)
    with pytest.raises(ValueError, match=r"a_scale must be \[E, C, K/128\]"):
        ds.check_operands(a, a_s[:, :64], b, b_s, out, masked, cfg)
    with pytest.raises(ValueError, match="masked_m must be int32"):
        ds.check_operands(a, a_s, b, b_s, out, masked.long(), cfg)
    with pytest.raises(ValueError, match="must be on a's CUDA device"):  # all checks passed
        ds.check_operands(a, a_s, b, b_s, out, masked, cfg)


def test_activation_scales_are_laid_out_mn_major() -> None:
    from sglang_overlap.kernels import fp8

    scales = torch.randn((3, 70, 16))  # rows not a multiple of 4, K-major
    got = ds.mn_major_scales(scales)
    assert torch.equal(got, scales)
    assert got.stride() == (16 * fp8.tma_aligned_rows(70), 1, fp8.tma_aligned_rows(70))
    assert ds.mn_major_scales(got) is got


def _layout(granularity: str, block_m: int, block_n: int, cap: int = 256):
    return plan_sbo_layout(num_local_experts=8, capacity=cap, block_m=block_m, block_n=block_n,
                           hidden=7168, num_sms=132, comm_num_sms=4,
                           granularity=granularity)  # type: ignore[arg-type]


def test_layout_must_count_the_kernel_tiles() -> None:
    cfg = DgSignalConfig(128, 160, 5)
    assert ds.layout_mode(None, cfg, 7168) == ("none", 64)
    assert ds.layout_mode(_layout("block", 64, 160), cfg, 7168) == ("block", 64)
    assert ds.layout_mode(_layout("expert", 128, 160), cfg, 7168) == ("expert", 64)
    with pytest.raises(ValueError, match="counts tiles of 128 columns"):
        ds.layout_mode(_layout("block", 64, 128), cfg, 7168)
    with pytest.raises(ValueError, match="counts 64-row blocks"):
        ds.layout_mode(_layout("expert", 64, 160), cfg, 7168)
    with pytest.raises(ValueError, match="multiple of it"):
        ds.layout_mode(_layout("block", 128, 160), DgSignalConfig(64, 160, 7), 7168)
