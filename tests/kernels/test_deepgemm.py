"""CPU side of the DeepGEMM backend and the SBO signal GEMM: API detection, signal expectations,
fp8 quantisation helpers. No GPU needed."""

from __future__ import annotations

import subprocess
import sys
import types

import pytest
import torch

from benchmarks.kernels.combine_consumer import combine_reference
from sglang_overlap.kernels import fp8
from sglang_overlap.kernels.deepgemm import detect_api
from sglang_overlap.kernels.signal_fused import SignalGemmConfig, default_config
from sglang_overlap.kernels.signals import new_signal
from sglang_overlap.planning.sbo_layout import plan_sbo_layout
from tests.oracle import fp8 as oracle_fp8


def _layout(granularity: str, e: int = 8, cap: int = 256, bm: int = 64, bn: int = 128,
            hidden: int = 7168):
    return plan_sbo_layout(num_local_experts=e, capacity=cap, block_m=bm, block_n=bn,
                           hidden=hidden, num_sms=132, comm_num_sms=3,
                           granularity=granularity)  # type: ignore[arg-type]


def test_signal_expectations_for_dsv3_down_projection() -> None:
    # K = 2048, N = 7168, block 64 x 128: 56 n-tiles; capacity 256 -> 4 row blocks
    block = _layout("block")
    expert = _layout("expert")
    assert (block.n_tiles, block.blocks_per_expert) == (56, 4)
    assert block.expect_value == 56 and block.signal_shape == (32,)
    assert expert.expect_value == 4 * 56 and expert.signal_shape == (8,)
    assert new_signal(expert, "cpu").dtype == torch.uint32
    assert new_signal(block, "cpu").dtype == torch.int32
    assert int(new_signal(block, "cpu").abs().sum()) == 0


def test_default_config_tiles_are_what_the_kernel_accepts() -> None:
    for m in (1, 16, 64, 65, 256, 4096):
        cfg = default_config(m)
        assert isinstance(cfg, SignalGemmConfig)
        assert 128 % cfg.block_n == 0 or cfg.block_n % 128 == 0, cfg
        assert cfg.block_m in (64, 128), cfg


def _fn(*names: str):
    ns: dict = {}
    exec(f"def f({', '.join(names)}): pass", ns)  # a function with exactly this signature
    return ns["f"]


def test_detect_api_on_the_installed_deep_gemm() -> None:
    deep_gemm = pytest.importorskip("deep_gemm")
    dg = detect_api(deep_gemm)
    assert dg.flavour == "grouped" and dg.version == deep_gemm.__version__
    assert dg.native_signal is False  # no released wheel has enable_overlap / signal
    assert dg.mk_alignment == 128


def test_detect_api_legacy_and_native_signal_and_missing() -> None:
    legacy = types.SimpleNamespace(
        __version__="1.0.0",
        m_grouped_gemm_fp8_fp8_bf16_nt_masked=_fn("lhs", "rhs", "out", "masked_m", "expected_m"),
        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous=_fn("lhs", "rhs", "out", "m_indices"),
        get_m_alignment_for_contiguous_layout=lambda: 128)
    assert detect_api(legacy).flavour == "legacy"
    fork = types.SimpleNamespace(
        __version__="fork",
        m_grouped_fp8_gemm_nt_masked=_fn("a", "b", "d", "masked_m", "expected_m",
                                         "enable_overlap", "signal"),
        m_grouped_fp8_gemm_nt_contiguous=_fn("a", "b", "d", "grouped_layout"),
        get_mk_alignment_for_contiguous_layout=lambda: 128)
    assert detect_api(fork).native_signal is True
    with pytest.raises(RuntimeError, match=r"deep_gemm 9\.9 .*install sgl-deep-gemm"):
        detect_api(types.SimpleNamespace(__version__="9.9"))


def test_quant_roundtrip_is_within_fp8_precision() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn((3, 5, 256), generator=gen)
    q, s = fp8.quant_per_token_group(x)
    assert q.dtype == fp8.FP8 and s.shape == (3, 5, 2)
    back = oracle_fp8.dequant_per_token_group(q, s, torch.float32)
    assert float(((back - x).abs() / x.abs().clamp(min=1e-2)).median()) < 0.07
    w = torch.randn((2, 200, 384), generator=gen)
    qw, sw = fp8.quant_per_block(w)
    assert sw.shape == (2, 2, 3) and qw.shape == w.shape
    torch.testing.assert_close(oracle_fp8.dequant_per_block(qw, sw, torch.float32), w,
                               rtol=0.07, atol=0.02)
    with pytest.raises(ValueError, match="K=100"):
        fp8.quant_per_token_group(torch.zeros(2, 100))


def test_mn_major_scales_layout() -> None:
    s = fp8.empty_mn_major_scales((4,), 37, 16, "cpu")
    assert s.shape == (4, 37, 16) and s.stride() == (40 * 16, 1, 40)


def test_combine_reference_by_hand() -> None:
    down = torch.arange(2 * 3 * 2, dtype=torch.float32).view(2, 3, 2)  # [E=2, M=3, H=2]
    masked = torch.tensor([2, 1], dtype=torch.int32)
    src = torch.tensor([[0, 1, 0], [1, 0, 0]], dtype=torch.int32)
    weight = torch.tensor([[1.0, 2.0, 9.0], [0.5, 9.0, 9.0]])
    out = combine_reference(down, masked, src, weight, num_tokens=2)
    # token 0 <- e0 r0 (x1); token 1 <- e0 r1 (x2) + e1 r0 (x0.5)
    assert out.tolist() == [[0.0, 1.0], [2 * 2 + 0.5 * 6, 2 * 3 + 0.5 * 7]]


def test_engine_backends_import_without_triton_or_deep_gemm() -> None:
    code = ("import sys; import benchmarks.harness.deepgemm_experts,"
            " sglang_overlap.kernels.signal_fused, sglang_overlap.kernels.signal_sliced,"
            " sglang_overlap.kernels.signal_deepgemm, sglang_overlap.kernels.down_gemm,"
            " benchmarks.kernels.combine_consumer, sglang_overlap.kernels.fp8;"
            " bad = [m for m in ('triton', 'deep_gemm') if m in sys.modules]; print(bad);"
            " sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
