"""Capability probing: the installed wheels' Python files, and fake package trees written here
(real files read by the real probe) for the forms no released wheel has."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

from sglang_overlap.kernels.capabilities import (
    ASSUME_ARCH_ENV,
    combine_forms,
    detect_gpu,
    gemm_takes_signal,
    probe,
)
from sglang_overlap.kernels.package_source import package_dir, read_params
from sglang_overlap.planning.sbo_path import Capabilities, SboPath, SboRequest, decide_sbo_path

COMBINE_SRC = {
    "per_block": "overlap=False, packed_recv_count=None, comp_signal=None, block_m=64, "
                 "threshold=0, num_sms=3",
    "per_expert": "overlap=False, src_signals=None, src_signal_expect_value=0",
    "none": "combine_wait_recv_cost_stats=None",
    "kwargs": "**kwargs",
}
GEMM_SRC = {
    # 0.2.x style: defined inside try, exported through an alias assignment
    "signal": "try:\n    def m_grouped_fp8_fp4_gemm_nt_masked(a, b, d, masked_m, expected_m, "
              "recipe=None, max_block_n=256, enable_overlap=False, signal=None):\n"
              "        return None\n    fp8_m_grouped_gemm_nt_masked = "
              "m_grouped_fp8_fp4_gemm_nt_masked\nexcept AttributeError:\n    pass\n",
    # 0.1.x style: re-exported from a submodule
    "plain": "from .jit_kernels import (\n    m_grouped_gemm_fp8_fp8_bf16_nt_masked,\n)\n",
}


def _write_deep_ep(root: Path, form: str, version: str = "9.9.9") -> None:
    pkg = root / "deep_ep"
    (pkg / "buffers").mkdir(parents=True)
    (pkg / "__init__.py").write_text("import deep_ep._C  # would fail here\n"
                                     "from .buffers.legacy import Buffer\n")
    (pkg / "buffers" / "__init__.py").write_text("")
    (pkg / "buffers" / "legacy.py").write_text(
        "class Buffer:\n    def low_latency_combine(self, x, topk_idx, topk_weights, handle, "
        f"async_finish=False, return_recv_hook=False, {COMBINE_SRC[form]}):\n        pass\n")
    dist = root / f"sgl_deep_ep-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sgl-deep-ep\nVersion: {version}\n")


def _write_deep_gemm(root: Path, kind: str) -> None:
    pkg = root / "deep_gemm"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(GEMM_SRC[kind])
    (pkg / "VERSION").write_text("0.0.1\n")
    (pkg / "jit_kernels").mkdir()
    (pkg / "jit_kernels" / "__init__.py").write_text(
        "from .m_grouped_gemm import m_grouped_gemm_fp8_fp8_bf16_nt_masked\n")
    (pkg / "jit_kernels" / "m_grouped_gemm.py").write_text(
        "def m_grouped_gemm_fp8_fp8_bf16_nt_masked(lhs, rhs, out, masked_m, expected_m):\n"
        "    pass\n")


@pytest.mark.skipif(package_dir("deep_ep") is None, reason="sgl-deep-ep not installed")
def test_installed_wheels() -> None:
    report = probe(assume_arch="sm90")
    assert report.deep_ep.version == "0.1.2.post1", report.deep_ep
    assert combine_forms(report.deep_ep.params) == ("per_expert",)
    assert report.deep_gemm.version == "0.2.3.post2"
    assert report.deep_gemm.function == "fp8_m_grouped_gemm_nt_masked"
    assert not gemm_takes_signal(report.deep_gemm.params)
    assert "deep_ep._C" not in sys.modules  # nothing loaded the CUDA extension
    caps = report.capabilities
    assert caps.plugin_signal_gemm == report.triton
    want = SboPath.PER_EXPERT if report.triton else SboPath.SHARED_EXPERT_ONLY
    assert decide_sbo_path(caps, SboRequest()).path is want


@pytest.mark.parametrize("form", ["per_block", "per_expert", "none", "absent"])
def test_every_combination(tmp_path: Path, form: str) -> None:
    for gemm, arch, triton in itertools.product(["signal", "plain", "absent"],
                                                ["sm90", "sm100", "cpu"], [True, False]):
        root = tmp_path / f"{gemm}-{arch}-{triton}"
        root.mkdir()
        if form != "absent":
            _write_deep_ep(root, form)
        if gemm != "absent":
            _write_deep_gemm(root, gemm)
        if triton:
            (root / "triton").mkdir()
            (root / "triton" / "__init__.py").write_text("")
        report = probe(search_path=[str(root)], assume_arch=arch)
        want = Capabilities(
            arch=arch,  # type: ignore[arg-type]
            deep_ep_version=None if form == "absent" else "9.9.9",
            deep_ep_combine_forms=(form,) if form in ("per_block", "per_expert") else (),
            deep_gemm_version=None if gemm == "absent" else "0.0.1",
            deep_gemm_signal=gemm == "signal", plugin_signal_gemm=triton)
        assert report.capabilities == want, f"{form=} {gemm=} {arch=} {triton=} {report=}"
        if gemm == "plain":
            assert report.deep_gemm.function == "m_grouped_gemm_fp8_fp8_bf16_nt_masked"
        decision = decide_sbo_path(report.capabilities, SboRequest())
        if arch == "sm90" and form == "per_block" and (gemm == "signal" or triton):
            assert decision.path is SboPath.FINE_GRAINED, f"{gemm=} {triton=}"
        elif arch == "sm90" and form == "per_expert" and triton:
            assert decision.path is SboPath.PER_EXPERT
        elif arch == "sm90" and form != "absent":
            assert decision.path is SboPath.SHARED_EXPERT_ONLY, f"{form=} {gemm=} {triton=}"
        elif arch == "sm100" and form != "absent":
            assert decision.path is SboPath.UPSTREAM_BLACKWELL
        else:
            assert decision.refusal is not None


def test_catch_all_kwargs_proves_nothing(tmp_path: Path) -> None:
    _write_deep_ep(tmp_path, "kwargs")
    params = read_params("deep_ep", "Buffer.low_latency_combine", [str(tmp_path)])
    assert params is not None and params.var_keyword
    assert combine_forms(params) == ()
    # ...yet binding the overlap arguments works, as it would at run time
    params.signature().bind(None, 1, 2, 3, 4, overlap=True, src_signals=None)


def test_missing_function_is_reported(tmp_path: Path) -> None:
    (tmp_path / "deep_gemm").mkdir()
    (tmp_path / "deep_gemm" / "__init__.py").write_text("x = 1\n")
    report = probe(search_path=[str(tmp_path)], assume_arch="sm90")
    assert report.deep_gemm.params is None and "none of" in report.deep_gemm.note
    assert report.deep_ep.version is None and report.deep_ep.note == "not installed"


def test_signature_binds_like_python(tmp_path: Path) -> None:
    _write_deep_ep(tmp_path, "per_expert")
    params = read_params("deep_ep", "Buffer.low_latency_combine", [str(tmp_path)])
    assert params is not None
    sig = params.signature()
    sig.bind(None, 1, 2, 3, 4, overlap=True, src_signals=5, src_signal_expect_value=6)
    with pytest.raises(TypeError):
        sig.bind(None, 1, 2, 3, 4, comp_signal=5)
    with pytest.raises(TypeError):
        sig.bind(None, 1, 2, 3)  # `handle` has no default


def test_detect_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    g = detect_gpu("sm90")
    assert (g.arch, g.capability, g.sm_count, g.source) == ("sm90", (9, 0), 132, "assumed")
    monkeypatch.setenv(ASSUME_ARCH_ENV, "sm100")
    assert detect_gpu().capability == (10, 0)
    monkeypatch.setenv(ASSUME_ARCH_ENV, "sm80")
    with pytest.raises(ValueError, match=f"{ASSUME_ARCH_ENV}.*sm80"):
        detect_gpu()
    monkeypatch.delenv(ASSUME_ARCH_ENV)
    import torch

    real = detect_gpu()
    assert real.source == "detected"
    assert (real.arch == "cpu") == (not torch.cuda.is_available())


def test_device_num_sms_refuses_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernels' SM count never invents a nominal count (the glue's state.num_sms does)."""
    import torch

    from sglang_overlap.kernels.capabilities import device_num_sms

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        device_num_sms()
