"""Tests for planning/profiles.py and the pure parts of benchmarks/calibrate.py."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sglang_overlap.planning.cost.profiles import (
    GPU_NAMES,
    MODEL_NAMES,
    Deployment,
    HardwareProfile,
    ProfileError,
    gpu_name_from_device,
    load_hardware,
    load_model,
    profile_to_dict,
    resolve_hardware,
)
from sglang_overlap.planning.cost.stage_costs import grouped_gemm_us

ROOT = Path(__file__).resolve().parents[2]


def _calibrate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "benchmarks/calibrate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["calibrate"] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", GPU_NAMES)
def test_shipped_gpu_profiles_load(name: str) -> None:
    hw = load_hardware(name)
    assert hw.name == name and hw.num_sms > 0 and 0 < hw.gemm_efficiency <= 1
    assert 0 < hw.sbo_comm_sms < hw.num_sms and hw.source
    assert load_hardware(name.lower()) == hw


def test_datasheet_rates() -> None:
    h20, h200, b200 = load_hardware("H20"), load_hardware("H200"), load_hardware("B200")
    assert (h20.num_sms, h20.fp8_tflops, h20.hbm_gbps) == (78, 296.0, 4000.0)
    assert (h200.num_sms, h200.fp8_tflops, h200.hbm_gbps) == (132, 1979.0, 4800.0)
    assert (b200.arch, b200.sbo_comm_sms) == ("blackwell", 32)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_shipped_model_profiles_load(name: str) -> None:
    m = load_model(name)
    assert m.name == name and m.num_moe_layers > 0 and m.topk <= m.num_experts


def test_model_aliases() -> None:
    assert load_model("DeepSeek-R1") == load_model("deepseek-v3")
    dsv3 = load_model("deepseek-v3")
    assert (dsv3.hidden, dsv3.num_experts, dsv3.topk, dsv3.num_moe_layers) == (7168, 256, 8, 58)


def test_partial_override_of_a_named_base(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"base": "H20", "rdma_gbps": 25, "source": "ours"}))
    hw = load_hardware(str(path))
    assert hw == dataclasses.replace(load_hardware("H20"), rdma_gbps=25.0, source="ours")


def test_full_profile_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(profile_to_dict(load_hardware("H200"))))
    assert load_hardware(str(path)) == load_hardware("H200")


@pytest.mark.parametrize(("content", "message"), [
    ({"base": "H20", "rdma_gbs": 25}, "unknown keys \\['rdma_gbs'\\]"),
    ({"name": "x"}, "missing keys"),
    ({"base": "H20", "num_sms": 7.5}, "num_sms must be an integer"),
    ({"base": "H21"}, "unknown hardware profile 'H21'; choose one of H20, H800"),
])
def test_bad_profile_files_name_the_problem(tmp_path: Path, content: object,
                                            message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(content))
    with pytest.raises(ProfileError, match=message):
        load_hardware(str(path))


def test_bad_names_and_paths() -> None:
    with pytest.raises(ProfileError, match="unknown hardware profile 'A100'"):
        load_hardware("A100")
    with pytest.raises(ProfileError, match="does not exist"):
        load_hardware("/nonexistent/profile.json")
    with pytest.raises(ProfileError, match="--ep 0"):
        Deployment(ep_size=0)


@pytest.mark.parametrize(("device", "name"), [
    ("NVIDIA H200", "H200"), ("NVIDIA H20", "H20"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA H800", "H800"), ("NVIDIA B200", "B200")])
def test_gpu_name_from_device(device: str, name: str) -> None:
    assert gpu_name_from_device(device) == name


def test_resolve_hardware_flag_values() -> None:
    assert resolve_hardware("auto", "NVIDIA H200") == load_hardware("H200")
    assert resolve_hardware("H20") == load_hardware("H20")
    with pytest.raises(ProfileError, match="auto needs the CUDA device name"):
        resolve_hardware("auto")


def test_gpu_name_from_unknown_device() -> None:
    with pytest.raises(ProfileError, match="--overlap-hardware-profile"):
        gpu_name_from_device("NVIDIA A100-SXM4-80GB")


def test_fit_recovers_known_parameters() -> None:
    cal = _calibrate()
    truth = dataclasses.replace(load_hardware("H200"), gemm_efficiency=0.7, hbm_efficiency=0.6,
                                gemm_fixed_us=5.0)
    samples = [cal.GemmSample(e, m, 7168, 2048, grouped_gemm_us(truth, e, m, 7168, 2048))
               for e in (8, 32) for m in (32, 64, 128, 256, 512)]
    fit = cal.fit_gemm(samples, load_hardware("H200"), step=0.01)
    assert fit == {"gemm_efficiency": pytest.approx(0.7, abs=0.011),
                   "hbm_efficiency": pytest.approx(0.6, abs=0.011),
                   "gemm_fixed_us": pytest.approx(5.0, abs=1.0)}, fit


def test_shipped_h200_profile_reproduces_the_measured_gemms() -> None:
    cal = _calibrate()
    hw = load_hardware("H200")
    for s in cal.H200_DOWN_PROJ_SAMPLES:
        model = grouped_gemm_us(hw, s.num_groups, s.m, s.n, s.k)
        assert abs(model / s.us - 1) < 0.10, f"{s=} {model=}"


def test_fit_a2a_and_write_profile(tmp_path: Path) -> None:
    cal = _calibrate()
    base = load_hardware("H200")
    points = [(float(n), 12.0 + n / (0.5 * base.nvlink_gbps * 1e3)) for n in (1e5, 1e6, 1e7)]
    fit = cal.fit_a2a(points, base, inter_node=False)
    assert fit == {"a2a_latency_us": pytest.approx(12.0), "nvlink_efficiency": pytest.approx(0.5)}
    out = tmp_path / "measured.json"
    cal.write_profile(out, "H200", fit, "test")
    hw: HardwareProfile = load_hardware(str(out))
    assert (hw.a2a_latency_us, hw.nvlink_efficiency, hw.num_sms) == (12.0, 0.5, 132)


def test_calibrate_without_cuda_says_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert _calibrate().main(["--out", str(tmp_path / "x.json")]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
